// Package config owns edge's configuration file: its JSON shape (the names in
// DESIGN.md, which operators and tests rely on), its defaults and its
// validation. It holds wire types only; the policy section is compiled and
// checked by package policy, and edge/host maps every other section onto
// its component's Config. A default that a component applies is that
// component's constant, named here (runner, ca, secrets, audit, ledger,
// upstream); this package imports them, and they never import it.
package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/ca"
	"github.com/runfleet/runfleet/edge/ledger"
	"github.com/runfleet/runfleet/edge/runner"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/edge/upstream"
)

// Duration is a time.Duration written as a Go duration string ("24h", "90s").
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalJSON writes the Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration must be a string such as \"90s\" or \"24h\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("invalid duration %q", s)
	}
	*d = Duration(v)
	return nil
}

// Bytes is a size in bytes, written as a number or as a string with a unit:
// "512MiB", "2GiB", "1.5GiB" (binary: KiB, MiB, GiB, TiB) or "500MB"
// (decimal: kB, MB, GB, TB).
type Bytes int64

// byteUnits are the units Bytes accepts, longest first so "MiB" is not read
// as "B" after "Mi".
var byteUnits = []struct {
	suffix string
	size   float64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"kB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
}

// UnmarshalJSON reads a number of bytes or a size string.
func (b *Bytes) UnmarshalJSON(data []byte) error {
	var n int64
	if err := json.Unmarshal(data, &n); err == nil {
		*b = Bytes(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("a size must be a number of bytes or a string such as \"2GiB\"")
	}
	v, err := parseBytes(s)
	if err != nil {
		return err
	}
	*b = v
	return nil
}

func parseBytes(s string) (Bytes, error) {
	num, scale := strings.TrimSpace(s), 1.0
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(num, u.suffix); ok {
			num, scale = strings.TrimSpace(rest), u.size
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 || f*scale > math.MaxInt64 {
		return 0, fmt.Errorf("invalid size %q: write a number of bytes or a number with a unit (KiB, MiB, GiB, TiB, kB, MB, GB, TB)", s)
	}
	return Bytes(f * scale), nil
}

// Limits is runner.limits: each task's resource limits, or "none".
type Limits struct {
	// None is runner.limits: "none": tasks are bounded only by the host.
	// Only an explicit "none" turns limits off.
	None bool `json:"-"`
	// Memory per task; default runner.DefaultLimitMemoryBytes.
	Memory Bytes `json:"memory,omitempty"`
	// Pids: processes and threads per task at once; default
	// runner.DefaultLimitPids.
	Pids int64 `json:"pids,omitempty"`
	// CPU per task, in cores; default runner.DefaultLimitCPU.
	CPU float64 `json:"cpu,omitempty"`
}

// UnmarshalJSON reads "none" or an object of limits.
func (l *Limits) UnmarshalJSON(data []byte) error {
	var ps Problems
	l.decodeAt(data, nil, &ps)
	return ps.Err()
}

// decodeAt is UnmarshalJSON naming each problem by its path below at.
func (l *Limits) decodeAt(raw []byte, at Path, ps *Problems) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s != runner.LimitsNone {
			ps.add(at, "must be %q or an object with memory, pids and cpu, not %q", runner.LimitsNone, s)
			return
		}
		*l = Limits{None: true}
		return
	}
	// Strict like Parse: a misspelt limit must not quietly take its
	// default.
	type plain Limits
	var p plain
	decodeValue(raw, reflect.ValueOf(&p).Elem(), at, ps)
	*l = Limits(p)
}

// MarshalJSON writes "none" or the object.
func (l Limits) MarshalJSON() ([]byte, error) {
	if l.None {
		return json.Marshal(runner.LimitsNone)
	}
	type plain Limits
	return json.Marshal(plain(l))
}

// Config is edge.json. A zero field takes the default that Defaults documents.
type Config struct {
	// DataDir holds everything edge keeps (created 0700). Required.
	DataDir string  `json:"dataDir"`
	API     API     `json:"api"`
	Proxy   Proxy   `json:"proxy"`
	CA      CA      `json:"ca"`
	Policy  Policy  `json:"policy"`
	Secrets Secrets `json:"secrets"`
	// Agents is the agent table: name -> how to start it.
	Agents map[string]Agent `json:"agents"`
	Runner Runner           `json:"runner"`

	// path is the file this was loaded from; relative paths resolve against its directory.
	path string
}

// API is the host API Fleet calls.
type API struct {
	// Listen is the host API address; default DefaultAPIListen.
	Listen string `json:"listen"`
	// TokenFile holds the bearer token Fleet presents. Required.
	TokenFile string `json:"tokenFile"`
	// TLS serves the host API over TLS when both files are set.
	TLS TLS `json:"tls"`
}

// TLS names a certificate and key in PEM files.
type TLS struct {
	CertFile string `json:"certFile"`
	KeyFile  string `json:"keyFile"`
}

// Enabled reports whether both files are set.
func (t TLS) Enabled() bool { return t.CertFile != "" && t.KeyFile != "" }

// Egress modes for CONNECTs the policy does not intercept.
const (
	EgressOpen   = "open"
	EgressStrict = "strict"
)

// The defaults that are edge.json's own: every other default is named by
// the component that applies it (runner, ca, secrets, audit, upstream).
const (
	// DefaultAPIListen is api.listen's default: loopback only, so the host
	// API needs no TLS.
	DefaultAPIListen = "127.0.0.1:7070"
	// DefaultProxyListen is proxy.listen's default (loopback only, as
	// Validate requires).
	DefaultProxyListen = "127.0.0.1:7071"
	// DefaultProxyEgress is proxy.egress's default: a connection no key
	// intercepts is tunnelled through the upstream guard. A proxy.Config
	// whose Egress is empty refuses it instead: only edge.json opens it.
	DefaultProxyEgress = EgressOpen
)

// Proxy is the secrets proxy.
type Proxy struct {
	// Listen is the proxy's address; default DefaultProxyListen.
	Listen string `json:"listen"`
	// Egress is "open" (tunnel what is not intercepted, but for a run
	// holding a url or body key, which has it intercepted to scrub its
	// answers: policy.DecideConnect; DefaultProxyEgress) or "strict"
	// (refuse it).
	Egress   string   `json:"egress"`
	Upstream Upstream `json:"upstream"`
	Audit    Audit    `json:"audit"`
	Ledger   Ledger   `json:"ledger"`
	// Pprof, when set, serves net/http/pprof for the whole edge process on
	// this address (loopback only; off by default), with mutex and block
	// profiling on: for profiling the proxy under load.
	Pprof string `json:"pprof"`
}

// Upstream governs how the proxy reaches the real servers.
type Upstream struct {
	// Resolver is upstream.ResolverUplink, "uplink" (the default,
	// upstream.DefaultResolver: resolv.conf's servers that are not on this
	// host, never the hosts file), or upstream.ResolverSystem, "system".
	Resolver string `json:"resolver"`
	// Resolve pins names to addresses, ahead of the resolver (tests, demos).
	Resolve map[string]string `json:"resolve"`
	// AllowPrivate lists CIDRs the upstream guard lets through although they
	// are loopback, private, link-local or otherwise internal. Empty by default.
	AllowPrivate []string `json:"allowPrivate"`
	// ExtraRootsFile adds PEM roots to the system roots for upstream TLS.
	ExtraRootsFile string `json:"extraRootsFile"`
}

// Audit is the proxy's decision log under <dataDir>/logs.
type Audit struct {
	// MaxBytes rotates the audit file past this size; default
	// audit.DefaultMaxBytes.
	MaxBytes int64 `json:"maxBytes"`
	// Keep is how many rotated files are kept; default audit.DefaultKeep.
	Keep int `json:"keep"`
}

// Ledger is each run's egress ledger, kept in the run log with the run.
type Ledger struct {
	// MaxRecords is how many records a run's ledger keeps; past it a
	// record is counted, not kept, and one record at the run's end says
	// how many were not. Default ledger.DefaultMaxRecords; at most
	// MaxLedgerRecords.
	MaxRecords int `json:"maxRecords"`
}

// MaxLedgerRecords bounds proxy.ledger.maxRecords: a few hundred MiB of a
// run's records in the run log, about a hundred times the default.
const MaxLedgerRecords = 1_000_000

// CA is the proxy's certificate authority.
type CA struct {
	// Lifetime of each CA certificate; default ca.DefaultLifetime.
	Lifetime Duration `json:"lifetime"`
	// SuccessorWindow: a successor is minted this long before the signer
	// ends; default ca.DefaultSuccessorWindow.
	SuccessorWindow Duration `json:"successorWindow"`
	// SwitchBefore: the signer switches to the successor this long before
	// its end; default ca.DefaultSwitchBefore.
	SwitchBefore Duration `json:"switchBefore"`
	// LeafLifetime of a leaf, never past the signer's end; default
	// ca.DefaultLeafLifetime.
	LeafLifetime Duration `json:"leafLifetime"`
	// SealKeyFile holds the AES-256 key sealing the CA keys; default <dataDir>/seal.key, made 0600.
	SealKeyFile string `json:"sealKeyFile"`
	// KMSKeyID, when set, seals with AWS KMS (envelope encryption) instead of SealKeyFile.
	KMSKeyID string `json:"kmsKeyId"`
}

// Policy is the host's secrets policy as written; package policy compiles it.
type Policy struct {
	Projects map[string]ProjectPolicy `json:"projects"`
}

// ProjectPolicy lists the keys a project may proxy.
type ProjectPolicy struct {
	Keys map[string]KeyPolicy `json:"keys"`
}

// KeyPolicy is what one key may reach and where it may be substituted.
type KeyPolicy struct {
	// Kind is what the key is: "" for a value sent as it is (a token, a
	// password), "aws" for an AWS access key, which never travels: the
	// proxy re-signs the task's SigV4 requests with it (AWS); "ssh" for an
	// SSH private key, which never travels either: edge terminates the
	// task's SSH and runs the git commands SSH allows upstream with it.
	Kind string `json:"kind,omitempty"`
	// Domains the key may reach: "name" (port 443) or "name:port".
	Domains []string `json:"domains"`
	// Source is where the key's real value comes from: empty (the
	// default) for the host's secrets source (Secrets), or "fleet" for
	// the value Fleet mints for each run and sends with its start (and
	// again before it expires), which edge holds in memory for that run
	// alone and never reads from its own sources. Only for a key of no
	// kind: an aws or ssh key never sends its value.
	Source string `json:"source,omitempty"`
	// In lists where substitution happens: "header" (the default), "url",
	// "body". Not for kind "aws".
	In []string `json:"in,omitempty"`
	// Placeholder shapes the task's placeholder. Not for kind "aws", whose
	// placeholders have the shapes of real AWS credentials.
	Placeholder PlaceholderShape `json:"placeholder"`
	// AWS bounds a key of kind "aws"; required for that kind only.
	AWS *AWSKey `json:"aws,omitempty"`
	// SSH bounds a key of kind "ssh"; required for that kind only.
	SSH *SSHKey `json:"ssh,omitempty"`
	// Rules decide the HTTPS requests that carry the key (its placeholder,
	// or for kind "aws" its signature), in order, the first that matches
	// deciding; none for a key of kind "ssh", whose ssh.allow rules its
	// commands. Nil: every request the key may reach goes.
	Rules []Rule `json:"rules,omitempty"`
	// Default decides a request no rule matches: "allow" (the default) or
	// "deny".
	Default string `json:"default,omitempty"`
	// Mode is "enforce" (the default: a request the rules refuse is
	// refused) or "warn" (it goes, audited "warned" with the rule that
	// would have refused it: to learn a policy before enforcing it).
	Mode string `json:"mode,omitempty"`
}

// Rule is one request rule: exactly one of Allow and Deny.
type Rule struct {
	Allow *RuleMatch `json:"allow,omitempty"`
	Deny  *RuleMatch `json:"deny,omitempty"`
}

// RuleMatch is what a rule matches: a request whose method is one of
// Methods and whose path matches one of Paths. An absent (nil) list
// matches any; an empty one matches nothing, which the policy refuses.
type RuleMatch struct {
	// Methods are HTTP methods, matched in upper case.
	Methods []string `json:"methods,omitempty"`
	// Paths are patterns starting with "/": segments split on "/", "*" a
	// whole segment of any text, "**" any number of segments (none
	// included); matched case-insensitively against the path as sent,
	// percent-decoded (package policy, rules.go).
	Paths []string `json:"paths,omitempty"`
}

// SSHKey bounds what an SSH key may run upstream. Its real value, in the
// secrets source, is the private key (OpenSSH or PEM; ed25519, ECDSA or
// RSA; unencrypted).
type SSHKey struct {
	// User is the upstream login; default "git".
	User string `json:"user,omitempty"`
	// KnownHosts are the upstreams' host keys in known_hosts form (one
	// line each, or whole files' text): an upstream whose key is not
	// listed for its name is refused. Required.
	KnownHosts []string `json:"knownHosts"`
	// Allow lists the commands the key may run: git-upload-pack (fetch,
	// clone), git-receive-pack (push), git-upload-archive,
	// git-lfs-authenticate. Required.
	Allow []string `json:"allow"`
	// Repositories, when set, are the path patterns ("org/repo",
	// "org/*", "group/**") a command's repository must match.
	Repositories []string `json:"repositories,omitempty"`
}

// AWSKey bounds what an AWS key may sign and says where its real
// credentials come from: the secrets source's value for the key (JSON
// {"accessKeyId", "secretAccessKey", "sessionToken"?}), or AssumeRole.
type AWSKey struct {
	// Regions and Services bound the credential scopes the proxy signs for
	// ("us-east-1"; "s3", "sts", "dynamodb"). Both required.
	Regions  []string `json:"regions"`
	Services []string `json:"services"`
	// EnvPrefix names the task's variables: <prefix>ACCESS_KEY_ID,
	// <prefix>SECRET_ACCESS_KEY and <prefix>SESSION_TOKEN; default "AWS_",
	// the names every AWS tool reads. Two keys a task is granted must not
	// share it.
	EnvPrefix string `json:"envPrefix,omitempty"`
	// AssumeRole, when set, makes the real credentials a per-run STS
	// session of the role, minted with edge's own AWS credentials.
	AssumeRole *AssumeRole `json:"assumeRole,omitempty"`
}

// AssumeRole is the role a key's runs each get their own session of.
type AssumeRole struct {
	RoleARN    string `json:"roleArn"`
	ExternalID string `json:"externalId,omitempty"`
	// SessionPolicy, a JSON IAM policy, narrows the session below the role.
	SessionPolicy json.RawMessage `json:"sessionPolicy,omitempty"`
	// Duration of each session, 15m to 12h; default 1h. A session is
	// renewed before it ends while its run lives.
	Duration Duration `json:"duration,omitempty"`
}

// PlaceholderShape shapes a key's placeholders.
type PlaceholderShape struct {
	// Prefix starts every placeholder (e.g. "sk-").
	Prefix string `json:"prefix"`
	// Length is the whole placeholder's length, prefix included; default 48.
	Length int `json:"length"`
}

// Secrets is where real values come from: a file, or AWS Secrets Manager.
type Secrets struct {
	// File is a JSON map {"<project>/<KEY>": "<value>"}, re-read when it changes.
	File              string             `json:"file"`
	AWSSecretsManager *AWSSecretsManager `json:"awsSecretsManager,omitempty"`
}

// AWSSecretsManager reads a value from the secret "<prefix><project>/<KEY>".
type AWSSecretsManager struct {
	Prefix string `json:"prefix"`
	// CacheTTL bounds how long a value is reused; default
	// secrets.DefaultCacheTTL.
	CacheTTL Duration `json:"cacheTtl"`
}

// Agent is one entry of the agent table.
type Agent struct {
	// Argv starts the agent; an element "{prompt}" becomes the prompt, as one argument.
	Argv []string `json:"argv"`
	// Env adds fixed variables to the task's env.
	Env map[string]string `json:"env,omitempty"`
}

// Runner governs task processes.
type Runner struct {
	// User runs tasks; default runner.DefaultUser. Never edge's own uid.
	User string `json:"user"`
	// InsecureSameUser lets tasks run as edge's own user where edge cannot
	// switch users. Off by default; /healthz reports it. Tasks that run as
	// edge cannot be confined, so it needs Egress insecureOpen too.
	InsecureSameUser bool `json:"insecureSameUser"`
	// Egress is runner.TaskEgressConfined, "confined" (each task in a
	// network of its own whose one way off its loopback is edge; the
	// default: edge refuses to start where it cannot make one), or
	// runner.TaskEgressInsecureOpen, "insecureOpen" (tasks reach the
	// network, the cloud metadata service included). /healthz reports
	// egressConfined.
	Egress string `json:"egress"`
	// Roots are the directories a localPath must lie under.
	Roots []string `json:"roots"`
	// WorkDir holds fresh and cloned working dirs; default <dataDir>/work.
	WorkDir string `json:"workDir"`
	// MaxConcurrent runs at once; default runner.DefaultMaxConcurrent.
	MaxConcurrent int `json:"maxConcurrent"`
	// MaxDuration of one attempt; default runner.DefaultMaxDuration.
	MaxDuration Duration `json:"maxDuration"`
	// MaxOutputBytes of one run's output; default
	// runner.DefaultMaxOutputBytes.
	MaxOutputBytes int64 `json:"maxOutputBytes"`
	// DrainTimeout bounds the wait for idle on SIGTERM; default
	// runner.DefaultDrainTimeout.
	DrainTimeout Duration `json:"drainTimeout"`
	// Retention: a run is purged this long after it ends; default
	// runner.DefaultRetention.
	Retention Duration `json:"retention"`
	// CancelGrace between SIGTERM and SIGKILL on cancel; default
	// runner.DefaultCancelGrace.
	CancelGrace Duration `json:"cancelGrace"`
	// Limits bound each task's memory, processes and CPU through a control
	// group of its own; "none" turns them off. A host that cannot enforce
	// them refuses tasks unless they are "none".
	Limits Limits `json:"limits"`
	// MinFreeBytes is the data dir's reserve, in bytes: with less free
	// space, admission refuses new runs (host_storage_low), and a running
	// run's output stops being recorded (storage_full) before the space
	// kept for recording runs' ends is touched. Default
	// runner.DefaultMinFreeBytes; at least runner.MinMinFreeBytes. There is
	// no "off": a reserve is what lets a full disk end runs with a reason
	// instead of losing them.
	MinFreeBytes Bytes `json:"minFreeBytes"`
}

// Load reads, defaults and validates the config at path. Its error names
// the file and lists every problem found (Problems).
func Load(path string) (*Config, error) {
	c, ps := Read(path)
	if len(ps) > 0 {
		return nil, fmt.Errorf("config %s: %w", path, ps)
	}
	return c, nil
}

// Read reads, defaults and validates the config at path as Load does, and
// returns every problem found rather than failing: a field that cannot be
// decoded keeps its default, so every other field is still checked. The
// config is nil only when the file cannot be read or is not JSON; with
// problems, it is what could be read, for further checks that name their
// own fields.
func Read(path string) (*Config, Problems) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, Problems{{Msg: err.Error()}}
	}
	c := new(Config)
	ps := decodeStrict(b, c)
	if len(ps) > 0 && ps[0].Path == "" {
		return nil, ps
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, append(ps, Problem{Msg: err.Error()})
	}
	c.path = abs
	c.resolvePaths(filepath.Dir(abs))
	c.Defaults()
	// A field that did not decode is at its default, which may itself be
	// refused (dataDir ""): it is named once, for what was written.
	decoded := map[string]bool{}
	for _, p := range ps {
		decoded[p.Path] = true
	}
	for _, p := range c.problems() {
		if !decoded[p.Path] {
			ps = append(ps, p)
		}
	}
	return c, ps
}

// Parse decodes a config strictly: an unknown field, a key given twice or
// a value of the wrong type is an error naming it (every one found:
// Problems), since a misspelt security setting must not silently take its
// default.
func Parse(b []byte) (*Config, error) {
	var c Config
	if ps := decodeStrict(b, &c); len(ps) > 0 {
		return nil, ps
	}
	return &c, nil
}

// Path is the absolute path the config was loaded from, or "".
func (c *Config) Path() string { return c.path }

func (c *Config) resolvePaths(dir string) {
	abs := func(p *string) {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
	abs(&c.DataDir)
	abs(&c.API.TokenFile)
	abs(&c.API.TLS.CertFile)
	abs(&c.API.TLS.KeyFile)
	abs(&c.Proxy.Upstream.ExtraRootsFile)
	abs(&c.CA.SealKeyFile)
	abs(&c.Secrets.File)
	abs(&c.Runner.WorkDir)
	for i := range c.Runner.Roots {
		abs(&c.Runner.Roots[i])
	}
}

// Defaults fills every zero field with its documented default.
func (c *Config) Defaults() {
	setS := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	setD := func(p *Duration, v time.Duration) {
		if *p == 0 {
			*p = Duration(v)
		}
	}
	setS(&c.API.Listen, DefaultAPIListen)
	setS(&c.Proxy.Listen, DefaultProxyListen)
	setS(&c.Proxy.Egress, DefaultProxyEgress)
	setS(&c.Proxy.Upstream.Resolver, upstream.DefaultResolver)
	if c.Proxy.Audit.MaxBytes == 0 {
		c.Proxy.Audit.MaxBytes = audit.DefaultMaxBytes
	}
	if c.Proxy.Audit.Keep == 0 {
		c.Proxy.Audit.Keep = audit.DefaultKeep
	}
	if c.Proxy.Ledger.MaxRecords == 0 {
		c.Proxy.Ledger.MaxRecords = ledger.DefaultMaxRecords
	}
	setD(&c.CA.Lifetime, ca.DefaultLifetime)
	setD(&c.CA.SuccessorWindow, ca.DefaultSuccessorWindow)
	setD(&c.CA.SwitchBefore, ca.DefaultSwitchBefore)
	setD(&c.CA.LeafLifetime, ca.DefaultLeafLifetime)
	if c.DataDir != "" {
		setS(&c.CA.SealKeyFile, filepath.Join(c.DataDir, "seal.key"))
		setS(&c.Runner.WorkDir, filepath.Join(c.DataDir, "work"))
	}
	if c.Secrets.AWSSecretsManager != nil {
		setD(&c.Secrets.AWSSecretsManager.CacheTTL, secrets.DefaultCacheTTL)
	}
	setS(&c.Runner.User, runner.DefaultUser)
	setS(&c.Runner.Egress, runner.DefaultEgress)
	if c.Runner.MaxConcurrent == 0 {
		c.Runner.MaxConcurrent = runner.DefaultMaxConcurrent
	}
	setD(&c.Runner.MaxDuration, runner.DefaultMaxDuration)
	if c.Runner.MaxOutputBytes == 0 {
		c.Runner.MaxOutputBytes = runner.DefaultMaxOutputBytes
	}
	setD(&c.Runner.DrainTimeout, runner.DefaultDrainTimeout)
	setD(&c.Runner.Retention, runner.DefaultRetention)
	setD(&c.Runner.CancelGrace, runner.DefaultCancelGrace)
	if !c.Runner.Limits.None {
		if c.Runner.Limits.Memory == 0 {
			c.Runner.Limits.Memory = runner.DefaultLimitMemoryBytes
		}
		if c.Runner.Limits.Pids == 0 {
			c.Runner.Limits.Pids = runner.DefaultLimitPids
		}
		if c.Runner.Limits.CPU == 0 {
			c.Runner.Limits.CPU = runner.DefaultLimitCPU
		}
	}
	if c.Runner.MinFreeBytes == 0 {
		c.Runner.MinFreeBytes = runner.DefaultMinFreeBytes
	}
}

// loopback reports whether a listen address (host:port) binds this host's
// loopback interface only: an IP in 127.0.0.0/8 or ::1 (an IPv4-mapped
// form too), or "localhost". An empty host or an unspecified address
// (0.0.0.0, ::) binds every interface.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// Validate checks everything but the policy section (package policy owns
// that) and what lies outside the file (edge/host checks the files it
// names): every problem, each naming its field (Problems).
func (c *Config) Validate() error { return c.problems().Err() }

func (c *Config) problems() Problems {
	var ps Problems
	bad := func(field, format string, args ...any) {
		ps = append(ps, Problem{Path: field, Msg: fmt.Sprintf(format, args...)})
	}
	if c.DataDir == "" {
		bad("dataDir", "is required")
	}
	if _, _, err := net.SplitHostPort(c.API.Listen); err != nil {
		bad("api.listen", "%q is not host:port", c.API.Listen)
	} else if !loopback(c.API.Listen) && !c.API.TLS.Enabled() {
		bad("api.listen", "%q is not a loopback address and api.tls is not set: the host token would cross the network in cleartext; set api.tls.certFile and api.tls.keyFile, or listen on 127.0.0.1", c.API.Listen)
	}
	if c.API.TokenFile == "" {
		bad("api.tokenFile", "is required")
	}
	switch t := c.API.TLS; {
	case t.CertFile != "" && t.KeyFile == "":
		bad("api.tls.keyFile", "is required with api.tls.certFile")
	case t.CertFile == "" && t.KeyFile != "":
		bad("api.tls.certFile", "is required with api.tls.keyFile")
	}
	// Tasks send their proxy credential in Basic form, in the clear: the
	// proxy must never be reachable off this host.
	if _, _, err := net.SplitHostPort(c.Proxy.Listen); err != nil {
		bad("proxy.listen", "%q is not host:port", c.Proxy.Listen)
	} else if !loopback(c.Proxy.Listen) {
		bad("proxy.listen", "%q is not a loopback address: tasks send their proxy credentials to it in cleartext, so it must listen on 127.0.0.1 or [::1] only", c.Proxy.Listen)
	}
	if c.Proxy.Egress != EgressOpen && c.Proxy.Egress != EgressStrict {
		bad("proxy.egress", "must be %q or %q, not %q", EgressOpen, EgressStrict, c.Proxy.Egress)
	}
	u := c.Proxy.Upstream
	if u.Resolver != upstream.ResolverUplink && u.Resolver != upstream.ResolverSystem {
		bad("proxy.upstream.resolver", "must be %q or %q, not %q", upstream.ResolverUplink, upstream.ResolverSystem, u.Resolver)
	}
	// Parsed as upstream.NewResolver and upstream.ParseAllowPrivate parse
	// them, so what passes here passes there.
	for _, name := range slices.Sorted(maps.Keys(u.Resolve)) {
		if _, err := netip.ParseAddr(u.Resolve[name]); err != nil {
			ps.add(Path{"proxy", "upstream", "resolve", name}, "%q is not an IP address", u.Resolve[name])
		}
	}
	for i, cidr := range u.AllowPrivate {
		if _, err := netip.ParsePrefix(cidr); err != nil {
			ps.add(Path{"proxy", "upstream", "allowPrivate"}.Index(i), "%q is not a CIDR such as 10.0.0.0/8", cidr)
		}
	}
	if c.Proxy.Audit.MaxBytes < 0 {
		bad("proxy.audit.maxBytes", "must not be negative")
	}
	if c.Proxy.Audit.Keep < 0 {
		bad("proxy.audit.keep", "must not be negative")
	}
	if n := c.Proxy.Ledger.MaxRecords; n < 1 || n > MaxLedgerRecords {
		bad("proxy.ledger.maxRecords", "must be from 1 to %d, not %d (leave it unset for the default, %d)", MaxLedgerRecords, n, ledger.DefaultMaxRecords)
	}
	if c.Proxy.Pprof != "" && !loopback(c.Proxy.Pprof) {
		bad("proxy.pprof", "%q is not a loopback address: profiles show edge's internals, so it must listen on 127.0.0.1 or [::1] only", c.Proxy.Pprof)
	}
	for _, d := range []struct {
		field string
		d     Duration
	}{
		{"ca.lifetime", c.CA.Lifetime}, {"ca.successorWindow", c.CA.SuccessorWindow},
		{"ca.switchBefore", c.CA.SwitchBefore}, {"ca.leafLifetime", c.CA.LeafLifetime},
	} {
		if d.d.D() <= 0 {
			bad(d.field, "must be positive")
		}
	}
	if c.CA.SuccessorWindow.D() >= c.CA.Lifetime.D() {
		bad("ca.successorWindow", "must be shorter than ca.lifetime")
	}
	if c.CA.SwitchBefore.D() >= c.CA.SuccessorWindow.D() {
		bad("ca.switchBefore", "must be shorter than ca.successorWindow")
	}
	if c.Secrets.File != "" && c.Secrets.AWSSecretsManager != nil {
		bad("secrets", "set file or awsSecretsManager, not both")
	}
	if sm := c.Secrets.AWSSecretsManager; sm != nil && sm.CacheTTL.D() < 0 {
		bad("secrets.awsSecretsManager.cacheTtl", "must be positive")
	}
	for _, name := range slices.Sorted(maps.Keys(c.Agents)) {
		if len(c.Agents[name].Argv) == 0 {
			ps.add(Path{"agents", name, "argv"}, "is required")
		}
	}
	if c.Runner.User == "" && !c.Runner.InsecureSameUser {
		bad("runner.user", "is required")
	}
	if e := c.Runner.Egress; e != runner.TaskEgressConfined && e != runner.TaskEgressInsecureOpen {
		bad("runner.egress", "must be %q or %q, not %q", runner.TaskEgressConfined, runner.TaskEgressInsecureOpen, e)
	}
	for i, r := range c.Runner.Roots {
		if !filepath.IsAbs(r) {
			ps.add(Path{"runner", "roots"}.Index(i), "%q must be absolute", r)
		}
	}
	if c.Runner.MaxConcurrent < 0 {
		bad("runner.maxConcurrent", "must not be negative")
	}
	if c.Runner.MaxOutputBytes < 0 {
		bad("runner.maxOutputBytes", "must not be negative")
	}
	for _, d := range []struct {
		field string
		d     Duration
	}{
		{"runner.maxDuration", c.Runner.MaxDuration}, {"runner.drainTimeout", c.Runner.DrainTimeout},
		{"runner.retention", c.Runner.Retention}, {"runner.cancelGrace", c.Runner.CancelGrace},
	} {
		if d.d.D() <= 0 {
			bad(d.field, "must be positive")
		}
	}
	if l := c.Runner.Limits; !l.None {
		switch {
		case l.Memory < 0:
			bad("runner.limits.memory", "must not be negative")
		case l.Memory > 0 && l.Memory < 16<<20:
			bad("runner.limits.memory", "%d bytes is too little to start a task; give at least 16MiB", l.Memory)
		}
		switch {
		case l.Pids < 0:
			bad("runner.limits.pids", "must not be negative")
		case l.Pids > 0 && l.Pids < 8:
			bad("runner.limits.pids", "%d is too few to start a task; give at least 8", l.Pids)
		}
		switch {
		case l.CPU < 0 || math.IsNaN(l.CPU) || math.IsInf(l.CPU, 0):
			bad("runner.limits.cpu", "must be a positive number of cores")
		case l.CPU > 0 && l.CPU < 0.01:
			bad("runner.limits.cpu", "%g cores is under the kernel's minimum; give at least 0.01", l.CPU)
		}
	}
	if n := c.Runner.MinFreeBytes; n < runner.MinMinFreeBytes {
		bad("runner.minFreeBytes", "%d is under the smallest reserve, %d bytes (1 MiB): the reserve keeps room to record runs' ends when the data dir fills; leave it unset for the default (1 GiB)", n, runner.MinMinFreeBytes)
	}
	return ps
}
