package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy/awssig"
	"github.com/runfleet/runfleet/edge/proxy/placeholder"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// Real-looking AWS credentials (AWS's documented examples, changed), none
// of whose parts appears in any message the proxy writes.
const (
	realAWSID     = "AKIAIOSFODNN7REALKEY"
	realAWSSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYREALSECRET"
	realASIAID    = "ASIAQWERTYUIOPREALTMP"
	realASIASec   = "9drTJvcXLB89EXAMPLELB8923FB892xMFI/TMPSEC"
	realASIAToken = "IQoJb3JpZ2luX2VjEXAMPLEtokenREALSESSIONTOKENvalueAAAAbbbbCCCCdddd"
)

var (
	staticAWSValue    = `{"accessKeyId": "` + realAWSID + `", "secretAccessKey": "` + realAWSSecret + `"}`
	temporaryAWSValue = `{"accessKeyId": "` + realASIAID + `", "secretAccessKey": "` + realASIASec + `", "sessionToken": "` + realASIAToken + `"}`

	awsIDPattern     = regexp.MustCompile(`^AKIA[A-Z2-7]{16}$`)
	awsTempIDPattern = regexp.MustCompile(`^ASIA[A-Z2-7]{16}$`)
	awsSecretPattern = regexp.MustCompile(`^[A-Za-z0-9+/]{40}$`)
	awsTokenPattern  = regexp.MustCompile(`^[A-Za-z0-9+/]{` + fmt.Sprint(placeholder.AWSTokenLength) + `}$`)
)

// seededRand is a reproducible source of randomness for minting.
func seededRand(seed uint64) io.Reader {
	var s [32]byte
	s[0] = byte(seed)
	return rand.NewChaCha8(s)
}

// MintAWS draws placeholders of the shapes AWS SDKs check: an AKIA id and
// no token for long-term credentials, an ASIA id and a token for temporary
// ones, each id 4+16 of base32's alphabet, each secret 40 of base64's; and
// every draw is its own.
func TestMintAWSShapes(t *testing.T) {
	r := seededRand(1)
	seen := map[string]bool{}
	idChars, secretChars := map[rune]bool{}, map[rune]bool{}
	const draws = 500
	for i := range draws {
		temporary := i%2 == 1
		a, err := placeholder.MintAWS(r, temporary)
		if err != nil {
			t.Fatal(err)
		}
		idPattern, tokenOK := awsIDPattern, a.SessionToken == ""
		if temporary {
			idPattern, tokenOK = awsTempIDPattern, awsTokenPattern.MatchString(a.SessionToken)
		}
		if !idPattern.MatchString(a.AccessKeyID) || !awsSecretPattern.MatchString(a.SecretAccessKey) || !tokenOK {
			t.Fatalf("temporary=%v: placeholders of the wrong shape: id %q secret %q token %d chars", temporary, a.AccessKeyID, a.SecretAccessKey, len(a.SessionToken))
		}
		for _, s := range []string{a.AccessKeyID, a.SecretAccessKey, a.SessionToken} {
			if s == "" {
				continue
			}
			if seen[s] {
				t.Fatalf("draw %d repeats an earlier placeholder", i)
			}
			seen[s] = true
		}
		for _, c := range a.AccessKeyID[4:] {
			idChars[c] = true
		}
		for _, c := range a.SecretAccessKey + a.SessionToken {
			secretChars[c] = true
		}
	}
	// Every character of each alphabet is drawn: none is left out.
	if len(idChars) != 32 || len(secretChars) != 64 {
		t.Errorf("%d draws used %d of the id alphabet's 32 characters and %d of the secret alphabet's 64", draws, len(idChars), len(secretChars))
	}
	// Draws from the same seed are the same (the randomness is the
	// reader's alone), from another seed different.
	a1, _ := placeholder.MintAWS(seededRand(7), true)
	a2, _ := placeholder.MintAWS(seededRand(7), true)
	a3, _ := placeholder.MintAWS(seededRand(8), true)
	if a1 != a2 || a1 == a3 {
		t.Error("MintAWS does not draw from the reader it is given")
	}
	// A failing reader is an error, never a short placeholder.
	if a, err := placeholder.MintAWS(io.LimitReader(seededRand(2), 64), true); err == nil {
		t.Errorf("a reader that ran dry gave %d+%d+%d characters and no error", len(a.AccessKeyID), len(a.SecretAccessKey), len(a.SessionToken))
	}
}

// An AWS key's placeholders are stored as one string and read back whole;
// no plain key's placeholder (letters, digits, '_', '.', '-') is ever read
// as an AWS one.
func TestStoredAWSRoundTripAndPlainPlaceholders(t *testing.T) {
	r := seededRand(3)
	for _, temporary := range []bool{false, true} {
		a, err := placeholder.MintAWS(r, temporary)
		must(t, err)
		stored := storeAWS(a)
		got, ok := storedAWS(stored)
		if !ok || got != a {
			t.Errorf("temporary=%v: storedAWS(storeAWS(a)) = %v, %v", temporary, ok, got == a)
		}
	}
	plain := []string{
		"", "aws1", "aws1:", "aws1:AKIAABCDEFGHIJKLMNOP", "aws1:AKIAABCDEFGHIJKLMNOP:",
		"aws1::secret:token", "aws1:AKIAABCDEFGHIJKLMNOP::token", "aws1:a:b:c:d",
		"AWS1:AKIAABCDEFGHIJKLMNOP:secret:", "xaws1:AKIAABCDEFGHIJKLMNOP:secret:",
		"AKIAABCDEFGHIJKLMNOP",
	}
	for _, shape := range []policy.Shape{{Prefix: "aws1", Length: 40}, {Prefix: "aws1_", Length: 40}, {Prefix: "aws1.", Length: 40}, {Prefix: "", Length: 32}, {Prefix: "sk-", Length: 51}} {
		for range 20 {
			ph, err := placeholder.Mint(r, shape)
			must(t, err)
			plain = append(plain, ph)
		}
	}
	for _, ph := range plain {
		if _, ok := storedAWS(ph); ok {
			t.Errorf("storedAWS(%q) took a plain placeholder for an AWS one", ph)
		}
	}
}

// An operator's value for an aws key is JSON of accessKeyId,
// secretAccessKey and, for temporary credentials, sessionToken. Anything
// else is refused with an error that names the key and what is wrong,
// never the value or any part of it.
func TestParseAWSValue(t *testing.T) {
	ref := policy.KeyRef{Project: "acme", Key: "DEPLOY"}
	for name, tc := range map[string]struct {
		value string
		want  awssig.Credentials
	}{
		"static":              {staticAWSValue, awssig.Credentials{AccessKeyID: realAWSID, SecretAccessKey: realAWSSecret}},
		"temporary":           {temporaryAWSValue, awssig.Credentials{AccessKeyID: realASIAID, SecretAccessKey: realASIASec, SessionToken: realASIAToken}},
		"spaced over lines":   {"{\n  \"accessKeyId\": \"" + realAWSID + "\",\n  \"secretAccessKey\": \"" + realAWSSecret + "\"\n}\n", awssig.Credentials{AccessKeyID: realAWSID, SecretAccessKey: realAWSSecret}},
		"empty token: static": {`{"accessKeyId": "` + realAWSID + `", "secretAccessKey": "` + realAWSSecret + `", "sessionToken": ""}`, awssig.Credentials{AccessKeyID: realAWSID, SecretAccessKey: realAWSSecret}},
	} {
		got, err := parseAWSValue(ref, secrets.NewValue(tc.value))
		if err != nil || got != tc.want {
			t.Errorf("%s: %v (credentials as written: %v)", name, err, got == tc.want)
		}
	}

	longID := "AKIA" + strings.Repeat("Q", 125)
	for name, tc := range map[string]struct {
		value string
		what  string
		// parts are the value's pieces the message must not hold: each
		// field's value (the field names are the hint's own words).
		parts []string
	}{
		"missing accessKeyId":     {`{"secretAccessKey": "` + realAWSSecret + `"}`, "accessKeyId is missing", []string{realAWSSecret}},
		"missing secretAccessKey": {`{"accessKeyId": "` + realAWSID + `"}`, "secretAccessKey is missing", []string{realAWSID}},
		"empty accessKeyId":       {`{"accessKeyId": "", "secretAccessKey": "` + realAWSSecret + `"}`, "accessKeyId is missing", []string{realAWSSecret}},
		"empty object":            {`{}`, "accessKeyId is missing", nil},
		"null":                    {`null`, "accessKeyId is missing", nil},
		"unknown field":           {`{"accessKeyId": "` + realAWSID + `", "secretAccessKey": "` + realAWSSecret + `", "region": "us-east-1"}`, "not a JSON object of those fields", []string{realAWSID, realAWSSecret}},
		"secret under other name": {`{"accessKeyId": "` + realAWSID + `", "secretKey": "` + realAWSSecret + `"}`, "not a JSON object of those fields", []string{realAWSID, realAWSSecret}},
		"not JSON: id:secret":     {realAWSID + ":" + realAWSSecret, "not a JSON object of those fields", []string{realAWSID, realAWSSecret}},
		"not JSON: bare secret":   {realAWSSecret, "not a JSON object of those fields", []string{realAWSSecret}},
		"a JSON string":           {`"` + realAWSSecret + `"`, "not a JSON object of those fields", []string{realAWSSecret}},
		"a JSON array":            {`["` + realAWSID + `", "` + realAWSSecret + `"]`, "not a JSON object of those fields", []string{realAWSID, realAWSSecret}},
		"a number for the id":     {`{"accessKeyId": 12345678901234567890, "secretAccessKey": "` + realAWSSecret + `"}`, "not a JSON object of those fields", []string{"12345678901234567890", realAWSSecret}},
		"truncated JSON":          {`{"accessKeyId": "` + realAWSID + `", "secretAccessKey": "` + realAWSSecret, "not a JSON object of those fields", []string{realAWSID, realAWSSecret}},
		"id in lower case":        {`{"accessKeyId": "` + strings.ToLower(realAWSID) + `", "secretAccessKey": "` + realAWSSecret + `"}`, "accessKeyId is not 16 to 128 capital letters and digits", []string{strings.ToLower(realAWSID), realAWSSecret}},
		"id too short":            {`{"accessKeyId": "AKIAIOSFODNN7", "secretAccessKey": "` + realAWSSecret + `"}`, "accessKeyId is not 16 to 128 capital letters and digits", []string{"AKIAIOSFODNN7", realAWSSecret}},
		"id too long":             {`{"accessKeyId": "` + longID + `", "secretAccessKey": "` + realAWSSecret + `"}`, "accessKeyId is not 16 to 128 capital letters and digits", []string{longID, realAWSSecret}},
		"id with a dash":          {`{"accessKeyId": "AKIA-IOSFODNN7REALKEY", "secretAccessKey": "` + realAWSSecret + `"}`, "accessKeyId is not 16 to 128 capital letters and digits", []string{"AKIA-IOSFODNN7REALKEY", realAWSSecret}},
		"id with a line break":    {`{"accessKeyId": "AKIAIOSFODNN7REAL\nKEY", "secretAccessKey": "` + realAWSSecret + `"}`, "accessKeyId is not 16 to 128 capital letters and digits", []string{"AKIAIOSFODNN7REAL", realAWSSecret}},
		"secret with LF":          {`{"accessKeyId": "` + realAWSID + `", "secretAccessKey": "wJalrXUtnFEMI/K7MDENG\nbPxRfiCYREALSECRET"}`, "a field holds a line break", []string{realAWSID, "wJalrXUtnFEMI/K7MDENG", "bPxRfiCYREALSECRET"}},
		"secret with CR":          {`{"accessKeyId": "` + realAWSID + `", "secretAccessKey": "wJalrXUtnFEMI/K7MDENG\rbPxRfiCYREALSECRET"}`, "a field holds a line break", []string{realAWSID, "wJalrXUtnFEMI/K7MDENG", "bPxRfiCYREALSECRET"}},
		"token with CRLF":         {`{"accessKeyId": "` + realASIAID + `", "secretAccessKey": "` + realASIASec + `", "sessionToken": "IQoJb3JpZ2luX2Vj\r\nEXAMPLEtokenREALSESSION"}`, "a field holds a line break", []string{realASIAID, realASIASec, "IQoJb3JpZ2luX2Vj", "EXAMPLEtokenREALSESSION"}},
		"token with NUL":          {`{"accessKeyId": "` + realASIAID + `", "secretAccessKey": "` + realASIASec + `", "sessionToken": "IQoJb3JpZ2luX2Vj\u0000EXAMPLEtokenREALSESSION"}`, "a field holds a line break", []string{realASIAID, realASIASec, "IQoJb3JpZ2luX2Vj", "EXAMPLEtokenREALSESSION"}},
	} {
		_, err := parseAWSValue(ref, secrets.NewValue(tc.value))
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		var ev *errAWSValue
		if !errors.As(err, &ev) {
			t.Errorf("%s: error %T, want *errAWSValue", name, err)
		}
		msg := err.Error()
		if !strings.Contains(msg, "acme/DEPLOY") || !strings.Contains(msg, tc.what) {
			t.Errorf("%s: error %q does not name the key and %q", name, msg, tc.what)
		}
		assertHoldsNoPart(t, name, msg, tc.parts)
	}
}

// assertHoldsNoPart fails if msg holds any 8 characters in a row of any of
// parts (shorter parts whole).
func assertHoldsNoPart(t *testing.T, what, msg string, parts []string) {
	t.Helper()
	for _, p := range parts {
		n := min(8, len(p))
		for i := 0; i+n <= len(p) && n > 0; i++ {
			w := p[i : i+n]
			if strings.ContainsAny(w, `{}":, `+"\n") {
				continue // the JSON around the fields, which the message's hint shows too
			}
			if strings.Contains(msg, w) {
				t.Errorf("%s: message %q holds %q, a part of the value", what, msg, w)
				break
			}
		}
	}
}

// A value followed by more JSON (or anything else) is not the value the
// error's hint asks for: the second object, here the token, would be
// dropped without a word, and the key signed as long-term credentials.
func TestParseAWSValueRefusesTrailingData(t *testing.T) {
	ref := policy.KeyRef{Project: "acme", Key: "DEPLOY"}
	for _, v := range []string{
		staticAWSValue + ` {"sessionToken": "` + realASIAToken + `"}`,
		staticAWSValue + ` trailing`,
		staticAWSValue + `}`,
	} {
		if _, err := parseAWSValue(ref, secrets.NewValue(v)); err == nil {
			t.Errorf("a value with data after its object was accepted (%d bytes)", len(v))
		}
	}
}

// awsEnv is a proxy whose policy holds two aws keys, a long-term one with
// the default variable names and a temporary one with its own envPrefix,
// and a plain key, all reaching one loopback upstream; the secrets source
// holds their values.
type awsEnv struct {
	*env
	up             *testUpstream
	s3East, s3West string // host:port of the aws keys' domains
	api            string
	opts           envOptions
}

func newAWSEnv(t *testing.T, dataDir string, extraSecrets map[string]string) *awsEnv {
	t.Helper()
	uca := edgetest.NewCA(t)
	up := startUpstream(t, uca, false, "s3.us-east-1.amazonaws.com", "s3.us-west-2.amazonaws.com", "api.example.test")
	o := envOptions{dataDir: dataDir, uca: uca,
		pins: map[string]string{"s3.us-east-1.amazonaws.com": "127.0.0.1", "s3.us-west-2.amazonaws.com": "127.0.0.1", "api.example.test": "127.0.0.1"},
		keys: fmt.Sprintf(`{"acme": {"keys": {
			"DEPLOY": {"kind": "aws", "domains": ["s3.us-east-1.amazonaws.com:%d"], "aws": {"regions": ["us-east-1"], "services": ["s3"]}},
			"BACKUP": {"kind": "aws", "domains": ["s3.us-west-2.amazonaws.com:%d"], "aws": {"regions": ["us-west-2"], "services": ["s3"], "envPrefix": "BACKUP_AWS_"}},
			"MISSING": {"kind": "aws", "domains": ["s3.us-east-1.amazonaws.com:%d"], "aws": {"regions": ["us-east-1"], "services": ["s3"], "envPrefix": "MISSING_AWS_"}},
			"BAD": {"kind": "aws", "domains": ["s3.us-east-1.amazonaws.com:%d"], "aws": {"regions": ["us-east-1"], "services": ["s3"], "envPrefix": "BAD_AWS_"}},
			"A": {"domains": ["api.example.test:%d"], "in": ["header"]}}}}`, up.port, up.port, up.port, up.port, up.port),
		secrets: map[string]string{"acme/DEPLOY": staticAWSValue, "acme/BACKUP": temporaryAWSValue, "acme/A": realA},
	}
	for k, v := range extraSecrets {
		o.secrets[k] = v
	}
	e := newEnv(t, o)
	ae := &awsEnv{env: e, up: up, opts: o,
		s3East: "s3.us-east-1.amazonaws.com:" + itoa(up.port), s3West: "s3.us-west-2.amazonaws.com:" + itoa(up.port), api: "api.example.test:" + itoa(up.port)}
	t.Cleanup(func() {
		e.assertNoLeak(realAWSID, realAWSSecret, realASIAID, realASIASec, realASIAToken)
	})
	return ae
}

// taskVars registers runID with the declared keys and returns TaskKeys by
// variable name.
func (e *awsEnv) taskVars(t *testing.T, runID string, keys ...string) map[string]TaskKey {
	t.Helper()
	var declared []runspec.Secret
	for _, k := range keys {
		declared = append(declared, runspec.Secret{ProjectID: "acme", Key: k})
	}
	must(t, e.proxy.Register(runID, e.declare(declared...)))
	tk, err := e.proxy.TaskKeys(runID)
	must(t, err)
	out := map[string]TaskKey{}
	for _, k := range tk {
		if _, dup := out[k.Var]; dup {
			t.Fatalf("TaskKeys sets %s twice", k.Var)
		}
		out[k.Var] = k
	}
	return out
}

// A task holding aws keys gets each key's credentials' variables, named
// with the key's envPrefix, holding placeholders of the real credentials'
// kind: two for long-term credentials, three (ASIA and a token) for
// temporary ones; plain keys keep their one variable.
func TestTaskKeysOfAWSKeys(t *testing.T) {
	e := newAWSEnv(t, "", nil)
	vars := e.taskVars(t, "run-aws", "DEPLOY", "BACKUP", "A")
	want := map[string]struct {
		key     string
		pattern *regexp.Regexp
	}{
		"AWS_ACCESS_KEY_ID":            {"DEPLOY", awsIDPattern},
		"AWS_SECRET_ACCESS_KEY":        {"DEPLOY", awsSecretPattern},
		"BACKUP_AWS_ACCESS_KEY_ID":     {"BACKUP", awsTempIDPattern},
		"BACKUP_AWS_SECRET_ACCESS_KEY": {"BACKUP", awsSecretPattern},
		"BACKUP_AWS_SESSION_TOKEN":     {"BACKUP", awsTokenPattern},
		"A":                            {"A", nil},
	}
	if len(vars) != len(want) {
		names := make([]string, 0, len(vars))
		for n := range vars {
			names = append(names, n)
		}
		t.Fatalf("TaskKeys gives %v, want the %d variables %v (no AWS_SESSION_TOKEN for long-term credentials)", names, len(want), want)
	}
	for name, w := range want {
		k, ok := vars[name]
		if !ok {
			t.Errorf("no variable %s", name)
			continue
		}
		if k.ProjectID != "acme" || k.Key != w.key {
			t.Errorf("%s is of %s/%s, want acme/%s", name, k.ProjectID, k.Key, w.key)
		}
		if w.pattern != nil && !w.pattern.MatchString(k.Placeholder) {
			t.Errorf("%s = %q is not of the shape %s", name, k.Placeholder, w.pattern)
		}
		for _, real := range []string{realAWSID, realAWSSecret, realASIAID, realASIASec, realASIAToken, realA} {
			if strings.Contains(k.Placeholder, real) {
				t.Errorf("%s holds a real value", name)
			}
		}
	}
	// Another run gets placeholders of its own.
	other := e.taskVars(t, "run-aws-2", "DEPLOY", "BACKUP")
	for name, k := range other {
		if k.Placeholder == vars[name].Placeholder {
			t.Errorf("two runs share %s's placeholder", name)
		}
	}
	// Registering the run again is a no-op: the same placeholders.
	again := e.taskVars(t, "run-aws", "DEPLOY", "BACKUP", "A")
	for name, k := range vars {
		if again[name] != k {
			t.Errorf("registering again changed %s", name)
		}
	}
}

// A task's aws placeholders are written to the data dir (without the real
// credentials) and are the task's again after a restart on it: known to
// the re-signing index before the run registers again, and the same
// variables once it does.
func TestAWSPlaceholdersPersistAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	e := newAWSEnv(t, dir, nil)
	first := e.taskVars(t, "run-p", "DEPLOY", "BACKUP")
	file := filepath.Join(dir, "secrets-proxy", "placeholders", "run-p.json")
	b, err := os.ReadFile(file)
	must(t, err)
	for _, real := range []string{realAWSID, realAWSSecret, realASIAID, realASIASec, realASIAToken} {
		if strings.Contains(string(b), real) {
			t.Fatal("the placeholder file holds a real credential")
		}
	}
	e.proxy.Close()
	e.authority.Close()

	e2 := newAWSEnv(t, dir, nil)
	owners := *e2.proxy.reg.aws.Load()
	for _, name := range []string{"AWS_ACCESS_KEY_ID", "BACKUP_AWS_ACCESS_KEY_ID"} {
		o, ok := owners[first[name].Placeholder]
		if !ok || o.task != "run-p" || o.ref != (policy.KeyRef{Project: "acme", Key: first[name].Key}) {
			t.Errorf("after a restart, %s's placeholder is not known as run-p's: %v %+v", name, ok, o)
		}
	}
	again := e2.taskVars(t, "run-p", "DEPLOY", "BACKUP")
	if len(again) != len(first) {
		t.Fatalf("%d variables after the restart, %d before", len(again), len(first))
	}
	for name, k := range first {
		if again[name] != k {
			t.Errorf("%s changed across the restart", name)
		}
	}
}

// An aws key the secrets source holds no value for, or a value that is not
// AWS credentials, refuses the run's registration with an error naming the
// key and never the value; nothing of the run is registered or written.
func TestRegisterRefusesAWSKeyWithoutCredentials(t *testing.T) {
	badValue := `{"accessKeyId": "` + realAWSID + `", "secretAccessKey": "` + realAWSSecret + `", "password": "hunter2-hunter2"}`
	e := newAWSEnv(t, "", map[string]string{"acme/BAD": badValue})
	for _, tc := range []struct {
		key, want string
	}{
		{"MISSING", "aws key acme/MISSING: the secrets source holds no value for it"},
		{"BAD", "acme/BAD is not AWS credentials (not a JSON object of those fields)"},
	} {
		runID := "run-" + strings.ToLower(tc.key)
		err := e.proxy.Register(runID, e.declare(runspec.Secret{ProjectID: "acme", Key: "DEPLOY"}, runspec.Secret{ProjectID: "acme", Key: tc.key}))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Register with %s: %v, want an error holding %q", tc.key, err, tc.want)
			continue
		}
		assertHoldsNoPart(t, tc.key, err.Error(), []string{realAWSID, realAWSSecret, "hunter2-hunter2"})
		if _, err := e.proxy.TaskKeys(runID); !errors.Is(err, ErrUnknownTask) {
			t.Errorf("a refused run is registered: %v", err)
		}
		if _, err := os.Stat(filepath.Join(e.dir, "secrets-proxy", "placeholders", runID+".json")); !os.IsNotExist(err) {
			t.Errorf("a refused run's placeholders were written: %v", err)
		}
	}
	if n := len(*e.proxy.reg.aws.Load()); n != 0 {
		t.Errorf("refused runs left %d aws placeholders known", n)
	}
	if logs := e.logs.String(); strings.Contains(logs, "hunter2-hunter2") {
		t.Error("the log holds the bad value")
	}
}

// An aws key's placeholders are never substituted as a plain key's are:
// they are absent from the substitution index, and a request carrying them
// in headers, even to the key's own domain, reaches the upstream with the
// placeholders as the task wrote them, never the real credentials. (Only a
// request signed with them is re-signed; awsresign.)
func TestAWSPlaceholdersAreNotSubstituted(t *testing.T) {
	e := newAWSEnv(t, "", nil)
	vars := e.taskVars(t, "run-s", "DEPLOY", "BACKUP", "A")
	var awsPHs []string
	for name, k := range vars {
		if name == "A" {
			continue
		}
		awsPHs = append(awsPHs, k.Placeholder)
		if ms := e.proxy.reg.index.Load().FindString("x "+k.Placeholder+" y", nil); len(ms) != 0 {
			t.Errorf("%s's placeholder is in the substitution index (as %s's)", name, ms[0].Owner.Ref)
		}
	}
	if ms := e.proxy.reg.index.Load().FindString(vars["A"].Placeholder, nil); len(ms) != 1 {
		t.Fatal("the plain key's placeholder is not in the index")
	}
	u, err := e.proxy.StartAttempt("run-s")
	must(t, err)
	client := e.goClient(u, false)
	for _, target := range []string{e.s3East, e.s3West} {
		req, err := http.NewRequest(http.MethodGet, "https://"+target+"/bucket/probe", nil)
		must(t, err)
		req.Header.Set("X-Probe-Id", vars["AWS_ACCESS_KEY_ID"].Placeholder)
		req.Header.Set("X-Probe-Secret", vars["AWS_SECRET_ACCESS_KEY"].Placeholder)
		req.Header.Set("X-Probe-Token", vars["BACKUP_AWS_SESSION_TOKEN"].Placeholder)
		req.Header.Set("Authorization", "Bearer "+vars["BACKUP_AWS_SECRET_ACCESS_KEY"].Placeholder)
		res, err := client.Do(req)
		must(t, err)
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", target, res.StatusCode)
		}
	}
	got := e.up.requests()
	if len(got) != 2 {
		t.Fatalf("the upstream got %d requests, want 2", len(got))
	}
	for _, r := range got {
		h := r.Header
		if h.Get("X-Probe-Id") != vars["AWS_ACCESS_KEY_ID"].Placeholder || h.Get("X-Probe-Secret") != vars["AWS_SECRET_ACCESS_KEY"].Placeholder ||
			h.Get("X-Probe-Token") != vars["BACKUP_AWS_SESSION_TOKEN"].Placeholder || h.Get("Authorization") != "Bearer "+vars["BACKUP_AWS_SECRET_ACCESS_KEY"].Placeholder {
			t.Errorf("%s: the aws placeholders did not reach the upstream as written", r.Host)
		}
		all, _ := json.Marshal(h)
		for _, real := range []string{realAWSID, realAWSSecret, realASIAID, realASIASec, realASIAToken} {
			if strings.Contains(string(all), real) {
				t.Errorf("%s: a real AWS credential was put into the request", r.Host)
			}
		}
	}
	// Intercepted (the connection goes where a key of the task reaches)
	// and forwarded as it came: nothing substituted.
	line := e.waitAudit(func(m map[string]any) bool { return m["path"] == "/bucket/probe" })
	if line["action"] != "forwarded" {
		t.Errorf("audit of a request carrying only aws placeholders: %v, want action forwarded", line)
	}
	e.assertNoLeak(awsPHs...)
}

// Drop forgets the run's aws placeholders: gone from the re-signing index,
// from disk and from TaskKeys, other runs' kept.
func TestDropForgetsAWSPlaceholders(t *testing.T) {
	e := newAWSEnv(t, "", nil)
	gone := e.taskVars(t, "run-g", "DEPLOY", "BACKUP")
	kept := e.taskVars(t, "run-k", "DEPLOY")
	must(t, e.proxy.Drop("run-g"))
	owners := *e.proxy.reg.aws.Load()
	for _, name := range []string{"AWS_ACCESS_KEY_ID", "BACKUP_AWS_ACCESS_KEY_ID"} {
		if _, ok := owners[gone[name].Placeholder]; ok {
			t.Errorf("a dropped run's %s is still known", name)
		}
	}
	if o, ok := owners[kept["AWS_ACCESS_KEY_ID"].Placeholder]; !ok || o.task != "run-k" {
		t.Error("Drop of run-g forgot run-k's placeholder")
	}
	if len(owners) != 1 {
		t.Errorf("%d aws placeholders known after the drop, want run-k's 1", len(owners))
	}
	if _, err := os.Stat(filepath.Join(e.dir, "secrets-proxy", "placeholders", "run-g.json")); !os.IsNotExist(err) {
		t.Errorf("a dropped run's placeholders are still on disk: %v", err)
	}
	if _, err := e.proxy.TaskKeys("run-g"); !errors.Is(err, ErrUnknownTask) {
		t.Errorf("TaskKeys of a dropped run: %v", err)
	}
	// Registered again, the run gets new placeholders.
	again := e.taskVars(t, "run-g", "DEPLOY", "BACKUP")
	for name, k := range again {
		if k.Placeholder == gone[name].Placeholder {
			t.Errorf("a dropped run registered again got its old %s", name)
		}
	}
}
