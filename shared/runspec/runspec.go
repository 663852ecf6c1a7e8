// Package runspec owns the run request: what one run asks of a host (its
// agent, a prompt or argv, the repository or local path it works in, its
// env, the secrets it declares and by when it must start), and the one
// validation of it that Fleet's dispatch and edge's host API both apply, so
// a caller of either meets the same rules, worded the same way.
//
// Each side adds only what is its own: Fleet the routing fields (host,
// labels), its idempotency and the caller's scope; edge its agent table, its
// roots and its policy. The stored forms (Fleet's idempotency hash, edge's
// run log record) are kept apart from this type, each mapped in one place,
// so a change here is never a data migration (DESIGN.md, section "The run
// request").
package runspec

import (
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/runfleet/runfleet/shared/netname"
)

// Request is what a run asks. Its JSON is the shape both APIs carry: Fleet's
// dispatch body holds its caller fields (not Deadline or CloneURL, which
// Fleet sets), and the host protocol's start request holds all of it. An
// empty field is absent.
type Request struct {
	// Deadline, when set, refuses a start arriving after it
	// (deadline_passed): Fleet sets it to the end of its host call.
	Deadline *time.Time `json:"deadline,omitempty"`
	// Agent names an entry of the host's agent table.
	Agent string `json:"agent"`
	// Prompt replaces {prompt} inside the agent's argv, as one argument.
	Prompt string `json:"prompt,omitempty"`
	// Argv is appended to the agent's argv.
	Argv []string `json:"argv,omitempty"`
	// Repository is what the run works on: cloned into its work dir (from
	// CloneURL when set, else from Repository itself) unless LocalPath is
	// given. A dispatch may name both Repository and LocalPath: a host that
	// has the path works in it, one that lacks it clones the repository
	// from Fleet's repository map.
	Repository string `json:"repository,omitempty"`
	// CloneURL is where Repository is cloned from; Fleet sets it from its
	// repository map.
	CloneURL string `json:"cloneUrl,omitempty"`
	// LocalPath is a directory of the host to work in, absolute.
	LocalPath string `json:"localPath,omitempty"`
	// Env is added to the task's env.
	Env map[string]string `json:"env,omitempty"`
	// Secrets are the keys the run uses through the secrets proxy.
	Secrets []Secret `json:"secrets,omitempty"`
}

// Secret declares one key a run needs: the host grants it when its policy
// has projectId/key for every domain declared, and the task gets a
// placeholder for it in the variable named key.
type Secret struct {
	ProjectID string   `json:"projectId"`
	Key       string   `json:"key"`
	Domains   []string `json:"domains"`
}

// Declared is a secret as a host's policy grants from it: its domains
// canonical (netname), duplicates dropped, in the order declared.
type Declared struct {
	ProjectID string
	Key       string
	Domains   []netname.Domain
}

// What a run request may hold. Fleet keeps a run's record apart from its
// request (a run item holds none of the prompt, argv or env), and the start
// request a host receives is bounded by MaxEncodedBytes, under edge's 1 MiB
// request limit.
const (
	// MaxPromptBytes bounds the prompt.
	MaxPromptBytes = 256 << 10
	// MaxArgv bounds argv's entries, MaxArgvBytes their sum.
	MaxArgv      = 256
	MaxArgvBytes = 256 << 10
	// MaxEnv bounds env's variables, MaxEnvBytes the sum of their names and
	// values.
	MaxEnv      = 256
	MaxEnvBytes = 256 << 10
	// MaxSecrets bounds the secrets, MaxDomains each one's domains.
	MaxSecrets = 64
	MaxDomains = 64
	// MaxPathBytes bounds a repository, a clone URL and a local path.
	MaxPathBytes = 1024
	// MaxEncodedBytes bounds the request as JSON: escaping can make it
	// larger than its fields' bytes.
	MaxEncodedBytes = 768 << 10
	// MaxKeyLength bounds a key's name (an environment variable's).
	MaxKeyLength = 128
)

// IDPattern is the shape of an agent's name and a project's id (and of
// Fleet's host ids and label keys): short, printable, safe in a URL path
// segment and a DynamoDB key.
var IDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

var (
	// envNamePattern is an environment variable's name.
	envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,255}$`)
	// keyPattern is a key's: the variable that holds its placeholder.
	keyPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
)

// KeyNameValid reports whether name may name a key: an environment
// variable's name of at most MaxKeyLength characters. A host's policy
// compiles its keys by the same rule.
func KeyNameValid(name string) bool { return keyPattern.MatchString(name) }

// FieldError is a run request that cannot be run as asked. Field is the
// path of the part at fault ("secrets[0].domains[1]", "env.HTTPS_PROXY");
// the message names it too, and is what both APIs answer.
type FieldError struct {
	Field   string
	message string
}

func (e *FieldError) Error() string { return e.message }

func fieldError(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, message: fmt.Sprintf(format, args...)}
}

// Validate checks r and returns nil, or a *FieldError for the first field at
// fault in a fixed order (the same request always names the same field).
func (r Request) Validate() error {
	_, err := r.Declare()
	return err
}

// Declare validates r as Validate does and returns its secrets as declared:
// a host reads them once per start and grants from that form.
func (r Request) Declare() ([]Declared, error) {
	if err := r.checkCommand(); err != nil {
		return nil, err
	}
	if err := r.checkSource(); err != nil {
		return nil, err
	}
	declared, err := r.declareSecrets()
	if err != nil {
		return nil, err
	}
	if err := r.checkEnv(); err != nil {
		return nil, err
	}
	// Each field within its bound can still encode larger than a host takes
	// (JSON escapes control characters six times over).
	measured := r
	measured.Deadline = nil
	b, err := json.Marshal(measured)
	if err != nil {
		// Strings, slices and maps of strings always marshal.
		return nil, fmt.Errorf("runspec: encoding a request: %w", err)
	}
	if len(b) > MaxEncodedBytes {
		return nil, fieldError("request", "prompt, argv, env and secrets together encode to %d bytes of JSON; at most %d", len(b), MaxEncodedBytes)
	}
	return declared, nil
}

// CheckID refuses id unless it has IDPattern's shape, naming field.
func CheckID(field, id string) error {
	if !IDPattern.MatchString(id) {
		return fieldError(field, "%s %s: want 1-64 letters, digits and ._- starting with a letter or digit", field, Quoted(id))
	}
	return nil
}

// checkCommand checks what the task runs: the agent, its prompt and argv.
func (r Request) checkCommand() error {
	if r.Agent == "" {
		return fieldError("agent", "agent is required")
	}
	if err := CheckID("agent", r.Agent); err != nil {
		return err
	}
	if r.Argv != nil && len(r.Argv) == 0 {
		return fieldError("argv", "argv must not be empty (omit it instead)")
	}
	if len(r.Argv) > MaxArgv {
		return fieldError("argv", "argv: %d entries; at most %d", len(r.Argv), MaxArgv)
	}
	argvBytes := 0
	for i, a := range r.Argv {
		if strings.ContainsRune(a, 0) {
			return fieldError(fmt.Sprintf("argv[%d]", i), "argv[%d] contains a NUL byte", i)
		}
		argvBytes += len(a)
	}
	if argvBytes > MaxArgvBytes {
		return fieldError("argv", "argv: %d bytes in all; at most %d", argvBytes, MaxArgvBytes)
	}
	if len(r.Prompt) > MaxPromptBytes {
		return fieldError("prompt", "prompt: %d bytes; at most %d", len(r.Prompt), MaxPromptBytes)
	}
	if strings.ContainsRune(r.Prompt, 0) {
		return fieldError("prompt", "prompt contains a NUL byte")
	}
	return nil
}

// checkSource checks where the task works: what it clones, or the local
// path. A clone URL and a local path are two places: one is refused. A
// repository beside a local path names what the path holds (a host lacking
// the path is sent the clone URL instead).
func (r Request) checkSource() error {
	for _, f := range []struct{ name, value string }{{"repository", r.Repository}, {"cloneUrl", r.CloneURL}} {
		if len(f.value) > MaxPathBytes || strings.ContainsAny(f.value, "\x00\n\r") {
			return fieldError(f.name, "%s is not a repository name or URL of at most %d bytes", f.name, MaxPathBytes)
		}
		// git would read a leading '-' as an option.
		if strings.HasPrefix(f.value, "-") {
			return fieldError(f.name, "%s must not begin with '-'", f.name)
		}
	}
	if r.LocalPath != "" && (!path.IsAbs(r.LocalPath) || len(r.LocalPath) > MaxPathBytes || strings.ContainsRune(r.LocalPath, 0)) {
		return fieldError("localPath", "localPath %s: want an absolute path of at most %d bytes", Quoted(r.LocalPath), MaxPathBytes)
	}
	if r.CloneURL != "" && r.LocalPath != "" {
		return fieldError("localPath", "localPath: a run works in a localPath or in a clone of cloneUrl, not both")
	}
	return nil
}

// declareSecrets checks the secrets and reads their domains.
func (r Request) declareSecrets() ([]Declared, error) {
	if len(r.Secrets) > MaxSecrets {
		return nil, fieldError("secrets", "secrets: %d secrets; at most %d", len(r.Secrets), MaxSecrets)
	}
	out := make([]Declared, 0, len(r.Secrets))
	keys := map[string]bool{}
	for i, s := range r.Secrets {
		at := fmt.Sprintf("secrets[%d]", i)
		switch {
		case s.ProjectID == "":
			return nil, fieldError(at+".projectId", "%s.projectId is required", at)
		case s.Key == "":
			return nil, fieldError(at+".key", "%s.key is required", at)
		case len(s.Domains) == 0:
			return nil, fieldError(at+".domains", "%s.domains must list at least one domain", at)
		case len(s.Domains) > MaxDomains:
			return nil, fieldError(at+".domains", "%s.domains: %d domains; at most %d", at, len(s.Domains), MaxDomains)
		}
		if err := CheckID(at+".projectId", s.ProjectID); err != nil {
			return nil, err
		}
		if !KeyNameValid(s.Key) {
			return nil, fieldError(at+".key", "%s.key %s: want an environment variable name of at most %d characters", at, Quoted(s.Key), MaxKeyLength)
		}
		if Reserved(s.Key) {
			return nil, fieldError(at+".key", "%s.key %s names a variable the host sets for the task (a proxy or trust variable, or RUNFLEET_*)", at, s.Key)
		}
		// Each key becomes one variable, and names that differ only in
		// case are one variable to some programs.
		upper := strings.ToUpper(s.Key)
		if keys[upper] {
			return nil, fieldError(at+".key", "%s.key %q is declared twice", at, s.Key)
		}
		keys[upper] = true
		d := Declared{ProjectID: s.ProjectID, Key: s.Key}
		for j, raw := range s.Domains {
			dom, err := netname.ParseDomain(raw)
			if err != nil {
				return nil, fieldError(fmt.Sprintf("%s.domains[%d]", at, j), "%s.domains[%d] %s is not a domain: %v", at, j, Quoted(raw), err)
			}
			if !slices.Contains(d.Domains, dom) {
				d.Domains = append(d.Domains, dom)
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// checkEnv checks the run's env, in the order of its names.
func (r Request) checkEnv() error {
	if len(r.Env) > MaxEnv {
		return fieldError("env", "env: %d variables; at most %d", len(r.Env), MaxEnv)
	}
	declared := map[string]bool{}
	for _, s := range r.Secrets {
		declared[strings.ToUpper(s.Key)] = true
	}
	names := make([]string, 0, len(r.Env))
	envBytes := 0
	for name, v := range r.Env {
		names = append(names, name)
		envBytes += len(name) + len(v)
	}
	slices.Sort(names)
	for _, name := range names {
		at := "env." + name
		switch {
		case !envNamePattern.MatchString(name):
			return fieldError("env", "env name %s: want letters, digits and _ not starting with a digit", Quoted(name))
		case strings.HasPrefix(strings.ToUpper(name), reservedPrefix):
			return fieldError(at, "env %s: RUNFLEET_* variables are set by runfleet only", name)
		case Reserved(name):
			return fieldError(at, "env %s: proxy and trust variables are set by the host for the secrets proxy", name)
		case declared[strings.ToUpper(name)]:
			return fieldError(at, "env %s: names a key declared in secrets; the task gets its placeholder there", name)
		case strings.ContainsRune(r.Env[name], 0):
			return fieldError(at, "env %s: the value contains a NUL byte", name)
		}
	}
	if envBytes > MaxEnvBytes {
		return fieldError("env", "env: %d bytes of names and values; at most %d", envBytes, MaxEnvBytes)
	}
	return nil
}

// reservedPrefix: runfleet's own variables.
const reservedPrefix = "RUNFLEET_"

// reservedEnv are the variables the host sets for a task that declares
// secrets: the proxy it must go through and what it trusts. A run's env or
// key naming one would route around the secrets proxy or change what the
// task trusts.
var reservedEnv = []string{
	"HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY",
	"SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
	"GIT_SSL_CAINFO", "GIT_SSL_CAPATH", "GIT_SSL_NO_VERIFY",
	"NODE_EXTRA_CA_CERTS", "NODE_TLS_REJECT_UNAUTHORIZED", "AWS_CA_BUNDLE",
}

// Reserved reports whether a run may not set the variable name, compared
// without case (https_proxy is HTTPS_PROXY to curl): a proxy or trust
// variable, or one of runfleet's own (RUNFLEET_*).
func Reserved(name string) bool {
	upper := strings.ToUpper(name)
	return strings.HasPrefix(upper, reservedPrefix) || slices.Contains(reservedEnv, upper)
}

// Quoted quotes a caller's value for a message, cut short when long: a
// message names what was wrong, it does not echo kilobytes.
func Quoted(s string) string {
	const keep = 80
	if len(s) > keep {
		return fmt.Sprintf("%q... (%d bytes)", s[:keep], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// givenFields are the run request's optional strings, as JSON names them.
var givenFields = []string{"prompt", "repository", "cloneUrl", "localPath"}

// RefuseEmpty refuses an optional string of the run request that the JSON
// object body gives but leaves empty: a caller who sends "prompt": "" meant
// something, and taking it for absent would run something else. (An empty
// argv decodes as given and Validate refuses it.) body is the request's
// JSON object; anything else is for the caller's decoder to refuse.
func RefuseEmpty(body []byte) error {
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil {
		return nil
	}
	for _, name := range givenFields {
		if v, ok := obj[name]; ok && string(v) == `""` {
			return fieldError(name, "%s must not be empty (omit it instead)", name)
		}
	}
	return nil
}
