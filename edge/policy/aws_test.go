package policy

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/shared/runspec"
)

// awsKey is a valid key of kind aws, changed by edit: it reaches S3 in
// us-east-1 (path-style and one bucket's virtual host) and STS's global
// name, within us-east-1 and eu-west-1, s3 and sts.
func awsKey(edit func(k *config.KeyPolicy, a *config.AWSKey)) config.KeyPolicy {
	a := &config.AWSKey{Regions: []string{"us-east-1", "eu-west-1"}, Services: []string{"s3", "sts"}}
	k := config.KeyPolicy{
		Kind:    KindAWS,
		Domains: []string{"s3.us-east-1.amazonaws.com", "reports.s3.us-east-1.amazonaws.com", "sts.amazonaws.com"},
		AWS:     a,
	}
	if edit != nil {
		edit(&k, a)
	}
	return k
}

const testRoleARN = "arn:aws:iam::123456789012:role/runfleet-deploy"

func withRole(edit func(r *config.AssumeRole)) func(*config.KeyPolicy, *config.AWSKey) {
	return func(_ *config.KeyPolicy, a *config.AWSKey) {
		a.AssumeRole = &config.AssumeRole{RoleARN: testRoleARN}
		edit(a.AssumeRole)
	}
}

// The key an operator writes in edge.json compiles to the bounds the
// proxy enforces: the wire names are the documented ones, the defaults
// (envPrefix AWS_, a 1h session) apply, and the session policy is sent to
// STS compacted. An aws key is never substituted: no location, no shape.
func TestCompileAWSKeyFromEdgeJSON(t *testing.T) {
	c, err := config.Parse([]byte(`{"dataDir": "/d", "api": {"tokenFile": "/t"},
	 "policy": {"projects": {"acme": {"keys": {
	  "DEPLOY": {"kind": "aws",
	    "domains": ["s3.us-east-1.amazonaws.com", "S3.EU-WEST-1.amazonaws.com.", "sts.amazonaws.com"],
	    "aws": {"regions": ["us-east-1", "eu-west-1", "us-east-1"], "services": ["s3", "sts"],
	      "assumeRole": {"roleArn": "arn:aws:iam::123456789012:role/runfleet-deploy", "externalId": "fleet-7f3a",
	        "sessionPolicy": {
	          "Statement": [ {"Action": "s3:GetObject", "Effect": "Allow", "Resource": "arn:aws:s3:::reports/*"} ],
	          "Version": "2012-10-17"
	        }}}},
	  "BACKUP": {"kind": "aws", "domains": ["s3.us-west-2.amazonaws.com"],
	    "aws": {"regions": ["us-west-2"], "services": ["s3"], "envPrefix": "BACKUP_AWS_",
	      "assumeRole": {"roleArn": "arn:aws-us-gov:iam::123456789012:role/path/backup", "duration": "12h"}}}}}}}}`))
	if err != nil {
		t.Fatalf("edge.json with aws keys does not parse: %v", err)
	}
	p, err := Compile(c.Policy)
	if err != nil {
		t.Fatal(err)
	}
	k, ok := p.Key(KeyRef{"acme", "DEPLOY"})
	if !ok {
		t.Fatal("key missing")
	}
	if k.Kind != KindAWS || k.AWS == nil {
		t.Fatalf("kind %q, aws %v", k.Kind, k.AWS)
	}
	if k.In != 0 || k.Placeholder != (Shape{}) {
		t.Errorf("an aws key is never substituted: in %v, shape %+v", k.In, k.Placeholder)
	}
	if !slices.Equal(k.AWS.Regions, []string{"us-east-1", "eu-west-1"}) || !slices.Equal(k.AWS.Services, []string{"s3", "sts"}) {
		t.Errorf("bounds: regions %v services %v", k.AWS.Regions, k.AWS.Services)
	}
	if k.AWS.EnvPrefix != DefaultAWSEnvPrefix {
		t.Errorf("envPrefix %q, want the default %q", k.AWS.EnvPrefix, DefaultAWSEnvPrefix)
	}
	if got, want := k.AWS.Env(), (AWSEnv{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}); got != want {
		t.Errorf("env %+v, want %+v", got, want)
	}
	want := AssumeRole{
		RoleARN:       testRoleARN,
		ExternalID:    "fleet-7f3a",
		SessionPolicy: `{"Statement":[{"Action":"s3:GetObject","Effect":"Allow","Resource":"arn:aws:s3:::reports/*"}],"Version":"2012-10-17"}`,
		Duration:      time.Hour,
	}
	if k.AWS.AssumeRole == nil || *k.AWS.AssumeRole != want {
		t.Errorf("assumeRole %+v, want %+v", k.AWS.AssumeRole, want)
	}
	if len(k.Domains) != 3 || k.Domains[1] != (Domain{Name: "s3.eu-west-1.amazonaws.com", Port: 443}) {
		t.Errorf("domains %v", k.Domains)
	}
	for _, name := range []string{"s3.us-east-1.amazonaws.com", "s3.eu-west-1.amazonaws.com", "sts.amazonaws.com", "s3.us-west-2.amazonaws.com"} {
		if !p.AllowsName(name) {
			t.Errorf("AllowsName(%s) = false: the CA must issue a leaf for an aws key's domain", name)
		}
	}

	b, _ := p.Key(KeyRef{"acme", "BACKUP"})
	if b == nil || b.AWS == nil || b.AWS.EnvPrefix != "BACKUP_AWS_" || b.AWS.Env().SessionToken != "BACKUP_AWS_SESSION_TOKEN" {
		t.Fatalf("BACKUP: %+v", b)
	}
	if ar := b.AWS.AssumeRole; ar == nil || ar.Duration != 12*time.Hour || ar.SessionPolicy != "" || ar.ExternalID != "" {
		t.Errorf("BACKUP assumeRole %+v", ar)
	}
}

// A key without assumeRole takes its credentials from the secrets source;
// the session bounds and the session policy's limit are counted as STS
// counts them (the policy's whitespace is not sent).
func TestCompileAWSKeyBounds(t *testing.T) {
	long := strings.Repeat("x", MaxSessionPolicy-len(`{"Sid":""}`))
	for name, tc := range map[string]struct {
		kp   config.KeyPolicy
		want AssumeRole
	}{
		"default duration": {awsKey(withRole(func(r *config.AssumeRole) {})), AssumeRole{RoleARN: testRoleARN, Duration: time.Hour}},
		"shortest session": {awsKey(withRole(func(r *config.AssumeRole) { r.Duration = config.Duration(15 * time.Minute) })), AssumeRole{RoleARN: testRoleARN, Duration: 15 * time.Minute}},
		"longest session":  {awsKey(withRole(func(r *config.AssumeRole) { r.Duration = config.Duration(12 * time.Hour) })), AssumeRole{RoleARN: testRoleARN, Duration: 12 * time.Hour}},
		"externalId of 2":  {awsKey(withRole(func(r *config.AssumeRole) { r.ExternalID = "ab" })), AssumeRole{RoleARN: testRoleARN, ExternalID: "ab", Duration: time.Hour}},
		"externalId of 1224": {awsKey(withRole(func(r *config.AssumeRole) { r.ExternalID = strings.Repeat("e", 1224) })),
			AssumeRole{RoleARN: testRoleARN, ExternalID: strings.Repeat("e", 1224), Duration: time.Hour}},
		"policy of 2048 compacted, longer written": {awsKey(withRole(func(r *config.AssumeRole) {
			r.SessionPolicy = json.RawMessage("{\n" + strings.Repeat(" ", 4000) + `"Sid": "` + long + "\"\n}")
		})), AssumeRole{RoleARN: testRoleARN, SessionPolicy: `{"Sid":"` + long + `"}`, Duration: time.Hour}},
	} {
		p, err := Compile(one("acme", "K", tc.kp))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		k, _ := p.Key(KeyRef{"acme", "K"})
		if k.AWS.AssumeRole == nil || *k.AWS.AssumeRole != tc.want {
			t.Errorf("%s: assumeRole %+v, want %+v", name, k.AWS.AssumeRole, tc.want)
		}
	}
	p, err := Compile(one("acme", "K", awsKey(nil)))
	if err != nil {
		t.Fatal(err)
	}
	if k, _ := p.Key(KeyRef{"acme", "K"}); k.AWS.AssumeRole != nil {
		t.Errorf("no assumeRole written, got %+v", k.AWS.AssumeRole)
	}
}

// Each form that could never be enforced is refused at load, the error
// naming the project, the key and what is wrong with which value.
func TestCompileAWSRefusesWithAClearMessage(t *testing.T) {
	tooLong := `{"Sid":"` + strings.Repeat("x", MaxSessionPolicy) + `"}`
	for name, tc := range map[string]struct {
		kp   config.KeyPolicy
		want []string
	}{
		"unknown kind": {awsKey(func(k *config.KeyPolicy, _ *config.AWSKey) { k.Kind = "gcp" }),
			[]string{`kind: "gcp" is not a kind`}},
		"kind in capitals": {awsKey(func(k *config.KeyPolicy, _ *config.AWSKey) { k.Kind = "AWS" }),
			[]string{`kind: "AWS" is not a kind`}},
		"aws block on a plain key": {awsKey(func(k *config.KeyPolicy, _ *config.AWSKey) { k.Kind = "" }),
			[]string{`aws: only a key of "kind": "aws" takes it`}},
		"in on an aws key": {awsKey(func(k *config.KeyPolicy, _ *config.AWSKey) { k.In = []string{"header"} }),
			[]string{`in: an aws key is never put into a request`}},
		"placeholder on an aws key": {awsKey(func(k *config.KeyPolicy, _ *config.AWSKey) { k.Placeholder = config.PlaceholderShape{Prefix: "AKIA"} }),
			[]string{`placeholder: an aws key's placeholders have the shapes of AWS credentials`}},
		"placeholder length on an aws key": {awsKey(func(k *config.KeyPolicy, _ *config.AWSKey) { k.Placeholder.Length = 40 }),
			[]string{`placeholder: an aws key's placeholders`}},
		"no aws block": {awsKey(func(k *config.KeyPolicy, _ *config.AWSKey) { k.AWS = nil }),
			[]string{`aws: a key of kind "aws" needs "aws": {"regions": [...], "services": [...]}`}},
		"no domains": {awsKey(func(k *config.KeyPolicy, _ *config.AWSKey) { k.Domains = nil }),
			[]string{`domains: at least one is required`}},
		"wildcard bucket host": {awsKey(func(k *config.KeyPolicy, _ *config.AWSKey) { k.Domains = []string{"*.s3.us-east-1.amazonaws.com"} }),
			[]string{`domains[0]: "*.s3.us-east-1.amazonaws.com": a wildcard`}},
		"no regions": {awsKey(func(_ *config.KeyPolicy, a *config.AWSKey) { a.Regions = nil }),
			[]string{`aws.regions: at least one is required`}},
		"empty regions": {awsKey(func(_ *config.KeyPolicy, a *config.AWSKey) { a.Regions = []string{} }),
			[]string{`aws.regions: at least one is required`}},
		"region in capitals": {awsKey(func(_ *config.KeyPolicy, a *config.AWSKey) { a.Regions = []string{"US-EAST-1"} }),
			[]string{`aws.regions[0]: "US-EAST-1" is not a region such as us-east-1`}},
		"region without a number": {awsKey(func(_ *config.KeyPolicy, a *config.AWSKey) { a.Regions = []string{"us-east-1", "eu-west"} }),
			[]string{`aws.regions[1]: "eu-west" is not a region`}},
		"region wildcard": {awsKey(func(_ *config.KeyPolicy, a *config.AWSKey) { a.Regions = []string{"*"} }),
			[]string{`aws.regions[0]: "*" is not a region`}},
		"empty region": {awsKey(func(_ *config.KeyPolicy, a *config.AWSKey) { a.Regions = []string{""} }),
			[]string{`aws.regions[0]: "" is not a region`}},
		"no services": {awsKey(func(_ *config.KeyPolicy, a *config.AWSKey) { a.Services = nil }),
			[]string{`aws.services: at least one is required`}},
		"an action, not a service": {awsKey(func(_ *config.KeyPolicy, a *config.AWSKey) { a.Services = []string{"s3:GetObject"} }),
			[]string{`aws.services[0]: "s3:GetObject" is not a signing name such as s3, sts or dynamodb`}},
		"service in capitals": {awsKey(func(_ *config.KeyPolicy, a *config.AWSKey) { a.Services = []string{"s3", "STS"} }),
			[]string{`aws.services[1]: "STS" is not a signing name`}},
		"service wildcard": {awsKey(func(_ *config.KeyPolicy, a *config.AWSKey) { a.Services = []string{"*"} }),
			[]string{`aws.services[0]: "*" is not a signing name`}},
		"envPrefix with a dash": {awsKey(func(_ *config.KeyPolicy, a *config.AWSKey) { a.EnvPrefix = "PROD-AWS_" }),
			[]string{`aws.envPrefix: "PROD-AWS_": letters, digits and '_', not starting with a digit`}},
		"envPrefix starting with a digit": {awsKey(func(_ *config.KeyPolicy, a *config.AWSKey) { a.EnvPrefix = "2AWS_" }),
			[]string{`aws.envPrefix: "2AWS_"`}},
		"roleArn of a user": {awsKey(withRole(func(r *config.AssumeRole) { r.RoleARN = "arn:aws:iam::123456789012:user/deploy" })),
			[]string{`aws.assumeRole.roleArn: "arn:aws:iam::123456789012:user/deploy" is not a role's ARN`}},
		"roleArn with a short account": {awsKey(withRole(func(r *config.AssumeRole) { r.RoleARN = "arn:aws:iam::1234:role/deploy" })),
			[]string{`roleArn: "arn:aws:iam::1234:role/deploy" is not a role's ARN`}},
		"roleArn missing": {awsKey(withRole(func(r *config.AssumeRole) { r.RoleARN = "" })),
			[]string{`aws.assumeRole.roleArn: "" is not a role's ARN`}},
		"roleArn of a name": {awsKey(withRole(func(r *config.AssumeRole) { r.RoleARN = "runfleet-deploy" })),
			[]string{`roleArn: "runfleet-deploy"`}},
		"externalId of one character": {awsKey(withRole(func(r *config.AssumeRole) { r.ExternalID = "x" })),
			[]string{`aws.assumeRole.externalId: 2 to 1224`}},
		"externalId with a space": {awsKey(withRole(func(r *config.AssumeRole) { r.ExternalID = "fleet 7f3a" })),
			[]string{`aws.assumeRole.externalId: 2 to 1224`}},
		"externalId of 1225": {awsKey(withRole(func(r *config.AssumeRole) { r.ExternalID = strings.Repeat("e", 1225) })),
			[]string{`aws.assumeRole.externalId: 2 to 1224`}},
		"session under 15m": {awsKey(withRole(func(r *config.AssumeRole) { r.Duration = config.Duration(14*time.Minute + 59*time.Second) })),
			[]string{`aws.assumeRole.duration: 14m59s is outside STS's 15m0s to 12h0m0s`}},
		"session over 12h": {awsKey(withRole(func(r *config.AssumeRole) { r.Duration = config.Duration(12*time.Hour + time.Second) })),
			[]string{`aws.assumeRole.duration: 12h0m1s is outside STS's 15m0s to 12h0m0s`}},
		"negative session": {awsKey(withRole(func(r *config.AssumeRole) { r.Duration = config.Duration(-time.Hour) })),
			[]string{`duration: -1h0m0s is outside`}},
		"session policy an array": {awsKey(withRole(func(r *config.AssumeRole) { r.SessionPolicy = json.RawMessage(`[{"Effect":"Allow"}]`) })),
			[]string{`aws.assumeRole.sessionPolicy: is not a non-empty JSON object (an IAM policy document)`}},
		"session policy a string": {awsKey(withRole(func(r *config.AssumeRole) { r.SessionPolicy = json.RawMessage(`"{\"Version\":\"2012-10-17\"}"`) })),
			[]string{`sessionPolicy: is not a non-empty JSON object`}},
		"role and duration both wrong": {awsKey(withRole(func(r *config.AssumeRole) {
			r.RoleARN = "arn:aws:iam::1:user/x"
			r.Duration = config.Duration(time.Minute)
		})), []string{`roleArn: "arn:aws:iam::1:user/x" is not a role's ARN`, `duration: 1m0s is outside`}},
		"session policy null": {awsKey(withRole(func(r *config.AssumeRole) { r.SessionPolicy = json.RawMessage(`null`) })),
			[]string{`sessionPolicy: is not a non-empty JSON object`}},
		"session policy empty": {awsKey(withRole(func(r *config.AssumeRole) { r.SessionPolicy = json.RawMessage(`{}`) })),
			[]string{`sessionPolicy: is not a non-empty JSON object`}},
		"session policy too long": {awsKey(withRole(func(r *config.AssumeRole) { r.SessionPolicy = json.RawMessage(tooLong) })),
			[]string{fmt.Sprintf("aws.assumeRole.sessionPolicy: is %d characters compacted; STS takes at most 2048", len(tooLong))}},
		"domain in a region outside": {awsKey(func(k *config.KeyPolicy, a *config.AWSKey) {
			k.Domains = []string{"dynamodb.eu-west-1.amazonaws.com"}
			a.Regions, a.Services = []string{"us-east-1"}, []string{"dynamodb"}
		}), []string{`domains[0]: "dynamodb.eu-west-1.amazonaws.com": its region eu-west-1 is not in aws.regions`}},
		"domain of a service outside": {awsKey(func(k *config.KeyPolicy, a *config.AWSKey) {
			k.Domains = []string{"s3.us-east-1.amazonaws.com", "dynamodb.us-east-1.amazonaws.com"}
			a.Services = []string{"s3"}
		}), []string{`domains[1]: "dynamodb.us-east-1.amazonaws.com": its service (dynamodb) is not in aws.services`}},
		"global name outside the regions": {awsKey(func(k *config.KeyPolicy, a *config.AWSKey) {
			k.Domains = []string{"sts.amazonaws.com"}
			a.Regions = []string{"eu-west-1"}
		}), []string{`domains[0]: "sts.amazonaws.com": its region us-east-1 is not in aws.regions`}},
		"bucket host in a region outside": {awsKey(func(k *config.KeyPolicy, a *config.AWSKey) {
			k.Domains = []string{"reports.s3.us-west-2.amazonaws.com"}
		}), []string{`domains[0]: "reports.s3.us-west-2.amazonaws.com": its region us-west-2 is not in aws.regions`}},
		"endpoint of a signing name outside": {awsKey(func(k *config.KeyPolicy, a *config.AWSKey) {
			k.Domains = []string{"email.eu-west-1.amazonaws.com"}
			a.Services = []string{"email"}
		}), []string{`domains[0]: "email.eu-west-1.amazonaws.com": its service (ses) is not in aws.services`}},
	} {
		p, err := Compile(one("acme", "K", tc.kp))
		if err == nil || p != nil {
			t.Errorf("%s: compiled (%v), want a refusal", name, err)
			continue
		}
		for _, want := range append([]string{`policy.projects.acme.keys.K.`}, tc.want...) {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q, want it to contain %q", name, err, want)
			}
		}
	}
}

// An operator fixing edge.json sees every problem in one go, across keys
// and projects, and within one key's aws block.
func TestCompileAWSReportsEveryProblemAtOnce(t *testing.T) {
	_, err := Compile(config.Policy{Projects: map[string]config.ProjectPolicy{
		"acme": {Keys: map[string]config.KeyPolicy{
			"DEPLOY": awsKey(func(k *config.KeyPolicy, a *config.AWSKey) {
				k.In = []string{"header"}
				k.Placeholder = config.PlaceholderShape{Prefix: "AKIA"}
				k.Domains = []string{"s3.us-east-1.amazonaws.com", "dynamodb.eu-west-1.amazonaws.com"}
				a.Regions = []string{"us-east-1", "mars-1"}
				a.Services = []string{"s3", "S3 "}
				a.EnvPrefix = "AWS-"
			}),
			"GOOD": awsKey(nil),
		}},
		"beta": {Keys: map[string]config.KeyPolicy{
			"ROLE":   awsKey(withRole(func(r *config.AssumeRole) { r.RoleARN = "arn:aws:iam::42:role/x" })),
			"NOKIND": awsKey(func(k *config.KeyPolicy, _ *config.AWSKey) { k.Kind = "azure" }),
			"PLAIN":  key([]string{"a.example"}, []string{"cookie"}, "", 0),
		}},
	}})
	if err == nil {
		t.Fatal("compiled")
	}
	for _, want := range []string{
		`policy.projects.acme.keys.DEPLOY.in: an aws key is never put`,
		`policy.projects.acme.keys.DEPLOY.placeholder: an aws key's placeholders`,
		`policy.projects.acme.keys.DEPLOY.aws.envPrefix: "AWS-"`,
		`policy.projects.acme.keys.DEPLOY.aws.regions[1]: "mars-1" is not a region`,
		`policy.projects.acme.keys.DEPLOY.aws.services[1]: "S3 " is not a signing name`,
		`policy.projects.acme.keys.DEPLOY.domains[1]: "dynamodb.eu-west-1.amazonaws.com": its region eu-west-1`,
		`policy.projects.beta.keys.ROLE.aws.assumeRole.roleArn: "arn:aws:iam::42:role/x"`,
		`policy.projects.beta.keys.NOKIND.kind: "azure" is not a kind`,
		`policy.projects.beta.keys.PLAIN.in[0]: "cookie" is not one of`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q\nwant it to contain %q", err, want)
		}
	}
	if strings.Contains(err.Error(), `keys.GOOD`) {
		t.Errorf("a valid key is reported: %v", err)
	}
}

// A key written before kinds existed compiles as it always did, next to
// an aws key: substituted in the header by default, placeholders of 48.
func TestCompilePlainKeyUnchangedByKinds(t *testing.T) {
	p, err := Compile(config.Policy{Projects: map[string]config.ProjectPolicy{"acme": {Keys: map[string]config.KeyPolicy{
		"OPENAI_API_KEY": key([]string{"api.openai.com"}, nil, "sk-", 0),
		"GH_TOKEN":       key([]string{"api.github.com"}, []string{"url", "body"}, "ghp_", 64),
		// A plain key may reach an AWS name; no aws bounds apply to it.
		"AWS_ACCESS_KEY_ID": key([]string{"s3.eu-west-1.amazonaws.com"}, nil, "", 0),
		"DEPLOY":            awsKey(nil),
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key   string
		in    Location
		shape Shape
	}{
		{"OPENAI_API_KEY", InHeader, Shape{"sk-", DefaultPlaceholderLength}},
		{"GH_TOKEN", InURL | InBody, Shape{"ghp_", 64}},
		{"AWS_ACCESS_KEY_ID", InHeader, Shape{"", 48}},
	} {
		k, ok := p.Key(KeyRef{"acme", tc.key})
		if !ok {
			t.Errorf("%s missing", tc.key)
			continue
		}
		if k.Kind != "" || k.AWS != nil || k.In != tc.in || k.Placeholder != tc.shape || len(k.Domains) != 1 {
			t.Errorf("%s: kind %q aws %v in %v shape %+v domains %v", tc.key, k.Kind, k.AWS, k.In, k.Placeholder, k.Domains)
		}
	}
}

func TestParseAWSHost(t *testing.T) {
	for _, tc := range []struct {
		host     string
		region   string
		services []string // nil: not an AWS endpoint
	}{
		// S3, path-style.
		{"s3.amazonaws.com", "us-east-1", []string{"s3"}},
		{"s3.us-west-2.amazonaws.com", "us-west-2", []string{"s3"}},
		{"s3-us-west-2.amazonaws.com", "us-west-2", []string{"s3"}},
		{"s3-external-1.amazonaws.com", "us-east-1", []string{"s3"}},
		{"s3.dualstack.us-east-2.amazonaws.com", "us-east-2", []string{"s3"}},
		{"s3-fips.us-east-1.amazonaws.com", "us-east-1", []string{"s3"}},
		{"s3-fips.dualstack.us-gov-west-1.amazonaws.com", "us-gov-west-1", []string{"s3"}},
		{"s3.us-gov-west-1.amazonaws.com", "us-gov-west-1", []string{"s3"}},
		{"s3-us-gov-west-1.amazonaws.com", "us-gov-west-1", []string{"s3"}},
		{"s3-fips-us-gov-west-1.amazonaws.com", "us-gov-west-1", []string{"s3"}},
		{"bucket.s3-fips-us-gov-west-1.amazonaws.com", "us-gov-west-1", []string{"s3"}},
		// S3, virtual-hosted: the bucket's labels come first.
		{"bucket.s3.eu-west-1.amazonaws.com", "eu-west-1", []string{"s3"}},
		{"my.dotted.bucket.s3.us-east-1.amazonaws.com", "us-east-1", []string{"s3"}},
		{"bucket.s3.amazonaws.com", "us-east-1", []string{"s3"}},
		{"bucket.s3-us-west-2.amazonaws.com", "us-west-2", []string{"s3"}},
		{"bucket.s3-external-1.amazonaws.com", "us-east-1", []string{"s3"}},
		{"bucket.s3.dualstack.ap-southeast-2.amazonaws.com", "ap-southeast-2", []string{"s3"}},
		// A bucket named like an endpoint does not move the scope.
		{"s3.s3.eu-west-1.amazonaws.com", "eu-west-1", []string{"s3"}},
		{"s3-us-west-2.s3.eu-west-1.amazonaws.com", "eu-west-1", []string{"s3"}},
		{"us-west-2.s3.amazonaws.com", "us-east-1", []string{"s3"}},
		{"logs.s3.us-west-2.s3.eu-central-1.amazonaws.com", "eu-central-1", []string{"s3"}},
		// S3's control plane and access points sign as s3.
		{"123456789012.s3-control.us-west-2.amazonaws.com", "us-west-2", []string{"s3"}},
		{"ap-123456789012.s3-accesspoint.us-west-2.amazonaws.com", "us-west-2", []string{"s3"}},
		{"ap-123456789012.s3-accesspoint.dualstack.us-west-2.amazonaws.com", "us-west-2", []string{"s3"}},
		// Other services: "<service>.<region>" or global "<service>".
		{"sts.amazonaws.com", "us-east-1", []string{"sts"}},
		{"sts.us-east-1.amazonaws.com", "us-east-1", []string{"sts"}},
		{"sts.eu-west-1.amazonaws.com", "eu-west-1", []string{"sts"}},
		{"sts-fips.us-east-2.amazonaws.com", "us-east-2", []string{"sts"}},
		{"dynamodb.us-east-1.amazonaws.com", "us-east-1", []string{"dynamodb"}},
		{"streams.dynamodb.us-east-1.amazonaws.com", "us-east-1", []string{"dynamodb"}},
		{"iam.amazonaws.com", "us-east-1", []string{"iam"}},
		{"sqs.eu-central-1.amazonaws.com", "eu-central-1", []string{"sqs"}},
		{"secretsmanager.us-gov-east-1.amazonaws.com", "us-gov-east-1", []string{"secretsmanager"}},
		// Endpoint prefixes whose signing name differs.
		{"bedrock-runtime.us-west-2.amazonaws.com", "us-west-2", []string{"bedrock"}},
		{"bedrock-runtime-fips.us-east-1.amazonaws.com", "us-east-1", []string{"bedrock"}},
		{"bedrock-agent-runtime.us-west-2.amazonaws.com", "us-west-2", []string{"bedrock"}},
		{"email.us-east-1.amazonaws.com", "us-east-1", []string{"ses"}},
		{"runtime.sagemaker.eu-west-1.amazonaws.com", "eu-west-1", []string{"sagemaker"}},
		{"api.ecr.us-east-1.amazonaws.com", "us-east-1", []string{"ecr"}},
		{"monitoring.us-east-1.amazonaws.com", "us-east-1", []string{"monitoring"}},
		// Not AWS endpoint names: held to a key's bounds only.
		{"example.com", "", nil},
		{"amazonaws.com", "", nil},
		{"evil-amazonaws.com", "", nil},
		{"amazonaws.com.evil.test", "", nil},
		{"s3.amazonaws.com.evil.test", "", nil},
		{"s3.us-east-1.amazonaws.com.evil.test", "", nil},
		{"s3-amazonaws.com", "", nil},
		{"minio.internal.test", "", nil},
		{"", "", nil},
		// Under amazonaws.com but no scope can be read from it.
		{"bucket.s3.not-a-region.amazonaws.com", "", nil},
		{"s3.us-east-1.extra.amazonaws.com", "", nil},
		{"bucket.s3-website.us-east-1.amazonaws.com", "", nil},
		{"abc123defg.execute-api.us-east-1.amazonaws.com", "", nil},
		{"bucket.vpce-0a1b2c3d.s3.us-east-1.vpce.amazonaws.com", "", nil},
	} {
		h, ok := ParseAWSHost(tc.host)
		if ok != (tc.services != nil) {
			t.Errorf("ParseAWSHost(%q) = %+v, %v; want ok %v", tc.host, h, ok, tc.services != nil)
			continue
		}
		if ok && (h.Region != tc.region || !slices.Equal(h.Services, tc.services)) {
			t.Errorf("ParseAWSHost(%q) = %s %v, want %s %v", tc.host, h.Region, h.Services, tc.region, tc.services)
		}
	}
}

func authority(t *testing.T, s string) Authority {
	t.Helper()
	a, err := ParseAuthority(s, true)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The scope a task signed for is re-signed only within the key's bounds
// and, on an AWS name, only for the region and service that name serves.
func TestDecideAWSScope(t *testing.T) {
	ref := KeyRef{"acme", "DEPLOY"}
	k := &AWSKey{Regions: []string{"us-east-1", "us-west-2"}, Services: []string{"s3", "sts", "dynamodb", "bedrock", "ses"}, EnvPrefix: "AWS_"}
	for _, tc := range []struct {
		host, region, service string
		why                   string // "" for allowed
	}{
		{"s3.us-east-1.amazonaws.com:443", "us-east-1", "s3", ""},
		{"s3.amazonaws.com:443", "us-east-1", "s3", ""},
		{"s3-external-1.amazonaws.com:443", "us-east-1", "s3", ""},
		{"reports.s3.us-west-2.amazonaws.com:443", "us-west-2", "s3", ""},
		{"s3.dualstack.us-west-2.amazonaws.com:443", "us-west-2", "s3", ""},
		{"sts.amazonaws.com:443", "us-east-1", "sts", ""},
		{"dynamodb.us-west-2.amazonaws.com:443", "us-west-2", "dynamodb", ""},
		{"bedrock-runtime.us-west-2.amazonaws.com:443", "us-west-2", "bedrock", ""},
		{"email.us-east-1.amazonaws.com:443", "us-east-1", "ses", ""},
		// Outside the bounds.
		{"s3.eu-west-1.amazonaws.com:443", "eu-west-1", "s3", `scope_refused: region "eu-west-1" is outside key acme/DEPLOY's regions (us-east-1, us-west-2)`},
		{"iam.amazonaws.com:443", "us-east-1", "iam", `scope_refused: service "iam" is outside key acme/DEPLOY's services (s3, sts, dynamodb, bedrock, ses)`},
		{"s3.us-east-1.amazonaws.com:443", "", "s3", `scope_refused: region "" is outside`},
		{"s3.us-east-1.amazonaws.com:443", "us-east-1", "", `scope_refused: service "" is outside`},
		{"s3.us-east-1.amazonaws.com:443", "US-EAST-1", "s3", `scope_refused: region "US-EAST-1" is outside`},
		// Inside the bounds, but not what the name serves.
		{"s3.us-east-1.amazonaws.com:443", "us-west-2", "s3",
			"scope_refused: the request is signed for s3 in us-west-2 but goes to s3.us-east-1.amazonaws.com, an endpoint of s3 in us-east-1"},
		{"s3.us-east-1.amazonaws.com:443", "us-east-1", "dynamodb",
			"scope_refused: the request is signed for dynamodb in us-east-1 but goes to s3.us-east-1.amazonaws.com, an endpoint of s3 in us-east-1"},
		{"sts.amazonaws.com:443", "us-west-2", "sts", "scope_refused: the request is signed for sts in us-west-2 but goes to sts.amazonaws.com, an endpoint of sts in us-east-1"},
		{"reports.s3.us-west-2.amazonaws.com:443", "us-east-1", "s3", "goes to reports.s3.us-west-2.amazonaws.com, an endpoint of s3 in us-west-2"},
		{"bedrock-runtime.us-west-2.amazonaws.com:443", "us-west-2", "s3", "an endpoint of bedrock in us-west-2"},
		{"email.us-east-1.amazonaws.com:443", "us-east-1", "sts", "an endpoint of ses in us-east-1"},
		// Not an AWS name (an S3-compatible store): the bounds alone.
		{"minio.internal.test:9000", "us-east-1", "s3", ""},
		{"minio.internal.test:9000", "us-west-2", "dynamodb", ""},
		{"minio.internal.test:9000", "eu-west-1", "s3", `scope_refused: region "eu-west-1" is outside`},
		{"minio.internal.test:9000", "us-east-1", "iam", `scope_refused: service "iam" is outside`},
	} {
		got := DecideAWSScope(AWSScopeInput{Ref: ref, Key: k, Authority: authority(t, tc.host), Region: tc.region, Service: tc.service})
		name := tc.service + "/" + tc.region + " to " + tc.host
		if tc.why == "" {
			if !got.Allow || got.Reason != "allowed" {
				t.Errorf("%s: %+v, want allowed", name, got)
			}
			continue
		}
		if got.Allow || !strings.HasPrefix(got.Reason, ScopeRefused+": ") || !strings.Contains(got.Reason, tc.why) {
			t.Errorf("%s: %+v, want a refusal containing %q", name, got, tc.why)
		}
	}
}

// The real credentials sign a task's request only when the placeholder is
// the task's own, the key is granted now and of kind aws, the request goes
// to one of its granted domains, and the scope is inside bounds and host.
func TestDecideAWSSigning(t *testing.T) {
	const externalID = "fleet-ext-9c41d7"
	p, err := Compile(config.Policy{Projects: map[string]config.ProjectPolicy{"acme": {Keys: map[string]config.KeyPolicy{
		"DEPLOY": {Kind: KindAWS,
			Domains: []string{"s3.us-east-1.amazonaws.com", "s3.us-west-2.amazonaws.com", "dynamodb.us-east-1.amazonaws.com", "sts.amazonaws.com", "minio.internal.test:9000"},
			AWS: &config.AWSKey{Regions: []string{"us-east-1", "us-west-2"}, Services: []string{"s3", "dynamodb", "sts"},
				AssumeRole: &config.AssumeRole{RoleARN: testRoleARN, ExternalID: externalID, SessionPolicy: json.RawMessage(`{"Version":"2012-10-17"}`)}}},
		"PLAIN": key([]string{"s3.us-east-1.amazonaws.com"}, nil, "", 0),
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	deploy, plain := KeyRef{"acme", "DEPLOY"}, KeyRef{"acme", "PLAIN"}
	// The task declared all but sts.amazonaws.com.
	granted, refused := p.Grant([]runspec.Declared{
		{ProjectID: "acme", Key: "DEPLOY", Domains: []Domain{
			{Name: "s3.us-east-1.amazonaws.com", Port: 443}, {Name: "s3.us-west-2.amazonaws.com", Port: 443},
			{Name: "dynamodb.us-east-1.amazonaws.com", Port: 443}, {Name: "minio.internal.test", Port: 9000}}},
		{ProjectID: "acme", Key: "PLAIN", Domains: []Domain{{Name: "s3.us-east-1.amazonaws.com", Port: 443}}},
	})
	if len(granted) != 2 || len(refused) != 0 {
		t.Fatalf("granted %v refused %v", granted, refused)
	}
	for name, tc := range map[string]struct {
		in    AWSSigningInput
		allow bool
		why   string
	}{
		"allowed":                {AWSSigningInput{"t1", authority(t, "s3.us-east-1.amazonaws.com:443"), granted, "t1", deploy, "us-east-1", "s3"}, true, "allowed"},
		"allowed, other region":  {AWSSigningInput{"t1", authority(t, "s3.us-west-2.amazonaws.com:443"), granted, "t1", deploy, "us-west-2", "s3"}, true, "allowed"},
		"allowed, other service": {AWSSigningInput{"t1", authority(t, "dynamodb.us-east-1.amazonaws.com:443"), granted, "t1", deploy, "us-east-1", "dynamodb"}, true, "allowed"},
		"allowed, not AWS":       {AWSSigningInput{"t1", authority(t, "minio.internal.test:9000"), granted, "t1", deploy, "us-west-2", "s3"}, true, "allowed"},

		"another task's placeholder": {AWSSigningInput{"t1", authority(t, "s3.us-east-1.amazonaws.com:443"), granted, "t2", deploy, "us-east-1", "s3"}, false, "a placeholder of another task"},
		"key withdrawn":              {AWSSigningInput{"t1", authority(t, "s3.us-east-1.amazonaws.com:443"), nil, "t1", deploy, "us-east-1", "s3"}, false, "key acme/DEPLOY is not granted to this task"},
		"key never declared":         {AWSSigningInput{"t1", authority(t, "s3.us-east-1.amazonaws.com:443"), granted, "t1", KeyRef{"acme", "OTHER"}, "us-east-1", "s3"}, false, "key acme/OTHER is not granted to this task"},
		"another project's key":      {AWSSigningInput{"t1", authority(t, "s3.us-east-1.amazonaws.com:443"), granted, "t1", KeyRef{"beta", "DEPLOY"}, "us-east-1", "s3"}, false, "key beta/DEPLOY is not granted"},
		"a plain key's ref":          {AWSSigningInput{"t1", authority(t, "s3.us-east-1.amazonaws.com:443"), granted, "t1", plain, "us-east-1", "s3"}, false, "key acme/PLAIN is no longer of kind aws"},
		"domain not declared":        {AWSSigningInput{"t1", authority(t, "sts.amazonaws.com:443"), granted, "t1", deploy, "us-east-1", "sts"}, false, "key acme/DEPLOY may not reach sts.amazonaws.com:443"},
		"domain not the key's":       {AWSSigningInput{"t1", authority(t, "s3.eu-west-1.amazonaws.com:443"), granted, "t1", deploy, "us-east-1", "s3"}, false, "may not reach s3.eu-west-1.amazonaws.com:443"},
		"another port":               {AWSSigningInput{"t1", authority(t, "s3.us-east-1.amazonaws.com:8443"), granted, "t1", deploy, "us-east-1", "s3"}, false, "may not reach s3.us-east-1.amazonaws.com:8443"},
		"an IP":                      {AWSSigningInput{"t1", authority(t, "52.216.0.1:443"), granted, "t1", deploy, "us-east-1", "s3"}, false, "may not reach 52.216.0.1:443"},

		"region outside":  {AWSSigningInput{"t1", authority(t, "minio.internal.test:9000"), granted, "t1", deploy, "eu-west-1", "s3"}, false, `scope_refused: region "eu-west-1" is outside key acme/DEPLOY's regions`},
		"service outside": {AWSSigningInput{"t1", authority(t, "minio.internal.test:9000"), granted, "t1", deploy, "us-east-1", "iam"}, false, `scope_refused: service "iam" is outside key acme/DEPLOY's services`},
		"region not the host's": {AWSSigningInput{"t1", authority(t, "s3.us-east-1.amazonaws.com:443"), granted, "t1", deploy, "us-west-2", "s3"}, false,
			"scope_refused: the request is signed for s3 in us-west-2 but goes to s3.us-east-1.amazonaws.com, an endpoint of s3 in us-east-1"},
		"service not the host's": {AWSSigningInput{"t1", authority(t, "s3.us-east-1.amazonaws.com:443"), granted, "t1", deploy, "us-east-1", "dynamodb"}, false,
			"scope_refused: the request is signed for dynamodb in us-east-1 but goes to s3.us-east-1.amazonaws.com"},
	} {
		got, g := DecideAWSSigning(tc.in)
		if got.Allow != tc.allow || !strings.Contains(got.Reason, tc.why) {
			t.Errorf("%s: %+v, want allow %v and %q", name, got, tc.allow, tc.why)
		}
		if scope := strings.HasPrefix(tc.why, ScopeRefused); scope != strings.HasPrefix(got.Reason, ScopeRefused+": ") {
			t.Errorf("%s: reason %q: only a scope refusal starts with %q", name, got.Reason, ScopeRefused+": ")
		}
		switch {
		case tc.allow && (g == nil || g.Ref != deploy || g.AWS == nil || g.AWS.AssumeRole == nil):
			t.Errorf("%s: allowed with key %+v, want acme/DEPLOY's", name, g)
		case !tc.allow && !strings.HasPrefix(tc.why, ScopeRefused) && g != nil:
			t.Errorf("%s: refused before the scope, yet key %v returned", name, g.Ref)
		}
		for _, secret := range []string{externalID, `"Version"`, "AKIA", "ASIA"} {
			if strings.Contains(got.Reason, secret) {
				t.Errorf("%s: reason %q holds %q", name, got.Reason, secret)
			}
		}
	}
}

// Two keys a task is granted may not set one variable: the task would get
// one of them silently. The first declared is granted; the second is
// refused, naming the variable and the key that sets it.
func TestGrantRefusesAWSEnvClashes(t *testing.T) {
	s3 := []string{"s3.us-east-1.amazonaws.com"}
	p, err := Compile(config.Policy{Projects: map[string]config.ProjectPolicy{
		"acme": {Keys: map[string]config.KeyPolicy{
			"DEPLOY":            {Kind: KindAWS, Domains: s3, AWS: &config.AWSKey{Regions: []string{"us-east-1"}, Services: []string{"s3"}}},
			"READER":            {Kind: KindAWS, Domains: s3, AWS: &config.AWSKey{Regions: []string{"us-east-1"}, Services: []string{"s3"}, EnvPrefix: "AWS_"}},
			"BACKUP":            {Kind: KindAWS, Domains: s3, AWS: &config.AWSKey{Regions: []string{"us-east-1"}, Services: []string{"s3"}, EnvPrefix: "BACKUP_AWS_"}},
			"AWS_ACCESS_KEY_ID": key(s3, nil, "", 0),
			"AWS_SESSION_TOKEN": key(s3, nil, "", 0),
			"OPENAI_API_KEY":    key([]string{"api.openai.com"}, nil, "sk-", 0),
			"GH_TOKEN":          key([]string{"api.github.com"}, nil, "", 0),
		}},
		// Another project's aws key with the default prefix.
		"beta": {Keys: map[string]config.KeyPolicy{
			"DEPLOY_B": {Kind: KindAWS, Domains: s3, AWS: &config.AWSKey{Regions: []string{"us-east-1"}, Services: []string{"s3"}}},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	type refusal struct{ key, why string }
	for name, tc := range map[string]struct {
		declare []string // project/KEY, in order
		granted []string
		refused []refusal
	}{
		"one aws key":          {[]string{"acme/DEPLOY"}, []string{"acme/DEPLOY"}, nil},
		"one envPrefix, twice": {[]string{"acme/DEPLOY", "acme/READER"}, []string{"acme/DEPLOY"}, []refusal{{"acme/READER", "it would set AWS_ACCESS_KEY_ID, which key acme/DEPLOY sets for the task too; give one of them its own aws.envPrefix in the host policy, or declare only one"}}},
		"the other order":      {[]string{"acme/READER", "acme/DEPLOY"}, []string{"acme/READER"}, []refusal{{"acme/DEPLOY", "it would set AWS_ACCESS_KEY_ID, which key acme/READER sets"}}},
		"across projects":      {[]string{"beta/DEPLOY_B", "acme/DEPLOY"}, []string{"beta/DEPLOY_B"}, []refusal{{"acme/DEPLOY", "which key beta/DEPLOY_B sets"}}},
		"own envPrefixes":      {[]string{"acme/DEPLOY", "acme/BACKUP"}, []string{"acme/DEPLOY", "acme/BACKUP"}, nil},
		"three, one clashing": {[]string{"acme/DEPLOY", "acme/BACKUP", "acme/READER"}, []string{"acme/DEPLOY", "acme/BACKUP"},
			[]refusal{{"acme/READER", "which key acme/DEPLOY sets"}}},
		"aws key, then a plain key named like its variable": {[]string{"acme/DEPLOY", "acme/AWS_ACCESS_KEY_ID"}, []string{"acme/DEPLOY"},
			[]refusal{{"acme/AWS_ACCESS_KEY_ID", "it would set AWS_ACCESS_KEY_ID, which key acme/DEPLOY sets"}}},
		"plain key named like a variable, then the aws key": {[]string{"acme/AWS_SESSION_TOKEN", "acme/DEPLOY"}, []string{"acme/AWS_SESSION_TOKEN"},
			[]refusal{{"acme/DEPLOY", "it would set AWS_SESSION_TOKEN, which key acme/AWS_SESSION_TOKEN sets"}}},
		"plain key named like another prefix's variable": {[]string{"acme/BACKUP", "acme/AWS_ACCESS_KEY_ID"}, []string{"acme/BACKUP", "acme/AWS_ACCESS_KEY_ID"}, nil},
		"plain keys alone": {[]string{"acme/OPENAI_API_KEY", "acme/AWS_ACCESS_KEY_ID", "acme/GH_TOKEN", "acme/AWS_SESSION_TOKEN"},
			[]string{"acme/OPENAI_API_KEY", "acme/AWS_ACCESS_KEY_ID", "acme/GH_TOKEN", "acme/AWS_SESSION_TOKEN"}, nil},
		"plain keys next to an aws key": {[]string{"acme/OPENAI_API_KEY", "acme/DEPLOY", "acme/GH_TOKEN"}, []string{"acme/OPENAI_API_KEY", "acme/DEPLOY", "acme/GH_TOKEN"}, nil},
	} {
		var secrets []runspec.Secret
		for _, d := range tc.declare {
			project, k, _ := strings.Cut(d, "/")
			dom := s3
			if k == "OPENAI_API_KEY" || k == "GH_TOKEN" {
				k, _ := p.Key(KeyRef{project, k})
				dom = []string{k.Domains[0].String()}
			}
			secrets = append(secrets, runspec.Secret{ProjectID: project, Key: k, Domains: dom})
		}
		declared, err := runspec.Request{Agent: "shell", Secrets: secrets}.Declare()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		granted, refused := p.Grant(declared)
		var gotGranted []string
		for _, g := range granted {
			gotGranted = append(gotGranted, g.Ref.String())
			if k, _ := p.Key(g.Ref); (g.AWS != nil) != (k.Kind == KindAWS) || g.AWS != k.AWS {
				t.Errorf("%s: %s granted with aws %v, the key's is %v", name, g.Ref, g.AWS, k.AWS)
			}
		}
		if !slices.Equal(gotGranted, tc.granted) {
			t.Errorf("%s: granted %v, want %v", name, gotGranted, tc.granted)
		}
		if len(refused) != len(tc.refused) {
			t.Errorf("%s: refused %v, want %v", name, refused, tc.refused)
			continue
		}
		for i, r := range tc.refused {
			if refused[i].Ref.String() != r.key || !strings.Contains(refused[i].Reason, r.why) {
				t.Errorf("%s: refused %v, want %s: %q", name, refused[i], r.key, r.why)
			}
		}
	}

	// A key refused for its domain sets nothing: it does not block the
	// next key that would have clashed with it.
	granted, refused := p.Grant([]runspec.Declared{
		{ProjectID: "acme", Key: "DEPLOY", Domains: []Domain{{Name: "s3.eu-west-1.amazonaws.com", Port: 443}}},
		{ProjectID: "acme", Key: "READER", Domains: []Domain{{Name: "s3.us-east-1.amazonaws.com", Port: 443}}},
	})
	if len(granted) != 1 || granted[0].Ref.Key != "READER" || len(refused) != 1 || !strings.Contains(refused[0].Reason, "may not reach s3.eu-west-1.amazonaws.com") {
		t.Errorf("granted %v refused %v", granted, refused)
	}
}
