package proxy

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	logredact "github.com/runfleet/runfleet/edge/internal/redact"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
	"github.com/runfleet/runfleet/tests/kit/leakcheck"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// Values from Fleet (issue 33): GH takes its value from Fleet and reaches
// api.example.test in a header or the URL; B is the host's own, reaching
// other.example.test. The secrets file holds a value for GH too, which a
// key taken from Fleet must never send.
const (
	fleetFirst  = "ghs_FleetMintedFirstToken0123456789abcdef"
	fleetSecond = "ghs_FleetMintedSecondTokenZYXWVUTSRQponml"
	fleetDecoy  = "host-file-value-of-GH-that-is-never-sent"
)

var ghRef = policy.KeyRef{Project: "acme", Key: "GH"}

type fleetEnv struct {
	*env
	up         *testUpstream
	api, other string
	rawLogs    *syncbuf.Buffer
	rawAudit   *syncbuf.Buffer
	redactor   *logredact.Set
	uca        *edgetest.CA
	dataDir    string
}

// newFleetEnv starts a proxy wired as edge serve wires it (the redactor
// learning values, the tripwire on) over dataDir ("" for a new one) and
// up (nil for a new upstream).
func newFleetEnv(t *testing.T, dataDir string, uca *edgetest.CA, up *testUpstream) *fleetEnv {
	t.Helper()
	if uca == nil {
		uca = edgetest.NewCA(t)
	}
	if up == nil {
		up = startUpstream(t, uca, true, "api.example.test", "other.example.test")
	}
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	f := &fleetEnv{up: up, rawLogs: &syncbuf.Buffer{}, rawAudit: &syncbuf.Buffer{}, redactor: logredact.NewSet(0), uca: uca, dataDir: dataDir,
		api: "api.example.test:" + itoa(up.port), other: "other.example.test:" + itoa(up.port)}
	f.env = newEnv(t, envOptions{dataDir: dataDir, uca: uca, egress: policy.EgressStrict,
		pins: map[string]string{"api.example.test": "127.0.0.1", "other.example.test": "127.0.0.1"},
		keys: fmt.Sprintf(`{"acme": {"keys": {
			"GH": {"domains": ["api.example.test:%d"], "source": "fleet", "in": ["header", "url"], "placeholder": {"prefix": "ghs_", "length": 40}},
			"B": {"domains": ["other.example.test:%d"], "in": ["header"]}}}}`, up.port, up.port),
		secrets:  map[string]string{"acme/GH": fleetDecoy, "acme/B": realB},
		redactor: f.redactor, rawLogs: f.rawLogs, rawAudit: f.rawAudit,
	})
	return f
}

// run registers runID declaring GH and B, gives it creds, starts its
// attempt and returns its proxy URL and GH's placeholder.
func (f *fleetEnv) run(t *testing.T, runID string, creds ...Credential) (*url.URL, string) {
	t.Helper()
	must(t, f.proxy.Register(runID, f.declare(runspec.Secret{ProjectID: "acme", Key: "GH"}, runspec.Secret{ProjectID: "acme", Key: "B"})))
	if len(creds) > 0 {
		must(t, f.proxy.SetCredentials(runID, creds))
	}
	u, err := f.proxy.StartAttempt(runID)
	must(t, err)
	keys, err := f.proxy.TaskKeys(runID)
	must(t, err)
	for _, k := range keys {
		if k.Key == "GH" {
			return u, k.Placeholder
		}
	}
	t.Fatal("no placeholder for GH")
	return nil, ""
}

func fleetValue(v string, expires time.Time) Credential {
	return Credential{Ref: ghRef, Value: secrets.NewValue(v), ExpiresAt: expires}
}

// get sends GET url with header Authorization through proxyURL.
func (f *fleetEnv) get(t *testing.T, proxyURL *url.URL, rawURL, auth string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, rawURL, nil)
	must(t, err)
	req.Header.Set("Authorization", auth)
	res, err := f.goClient(proxyURL, false).Do(req)
	must(t, err)
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res, string(body)
}

// lastAuth is the Authorization the upstream saw last, and how many
// requests it saw.
func (f *fleetEnv) lastAuth() (string, int) {
	got := f.up.requests()
	if len(got) == 0 {
		return "", 0
	}
	return got[len(got)-1].Header.Get("Authorization"), len(got)
}

// noLeak checks edge's log and audit (both before and after the
// redactor), the data dir's files and what the upstream never got.
func (f *fleetEnv) noLeak(t *testing.T, values ...string) {
	t.Helper()
	f.audit.Flush()
	for _, v := range values {
		real := leakcheck.Real{Key: "a value from Fleet", Value: v, Public: len("ghs_")}
		leakcheck.AssertClean(t, "edge's log", []byte(f.logs.String()), real)
		leakcheck.AssertClean(t, "edge's log before its redactor", []byte(f.rawLogs.String()), real)
		leakcheck.AssertClean(t, "edge's audit before its redactor", []byte(f.rawAudit.String()), real)
		for path, b := range readTree(t, f.dataDir) {
			leakcheck.AssertClean(t, path, b, real)
		}
	}
}

// A key taken from Fleet is sent with the value Fleet gave the run, only
// where its policy lets it go, never with the secrets source's value; a
// run Fleet gave none is answered 503 withheld and nothing leaves; values
// are the run's own.
func TestFleetValueIsTheRunsOwnAndGoesOnlyToItsDomains(t *testing.T) {
	f := newFleetEnv(t, "", nil, nil)
	expires := time.Now().Add(time.Hour)
	u, ph := f.run(t, "run-f", fleetValue(fleetFirst, expires))

	res, _ := f.get(t, u, "https://"+f.api+"/user", "Bearer "+ph)
	if auth, n := f.lastAuth(); res.StatusCode != 200 || n != 1 || auth != "Bearer "+fleetFirst {
		t.Fatalf("GET with the placeholder: %d; the upstream saw %d requests, the last with the value from Fleet: %v", res.StatusCode, n, auth == "Bearer "+fleetFirst)
	}
	// Off its domains it blocks, as any key's does.
	res, body := f.get(t, u, "https://"+f.other+"/user", "Bearer "+ph)
	if _, n := f.lastAuth(); res.StatusCode != http.StatusForbidden || !strings.Contains(body, "may not reach other.example.test") || n != 1 {
		t.Fatalf("GET to another key's domain: %d %q; the upstream saw %d requests", res.StatusCode, body, n)
	}
	if m := f.proxy.MissingCredentials("run-f", f.declare(runspec.Secret{ProjectID: "acme", Key: "GH"})); len(m) != 0 {
		t.Errorf("run-f holds its value, yet missing %v", m)
	}

	// Another run declaring GH without a value of its own: withheld, never
	// the first run's value, the secrets file's or the placeholder.
	u2, ph2 := f.run(t, "run-g")
	res, body = f.get(t, u2, "https://"+f.api+"/user?token="+ph2, "Bearer "+ph2)
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") != "60" || !strings.Contains(body, "withheld: this run holds no value of acme/GH yet") {
		t.Fatalf("GET without a value from Fleet: %d, Retry-After %q, %q; want 503 withheld", res.StatusCode, res.Header.Get("Retry-After"), body)
	}
	if _, n := f.lastAuth(); n != 1 {
		t.Fatalf("the upstream saw %d requests, want only run-f's first", n)
	}
	if m := f.proxy.MissingCredentials("run-g", f.declare(runspec.Secret{ProjectID: "acme", Key: "GH"}, runspec.Secret{ProjectID: "acme", Key: "B"})); len(m) != 1 || m[0] != "acme/GH" {
		t.Errorf("run-g's missing credentials: %v, want [acme/GH]", m)
	}
	line := f.waitAudit(func(m map[string]any) bool { return m["task"] == "run-g" })
	if line["action"] != "withheld" || line["status"] != float64(503) || fmt.Sprint(line["keys"]) != "[acme/GH]" {
		t.Errorf("the withheld request's audit line: %v", line)
	}
	// The host's own key of run-g is unaffected.
	res, _ = f.get(t, u2, "https://"+f.other+"/b", "Bearer "+f.phOf(t, "run-g", "B"))
	if auth, _ := f.lastAuth(); res.StatusCode != 200 || auth != "Bearer "+realB {
		t.Errorf("the host's own key B: %d", res.StatusCode)
	}
	f.noLeak(t, fleetFirst)
	// The secrets file's value of GH was never even read.
	if got := f.redactor.Redact([]byte("x " + fleetDecoy)); !bytes.Contains(got, []byte(fleetDecoy)) {
		t.Error("the secrets source was read for a key taken from Fleet")
	}
	for _, r := range f.up.requests() {
		if strings.Contains(fmt.Sprint(r.Header)+r.RawQuery, fleetDecoy) || strings.Contains(fmt.Sprint(r.Header)+r.RawQuery, ph2) {
			t.Error("the upstream received the secrets file's value of GH or run-g's placeholder")
		}
	}
}

func (f *fleetEnv) phOf(t *testing.T, runID, key string) string {
	t.Helper()
	keys, err := f.proxy.TaskKeys(runID)
	must(t, err)
	for _, k := range keys {
		if k.Key == key {
			return k.Placeholder
		}
	}
	t.Fatalf("%s has no placeholder for %s", runID, key)
	return ""
}

// A new value (PUT /runs/{id}/credentials) is used from the next request
// on, the placeholder unchanged; answers stay scrubbed of the old value as
// of the new, since an upstream may hand back either. The log redactor
// knows each value before any request carries it.
func TestFleetValueReplacedKeepsThePlaceholderAndScrubsBoth(t *testing.T) {
	f := newFleetEnv(t, "", nil, nil)
	expires := time.Now().Add(time.Hour)
	u, ph := f.run(t, "run-f", fleetValue(fleetFirst, expires))
	if got := f.redactor.Redact([]byte("x " + fleetFirst)); bytes.Contains(got, []byte(fleetFirst)) {
		t.Fatal("the log redactor does not know the value from Fleet once it is set")
	}
	f.get(t, u, "https://"+f.api+"/one", "Bearer "+ph)

	must(t, f.proxy.SetCredentials("run-f", []Credential{fleetValue(fleetSecond, expires.Add(time.Hour))}))
	if got := f.redactor.Redact([]byte("x " + fleetSecond)); bytes.Contains(got, []byte(fleetSecond)) {
		t.Fatal("the log redactor does not know the new value before it is used")
	}
	if again := f.phOf(t, "run-f", "GH"); again != ph {
		t.Fatal("the placeholder changed with the value")
	}
	f.up.handler = func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "old=%s new=%s", fleetFirst, fleetSecond)
	}
	res, body := f.get(t, u, "https://"+f.api+"/two", "Bearer "+ph)
	if auth, n := f.lastAuth(); res.StatusCode != 200 || n != 2 || auth != "Bearer "+fleetSecond {
		t.Fatalf("the request after the new value: %d, the upstream's %d requests, the last with the new value: %v", res.StatusCode, n, auth == "Bearer "+fleetSecond)
	}
	for _, v := range []string{fleetFirst, fleetSecond} {
		leakcheck.AssertClean(t, "the answer", []byte(body), leakcheck.Real{Key: "a value from Fleet", Value: v, Public: len("ghs_")})
	}
	if body != "old="+ph+" new="+ph {
		t.Errorf("the answer %q, want each value replaced by the placeholder", body)
	}
	// The task sending a value itself is the tripwire's.
	res, _ = f.get(t, u, "https://"+f.api+"/three", "Bearer "+fleetSecond)
	if _, n := f.lastAuth(); res.StatusCode != http.StatusForbidden || n != 2 {
		t.Errorf("a task sending the value from Fleet: %d, the upstream saw %d requests", res.StatusCode, n)
	}
	f.noLeak(t, fleetFirst, fleetSecond)
}

// A value past its ExpiresAt is withheld as a missing one is, and named
// missing, until a fresh one comes.
func TestFleetValuePastItsExpiryIsWithheld(t *testing.T) {
	f := newFleetEnv(t, "", nil, nil)
	u, ph := f.run(t, "run-f", fleetValue(fleetFirst, time.Now().Add(-time.Second)))
	res, body := f.get(t, u, "https://"+f.api+"/user", "Bearer "+ph)
	if _, n := f.lastAuth(); res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "withheld: the value of acme/GH this run holds has expired") || n != 0 {
		t.Fatalf("an expired value: %d %q, the upstream saw %d requests", res.StatusCode, body, n)
	}
	declared := f.declare(runspec.Secret{ProjectID: "acme", Key: "GH"})
	if m := f.proxy.MissingCredentials("run-f", declared); len(m) != 1 || m[0] != "acme/GH" {
		t.Errorf("missing %v, want [acme/GH]", m)
	}
	// A value the run holds is scrubbed from its answers even though no
	// request ever sent it.
	f.up.handler = func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "stored="+fleetFirst) }
	res, body = f.get(t, u, "https://"+f.api+"/stored", "none")
	if res.StatusCode != 200 || body != "stored="+ph {
		t.Errorf("an answer holding the value the run holds: %d %q, want it scrubbed to the placeholder", res.StatusCode, body)
	}
	f.up.handler = nil
	must(t, f.proxy.SetCredentials("run-f", []Credential{fleetValue(fleetSecond, time.Now().Add(time.Hour))}))
	res, _ = f.get(t, u, "https://"+f.api+"/user", "Bearer "+ph)
	if auth, n := f.lastAuth(); res.StatusCode != 200 || n != 2 || auth != "Bearer "+fleetSecond {
		t.Fatalf("after a fresh value: %d", res.StatusCode)
	}
	if m := f.proxy.MissingCredentials("run-f", declared); len(m) != 0 {
		t.Errorf("missing %v after a fresh value", m)
	}
	f.noLeak(t, fleetFirst, fleetSecond)
}

// Values live in memory only: a proxy restarted over the same data dir
// knows the run's placeholder but holds no value for it, so the retried
// attempt's requests are withheld until Fleet sends it again; a dropped
// run's values go with it.
func TestFleetValuesDieWithTheProcessAndTheRun(t *testing.T) {
	f := newFleetEnv(t, "", nil, nil)
	u, ph := f.run(t, "run-f", fleetValue(fleetFirst, time.Now().Add(time.Hour)))
	f.get(t, u, "https://"+f.api+"/before", "Bearer "+ph)
	f.proxy.Close()
	f.authority.Close()

	g := newFleetEnv(t, f.dataDir, f.uca, f.up)
	u, again := g.run(t, "run-f")
	if again != ph {
		t.Fatal("the placeholder changed across the restart")
	}
	res, body := g.get(t, u, "https://"+g.api+"/after", "Bearer "+ph)
	if _, n := g.lastAuth(); res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "withheld") || n != 1 {
		t.Fatalf("after the restart: %d %q, the upstream saw %d requests, want 503 withheld and only the first", res.StatusCode, body, n)
	}
	declared := g.declare(runspec.Secret{ProjectID: "acme", Key: "GH"})
	if m := g.proxy.MissingCredentials("run-f", declared); len(m) != 1 {
		t.Errorf("missing %v after the restart, want [acme/GH]", m)
	}
	must(t, g.proxy.SetCredentials("run-f", []Credential{fleetValue(fleetSecond, time.Now().Add(time.Hour))}))
	res, _ = g.get(t, u, "https://"+g.api+"/again", "Bearer "+ph)
	if auth, _ := g.lastAuth(); res.StatusCode != 200 || auth != "Bearer "+fleetSecond {
		t.Fatalf("once Fleet sent the value again: %d", res.StatusCode)
	}

	must(t, g.proxy.Drop("run-f"))
	if err := g.proxy.SetCredentials("run-f", []Credential{fleetValue(fleetFirst, time.Time{})}); err == nil {
		t.Error("a dropped run took a value")
	}
	g.run(t, "run-f")
	if m := g.proxy.MissingCredentials("run-f", declared); len(m) != 1 {
		t.Errorf("a run registered again after its drop still holds a value: missing %v", m)
	}
	f.noLeak(t, fleetFirst, fleetSecond)
	g.noLeak(t, fleetFirst, fleetSecond)
}

// readTree is every file under root by path.
func readTree(t *testing.T, root string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	must(t, filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		out[path] = b
		return err
	}))
	if len(out) == 0 {
		t.Fatalf("no file under %s", root)
	}
	return out
}
