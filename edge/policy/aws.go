package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/shared/netname"
)

// KindAWS is the kind of a key that is an AWS access key: it never travels,
// so the proxy verifies the task's SigV4 signature made with the placeholder
// secret and signs the request again with the real one.
const KindAWS = "aws"

// AssumeRole session bounds: STS's own (DurationSeconds 900 to 43200, a
// role's maximum permitting), and its default.
const (
	MinSessionDuration     = 15 * time.Minute
	MaxSessionDuration     = 12 * time.Hour
	DefaultSessionDuration = time.Hour
	// MaxSessionPolicy is STS's limit on a session policy's plain text.
	MaxSessionPolicy = 2048
)

// DefaultAWSEnvPrefix gives the variables every AWS tool reads.
const DefaultAWSEnvPrefix = "AWS_"

// AWSKey is a compiled key of kind "aws": the scopes it may sign for, the
// task's variable names, and where its real credentials come from.
type AWSKey struct {
	Regions   []string
	Services  []string
	EnvPrefix string
	// AssumeRole is nil when the secrets source holds the credentials.
	AssumeRole *AssumeRole
}

// AssumeRole is the role whose per-run sessions are a key's credentials.
type AssumeRole struct {
	RoleARN    string
	ExternalID string
	// SessionPolicy is compact JSON, "" for none.
	SessionPolicy string
	Duration      time.Duration
}

// AWSEnv names the task's variables for an AWS key.
type AWSEnv struct {
	AccessKeyID, SecretAccessKey, SessionToken string
}

// Env is the key's variable names.
func (a *AWSKey) Env() AWSEnv {
	return AWSEnv{a.EnvPrefix + "ACCESS_KEY_ID", a.EnvPrefix + "SECRET_ACCESS_KEY", a.EnvPrefix + "SESSION_TOKEN"}
}

var (
	regionPattern  = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]{1,2}$`)
	servicePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)
	// An env prefix joined to ACCESS_KEY_ID makes a variable name.
	envPrefixPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)
	roleARNPattern   = regexp.MustCompile(`^arn:aws[a-z-]*:iam::[0-9]{12}:role/[\w+=,.@/-]{1,512}$`)
	// STS's ExternalId: 2 to 1224 of these (the length is checked apart:
	// RE2 counts to 1000).
	externalIDPattern = regexp.MustCompile(`^[\w+=,.@:/-]+$`)
)

// compileAWS checks the parts of a key that its kind governs. Domains are
// explicit names, as for every key: a bucket's virtual host is listed by
// its name (or reached path-style, on the regional s3 name), because a
// wildcard would let a task sign for buckets of any account under the key.
func compileAWS(at config.Path, k *Key, kp config.KeyPolicy) config.Problems {
	var ps config.Problems
	switch kp.Kind {
	case "":
		if kp.AWS != nil {
			ps = append(ps, at.Key("aws").Problemf(`only a key of "kind": "aws" takes it`))
		}
		return ps
	case KindAWS:
	default:
		return append(ps, at.Key("kind").Problemf(`%q is not a kind; leave it out for a value sent as it is, or "aws" or "ssh"`, kp.Kind))
	}
	k.Kind = KindAWS
	if len(kp.In) > 0 {
		ps = append(ps, at.Key("in").Problemf(`an aws key is never put into a request (the proxy signs with it); leave "in" out`))
	}
	if kp.Placeholder != (config.PlaceholderShape{}) {
		ps = append(ps, at.Key("placeholder").Problemf(`an aws key's placeholders have the shapes of AWS credentials; leave "placeholder" out`))
	}
	if kp.AWS == nil {
		return append(ps, at.Key("aws").Problemf(`a key of kind "aws" needs "aws": {"regions": [...], "services": [...]}`))
	}
	a := &AWSKey{EnvPrefix: kp.AWS.EnvPrefix}
	if a.EnvPrefix == "" {
		a.EnvPrefix = DefaultAWSEnvPrefix
	}
	if !envPrefixPattern.MatchString(a.EnvPrefix) {
		ps = append(ps, at.Key("aws", "envPrefix").Problemf("%q: letters, digits and '_', not starting with a digit", a.EnvPrefix))
	}
	a.Regions, ps = compileNames(at.Key("aws", "regions"), kp.AWS.Regions, regionPattern, "a region such as us-east-1", ps)
	a.Services, ps = compileNames(at.Key("aws", "services"), kp.AWS.Services, servicePattern, "a signing name such as s3, sts or dynamodb", ps)
	if ar := kp.AWS.AssumeRole; ar != nil {
		var arps config.Problems
		a.AssumeRole, arps = compileAssumeRole(at.Key("aws", "assumeRole"), ar)
		ps = append(ps, arps...)
	}
	for i, raw := range kp.Domains {
		d, err := netname.ParseDomain(raw)
		if err != nil {
			continue // compileKey names it
		}
		if err := a.checkDomain(d); err != nil {
			ps = append(ps, at.Key("domains").Index(i).Problemf("%q: %v", raw, err))
		}
	}
	k.AWS = a
	return ps
}

func compileNames(at config.Path, names []string, pattern *regexp.Regexp, want string, ps config.Problems) ([]string, config.Problems) {
	if len(names) == 0 {
		return nil, append(ps, at.Problemf("at least one is required"))
	}
	var out []string
	for i, n := range names {
		if !pattern.MatchString(n) {
			ps = append(ps, at.Index(i).Problemf("%q is not %s", n, want))
			continue
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, ps
}

// compileAssumeRole checks the role block at at, reporting every problem.
// The external id is not quoted back: it is the role owner's shared check.
func compileAssumeRole(at config.Path, w *config.AssumeRole) (*AssumeRole, config.Problems) {
	var ps config.Problems
	ar := &AssumeRole{RoleARN: w.RoleARN, ExternalID: w.ExternalID, Duration: w.Duration.D()}
	if !roleARNPattern.MatchString(ar.RoleARN) {
		ps = append(ps, at.Key("roleArn").Problemf("%q is not a role's ARN (arn:aws:iam::<account>:role/<name>)", ar.RoleARN))
	}
	if ar.ExternalID != "" && (len(ar.ExternalID) < 2 || len(ar.ExternalID) > 1224 || !externalIDPattern.MatchString(ar.ExternalID)) {
		ps = append(ps, at.Key("externalId").Problemf("2 to 1224 letters, digits and +=,.@:/-"))
	}
	if ar.Duration == 0 {
		ar.Duration = DefaultSessionDuration
	}
	if ar.Duration < MinSessionDuration || ar.Duration > MaxSessionDuration {
		ps = append(ps, at.Key("duration").Problemf("%s is outside STS's %s to %s", ar.Duration, MinSessionDuration, MaxSessionDuration))
	}
	if len(w.SessionPolicy) > 0 {
		// Compacted as written (json.Compact keeps key order and escapes),
		// so the length checked is what STS is sent.
		var doc map[string]any
		var compact bytes.Buffer
		switch {
		case json.Unmarshal(w.SessionPolicy, &doc) != nil || len(doc) == 0 || json.Compact(&compact, w.SessionPolicy) != nil:
			ps = append(ps, at.Key("sessionPolicy").Problemf("is not a non-empty JSON object (an IAM policy document)"))
		case compact.Len() > MaxSessionPolicy:
			ps = append(ps, at.Key("sessionPolicy").Problemf("is %d characters compacted; STS takes at most %d", compact.Len(), MaxSessionPolicy))
		default:
			ar.SessionPolicy = compact.String()
		}
	}
	return ar, ps
}

// checkDomain refuses at load an AWS name the key could never sign for:
// its region or service outside the key's bounds.
func (a *AWSKey) checkDomain(d Domain) error {
	h, ok := ParseAWSHost(d.Name)
	if !ok {
		return nil
	}
	if !slices.Contains(a.Regions, h.Region) {
		return fmt.Errorf("its region %s is not in aws.regions", h.Region)
	}
	if !slices.ContainsFunc(h.Services, func(s string) bool { return slices.Contains(a.Services, s) }) {
		return fmt.Errorf("its service (%s) is not in aws.services", strings.Join(h.Services, " or "))
	}
	return nil
}

// AWSHost is the credential scope an AWS endpoint name implies.
type AWSHost struct {
	// Region is the region a request there is signed for (us-east-1 for
	// the global endpoints).
	Region string
	// Services are the signing names a request there may use: one, save
	// for names an endpoint shares.
	Services []string
}

// signingNames maps endpoint prefixes to their signing names where the two
// differ.
var signingNames = map[string][]string{
	"email":                 {"ses"},
	"bedrock-runtime":       {"bedrock"},
	"bedrock-agent":         {"bedrock"},
	"bedrock-agent-runtime": {"bedrock"},
	"s3-control":            {"s3"},
	"s3-accesspoint":        {"s3"},
	"streams.dynamodb":      {"dynamodb"},
	"runtime.sagemaker":     {"sagemaker"},
	"api.ecr":               {"ecr"},
	"monitoring":            {"monitoring"},
}

// ParseAWSHost reads the credential scope implied by an AWS endpoint name
// (under amazonaws.com): "<service>.<region>.amazonaws.com",
// "<service>.amazonaws.com" (global, us-east-1), and S3's forms, path-style
// and virtual-hosted ("<bucket>.s3.<region>.amazonaws.com",
// "s3-<region>", "s3.dualstack.<region>", "s3-external-1"). FIPS and
// dual-stack variants name the same scope. false for any other name.
func ParseAWSHost(name string) (AWSHost, bool) {
	rest, ok := strings.CutSuffix(name, ".amazonaws.com")
	if !ok || rest == "" {
		return AWSHost{}, false
	}
	labels := strings.Split(rest, ".")
	// S3 and its virtual hosts: the bucket's labels come first.
	for i := len(labels) - 1; i >= 0; i-- {
		l := strings.TrimSuffix(labels[i], "-fips")
		region := ""
		switch {
		case l == "s3" || l == "s3-control" || l == "s3-accesspoint":
		case l == "s3-external-1":
			region = "us-east-1"
		case strings.HasPrefix(l, "s3-") && regionPattern.MatchString(l[3:]):
			region = l[3:]
		case strings.HasPrefix(l, "s3-fips-") && regionPattern.MatchString(l[8:]):
			region = l[8:]
		default:
			continue
		}
		after := labels[i+1:]
		if len(after) > 0 && after[0] == "dualstack" {
			after = after[1:]
		}
		switch {
		case region != "" && len(after) == 0:
		case region == "" && len(after) == 0:
			region = "us-east-1"
		case region == "" && len(after) == 1 && regionPattern.MatchString(after[0]):
			region = after[0]
		default:
			return AWSHost{}, false
		}
		return AWSHost{Region: region, Services: []string{"s3"}}, true
	}
	region := "us-east-1"
	service := labels
	if last := labels[len(labels)-1]; regionPattern.MatchString(last) {
		region, service = last, labels[:len(labels)-1]
	}
	if len(service) == 0 {
		return AWSHost{}, false
	}
	prefix := strings.TrimSuffix(strings.Join(service, "."), "-fips")
	if names, ok := signingNames[prefix]; ok {
		return AWSHost{Region: region, Services: names}, true
	}
	if !servicePattern.MatchString(prefix) {
		return AWSHost{}, false
	}
	return AWSHost{Region: region, Services: []string{prefix}}, true
}

// AWSSigningInput is what the decision to re-sign a request looks at: the
// task, where the request goes, its keys, whose placeholder access key id
// signed it, and the credential scope it signed for.
type AWSSigningInput struct {
	Task            string
	Authority       Authority
	Granted         []Granted
	Owner           string
	Ref             KeyRef
	Region, Service string
}

// DecideAWSSigning allows the real credentials of an AWS key to sign a
// request the task signed with the key's placeholder when the placeholder
// is the task's own, the key is granted now and is of kind aws, the request
// goes to one of its domains, and the scope passes DecideAWSScope. The
// reason never holds a credential.
func DecideAWSSigning(in AWSSigningInput) (SubstituteDecision, *Granted) {
	if in.Owner != in.Task {
		return SubstituteDecision{false, "a placeholder of another task"}, nil
	}
	i := slices.IndexFunc(in.Granted, func(g Granted) bool { return g.Ref == in.Ref })
	if i < 0 {
		return SubstituteDecision{false, fmt.Sprintf("key %s is not granted to this task", in.Ref)}, nil
	}
	g := &in.Granted[i]
	if g.AWS == nil {
		return SubstituteDecision{false, fmt.Sprintf("key %s is no longer of kind aws", in.Ref)}, nil
	}
	d, ok := in.Authority.Domain()
	if !ok || !g.Reaches(d) {
		return SubstituteDecision{false, fmt.Sprintf("key %s may not reach %s", in.Ref, in.Authority)}, nil
	}
	return DecideAWSScope(AWSScopeInput{Ref: in.Ref, Key: g.AWS, Authority: in.Authority, Region: in.Region, Service: in.Service}), g
}

// AWSScopeInput is what the scope decision looks at: the request's
// credential scope, where it goes, and the key it would be signed with.
type AWSScopeInput struct {
	Ref             KeyRef
	Key             *AWSKey
	Authority       Authority
	Region, Service string
}

// ScopeRefused is the audit reason of a scope outside a key's bounds or
// its request's host.
const ScopeRefused = "scope_refused"

// DecideAWSScope allows a SigV4 scope when its region and service are in
// the key's bounds and, on an AWS endpoint name, the ones that name
// implies: the real secret then signs only for what the policy names, sent
// where AWS would accept it. A name that is not an AWS endpoint (an
// S3-compatible store the policy lists) is held to the bounds alone.
func DecideAWSScope(in AWSScopeInput) SubstituteDecision {
	refuse := func(format string, a ...any) SubstituteDecision {
		return SubstituteDecision{false, ScopeRefused + ": " + fmt.Sprintf(format, a...)}
	}
	if !slices.Contains(in.Key.Regions, in.Region) {
		return refuse("region %q is outside key %s's regions (%s)", in.Region, in.Ref, strings.Join(in.Key.Regions, ", "))
	}
	if !slices.Contains(in.Key.Services, in.Service) {
		return refuse("service %q is outside key %s's services (%s)", in.Service, in.Ref, strings.Join(in.Key.Services, ", "))
	}
	if h, ok := ParseAWSHost(in.Authority.Name); ok {
		if h.Region != in.Region || !slices.Contains(h.Services, in.Service) {
			return refuse("the request is signed for %s in %s but goes to %s, an endpoint of %s in %s",
				in.Service, in.Region, in.Authority.Name, strings.Join(h.Services, " or "), h.Region)
		}
	}
	return SubstituteDecision{true, "allowed"}
}

// envNames are the variables a granted key gives the task: none for an
// ssh key, which the task uses without holding anything.
func (g *Granted) envNames() []string {
	if g.SSH != nil {
		return nil
	}
	if g.AWS == nil {
		return []string{g.Ref.Key}
	}
	e := g.AWS.Env()
	return []string{e.AccessKeyID, e.SecretAccessKey, e.SessionToken}
}

// refuseEnvClashes refuses each granted key that would set a variable an
// earlier one sets (two AWS keys with one aws.envPrefix, or an AWS key and
// a key named like one of its variables): the task would get one of them
// silently, and which one would depend on order.
func refuseEnvClashes(granted []Granted, refused []Refusal) ([]Granted, []Refusal) {
	// Declared key names are unique (runspec), so only an AWS key can clash.
	if !slices.ContainsFunc(granted, func(g Granted) bool { return g.AWS != nil }) {
		return granted, refused
	}
	owner := map[string]KeyRef{}
	kept := granted[:0]
	for _, g := range granted {
		names := g.envNames()
		clash := ""
		for _, n := range names {
			// Compared without case, as runspec compares declared names.
			if o, ok := owner[strings.ToUpper(n)]; ok {
				clash = fmt.Sprintf("it would set %s, which key %s sets for the task too; give one of them its own aws.envPrefix in the host policy, or declare only one", n, o)
				break
			}
		}
		if clash != "" {
			refused = append(refused, Refusal{g.Ref, clash})
			continue
		}
		for _, n := range names {
			owner[strings.ToUpper(n)] = g.Ref
		}
		kept = append(kept, g)
	}
	return kept, refused
}
