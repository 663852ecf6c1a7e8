package host

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/leakcheck"
)

// Values from Fleet (issue 33) through a whole host: the host API takes
// them with a start and by PUT, admission checks them against the policy,
// the proxy sends them, and nothing of them is written anywhere.

const (
	ghFirst  = "ghs_FirstTokenFromFleet0123456789abcdefAB"
	ghSecond = "ghs_SecondTokenFromFleetZYXWVUTSRQponmlkj"
	ghReused = "ghs_AReusedStartsTokenNeverUsed0123456789"
	// ghDecoy is the secrets file's value for GH: a key taken from Fleet
	// never sends the host's own.
	ghDecoy = "secrets-file-value-of-GH-never-to-be-sent"
)

// newFleetFixture is the fixture with GH, a key its policy takes from
// Fleet, reaching the intercepted upstream as API_TOKEN does.
func newFleetFixture(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t)
	f.keys = map[string]any{"GH": map[string]any{"domains": []string{f.upstreamHost}, "source": "fleet", "placeholder": map[string]any{"prefix": "ghs_", "length": 40}}}
	must(t, os.WriteFile(f.secretsPath, []byte(`{"acme/API_TOKEN": "`+realSecret+`", "acme/GH": "`+ghDecoy+`"}`), 0o600))
	return f
}

func (e *edgeHost) ghAndAPIToken() []runspec.Secret {
	return []runspec.Secret{{ProjectID: "acme", Key: "GH", Domains: []string{e.f.upstreamHost}}, {ProjectID: "acme", Key: "API_TOKEN", Domains: []string{e.f.upstreamHost}}}
}

func fleetValue(key, value string) hostproto.BrokeredValue {
	return hostproto.BrokeredValue{ProjectID: "acme", Key: key, Value: hostproto.SecretString(value), ExpiresAt: time.Now().Add(time.Hour)}
}

func (e *edgeHost) startWith(token string, req runspec.Request, creds ...hostproto.BrokeredValue) hostproto.Run {
	e.f.t.Helper()
	req.Agent = "shell"
	run, err := e.client.Start(bg, hostproto.StartRequest{ClientToken: token, Request: req, Credentials: creds})
	must(e.f.t, err)
	return run
}

// reflectSteps prints GH, then n times waits for a line of input and calls
// the upstream's /reflect with GH, printing the answer and its status.
func reflectSteps(host string, n int) string {
	s := `echo "GH=$GH"`
	for range n {
		s += fmt.Sprintf("\nread step; curl -sS -w ' status=%%{http_code}\\n' -H \"Authorization: Bearer $GH\" https://%s/reflect", host)
	}
	return s
}

// step sends the task its next line of input and waits until its output
// holds want n times.
func (e *edgeHost) step(runID, want string, n int) string {
	e.f.t.Helper()
	_, err := e.client.Input(bg, runID, json.RawMessage(`"go"`))
	must(e.f.t, err)
	var out string
	if !await.Within(30*time.Second, func() bool { out = e.output(runID); return strings.Count(out, want) >= n }) {
		e.f.t.Fatalf("run %s's output never held %q %d times: %q", runID, want, n, out)
	}
	return out
}

func (e *edgeHost) lastSeen() (string, int) {
	saw := e.f.upstreamSaw()
	if len(saw) == 0 {
		return "", 0
	}
	return saw[len(saw)-1], len(saw)
}

// hostError is the host's refusal of a call.
func hostError(t *testing.T, err error, status int, code, mention string) {
	t.Helper()
	var he *hostproto.Error
	if !errors.As(err, &he) || he.Status != status || he.Code != code || !strings.Contains(he.Message, mention) {
		t.Errorf("the host answered %v, want %d %s mentioning %q", err, status, code, mention)
	}
}

// noFleetValue checks that no value from Fleet is in the runs' events (as
// e, running, serves them), the logs of e and of earlier hosts over its
// data dir, or any file of that data dir (the run log, the audit, the
// placeholders, the tasks' directories), in any form.
func noFleetValue(t *testing.T, e *edgeHost, earlier []*edgeHost, runIDs []string, values ...string) {
	t.Helper()
	var reals []leakcheck.Real
	for _, v := range values {
		reals = append(reals, leakcheck.Real{Key: "a value from Fleet", Value: v, Public: len("ghs_")})
	}
	reals = append(reals, leakcheck.Real{Key: "the secrets file's value of GH", Value: ghDecoy})
	for _, id := range runIDs {
		events, err := json.Marshal(e.events(id))
		must(t, err)
		for _, real := range reals {
			leakcheck.AssertClean(t, "run "+id+"'s events", events, real)
		}
	}
	for _, h := range append(earlier, e) {
		for _, real := range reals {
			leakcheck.AssertClean(t, "edge's log", []byte(h.logs.String()), real)
		}
	}
	files := 0
	must(t, filepath.WalkDir(e.f.dataDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		// Written anywhere, a value would be whole: its forms suffice
		// (reading every run of it in a run log of megabytes takes long).
		for _, real := range reals {
			for _, form := range leakcheck.Forms(real.Value) {
				if bytes.Contains(b, []byte(form.Text)) {
					t.Errorf("%s holds %s (%s)", path, real.Key, form.Name)
				}
			}
		}
		return nil
	}))
	if files < 5 {
		t.Errorf("the data dir held %d files, want the run log, the audit and more", files)
	}
}

// A key the policy takes from Fleet is sent with the value the run's start
// carried, never the secrets file's, and the task and its answers see only
// the placeholder; a start reusing the run's clientToken changes nothing;
// PUT /runs/{id}/credentials replaces the value for the next request, the
// placeholder unchanged, and is refused for a key the host takes from its
// own sources and once the run ended.
func TestAKeyFromFleetTakesTheRunsValueAndAPUTReplacesIt(t *testing.T) {
	f := newFleetFixture(t)
	e := f.open(hostOptions{})
	req := runspec.Request{Prompt: reflectSteps(f.upstreamHost, 2), Secrets: e.ghAndAPIToken()}
	run := e.startWith("ct-fleet", req, fleetValue("GH", ghFirst))
	if run.Status != hostproto.StatusAdmitted || len(run.MissingCredentials) != 0 {
		t.Fatalf("the start answered %+v, want admitted and nothing missing", run)
	}
	if again := e.startWith("ct-fleet", req, fleetValue("GH", ghReused)); !again.Reused || again.RunID != run.RunID {
		t.Fatalf("a start reusing the clientToken answered %+v", again)
	}
	ph := envLine(e.waitOutput(run.RunID, "GH="), "GH")
	if !strings.HasPrefix(ph, "ghs_") || len(ph) != 40 {
		t.Fatalf("the task's GH is %q, want a placeholder", ph)
	}
	if got, err := e.client.Get(bg, run.RunID); err != nil || len(got.MissingCredentials) != 0 {
		t.Fatalf("GET the run: %+v %v, want nothing missing", got, err)
	}

	out := e.step(run.RunID, "status=200", 1)
	if seen, n := e.lastSeen(); n != 1 || seen != "Bearer "+ghFirst {
		t.Fatalf("the upstream saw %d requests, the last with the start's value: %v", n, seen == "Bearer "+ghFirst)
	}
	if !strings.Contains(out, "reflected=Bearer "+ph+" status=200") {
		t.Fatalf("the task's answer is not scrubbed to its placeholder: %q", out)
	}

	put, err := e.client.PutCredentials(bg, run.RunID, hostproto.CredentialsRequest{Credentials: []hostproto.BrokeredValue{fleetValue("GH", ghSecond)}})
	if err != nil || put.RunID != run.RunID || put.Status != hostproto.StatusRunning || len(put.MissingCredentials) != 0 {
		t.Fatalf("PUT the run's credentials: %+v %v", put, err)
	}
	_, err = e.client.PutCredentials(bg, run.RunID, hostproto.CredentialsRequest{Credentials: []hostproto.BrokeredValue{fleetValue("API_TOKEN", "sk-live-never-taken-0123456789")}})
	hostError(t, err, http.StatusBadRequest, hostproto.CodeBadRequest, "credentials: the host's policy takes acme/API_TOKEN from its own sources, not from Fleet")
	_, err = e.client.PutCredentials(bg, "run-nope", hostproto.CredentialsRequest{Credentials: []hostproto.BrokeredValue{fleetValue("GH", ghSecond)}})
	if !errors.Is(err, hostproto.ErrRunNotFound) {
		t.Errorf("PUT of an unknown run: %v, want run_not_found", err)
	}

	out = e.step(run.RunID, "status=200", 2)
	if seen, n := e.lastSeen(); n != 2 || seen != "Bearer "+ghSecond {
		t.Fatalf("the upstream saw %d requests, the last with the PUT's value: %v", n, seen == "Bearer "+ghSecond)
	}
	if strings.Count(out, "reflected=Bearer "+ph+" status=200") != 2 {
		t.Fatalf("the placeholder changed with the value, or an answer was not scrubbed: %q", out)
	}
	if end := e.waitEnd(run.RunID); end.Status != hostproto.StatusSucceeded || len(end.MissingCredentials) != 0 {
		t.Fatalf("the run ended %+v", end)
	}
	_, err = e.client.PutCredentials(bg, run.RunID, hostproto.CredentialsRequest{Credentials: []hostproto.BrokeredValue{fleetValue("GH", ghSecond)}})
	hostError(t, err, http.StatusConflict, hostproto.CodeNotRunning, "no live attempt")
	noFleetValue(t, e, nil, []string{run.RunID}, ghFirst, ghSecond, ghReused)
}

// Admission refuses a start whose values from Fleet disagree with the
// policy, naming the key and why, both ways, and never the value; the
// task never starts.
func TestAdmissionRefusesValuesFromFleetTheRunDoesNotTake(t *testing.T) {
	f := newFleetFixture(t)
	e := f.open(hostOptions{})
	const hostValue = "sk-live-sent-for-a-host-key-0123456789"
	for name, tc := range map[string]struct {
		secrets []runspec.Secret
		creds   []hostproto.BrokeredValue
		detail  string
	}{
		"a key from Fleet without a value": {e.ghAndAPIToken(), nil,
			"the host's policy takes acme/GH from Fleet, and Fleet sent no value for it (Fleet has no recipe for it)"},
		"a value for a key the host takes from its own sources": {e.ghAndAPIToken(), []hostproto.BrokeredValue{fleetValue("GH", ghFirst), fleetValue("API_TOKEN", hostValue)},
			"the host's policy takes acme/API_TOKEN from its own sources, not from Fleet"},
	} {
		t.Run(name, func(t *testing.T) {
			run := e.startWith("ct-"+strings.ReplaceAll(name, " ", "-"), runspec.Request{Prompt: "echo started", Secrets: tc.secrets}, tc.creds...)
			if run.Status != hostproto.StatusFailed || run.Reason != hostproto.ReasonKeyNotGranted || run.Detail != tc.detail {
				t.Fatalf("the start answered %+v, want failed key_not_granted %q", run, tc.detail)
			}
			if strings.Contains(e.output(run.RunID), "started") {
				t.Error("the refused run's task started")
			}
			noFleetValue(t, e, nil, []string{run.RunID}, ghFirst, hostValue)
		})
	}
	if _, n := e.lastSeen(); n != 0 {
		t.Errorf("the upstream saw %d requests", n)
	}
}

// After a restart the host holds no value from Fleet (memory only): a
// retried attempt's requests that would carry the key are answered 503
// withheld, never sent with the placeholder, and the run names the key in
// missingCredentials until Fleet PUTs it again; the placeholder is the
// run's as before.
func TestAfterARestartARetriedRunWaitsForItsValueFromFleet(t *testing.T) {
	f := newFleetFixture(t)
	e := f.open(hostOptions{})
	run := e.startWith("ct-restart", runspec.Request{Prompt: reflectSteps(f.upstreamHost, 2), Secrets: e.ghAndAPIToken()}, fleetValue("GH", ghFirst))
	e.waitOutput(run.RunID, "GH=")
	e.step(run.RunID, "status=200", 1)
	e.step(run.RunID, "status=200", 2)
	e.waitEnd(run.RunID)
	first := envLine(e.output(run.RunID), "GH")
	e.shutdown()

	e2 := f.open(hostOptions{})
	again, err := e2.client.Retry(bg, run.RunID)
	if err != nil || again.Attempt != 2 || fmt.Sprint(again.MissingCredentials) != "[acme/GH]" {
		t.Fatalf("the retry after the restart answered %+v %v, want attempt 2 missing acme/GH", again, err)
	}
	if !await.Within(30*time.Second, func() bool { return strings.Count(e2.output(run.RunID), "GH=") == 2 }) {
		t.Fatalf("the retried attempt never started: %q", e2.output(run.RunID))
	}
	out := e2.step(run.RunID, "status=503", 1)
	if !strings.Contains(out, "withheld: this run holds no value of acme/GH yet") {
		t.Fatalf("the task's request without a value from Fleet: %q, want 503 withheld", out)
	}
	if _, n := e2.lastSeen(); n != 2 {
		t.Fatalf("the upstream saw %d requests, want attempt 1's two alone", n)
	}
	if got, err := e2.client.Get(bg, run.RunID); err != nil || fmt.Sprint(got.MissingCredentials) != "[acme/GH]" {
		t.Fatalf("GET the retried run: %+v %v, want missingCredentials [acme/GH]", got, err)
	}
	put, err := e2.client.PutCredentials(bg, run.RunID, hostproto.CredentialsRequest{Credentials: []hostproto.BrokeredValue{fleetValue("GH", ghSecond)}})
	if err != nil || len(put.MissingCredentials) != 0 {
		t.Fatalf("PUT after the restart: %+v %v", put, err)
	}
	if got, _ := e2.client.Get(bg, run.RunID); len(got.MissingCredentials) != 0 {
		t.Fatalf("GET after the PUT: %+v, want nothing missing", got)
	}
	out = e2.step(run.RunID, "status=200", 3)
	if seen, n := e2.lastSeen(); n != 3 || seen != "Bearer "+ghSecond {
		t.Fatalf("the upstream saw %d requests, the last with the PUT's value: %v", n, seen == "Bearer "+ghSecond)
	}
	e2.waitEnd(run.RunID)
	lines := 0
	for _, line := range strings.Split(e2.output(run.RunID), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), "GH="); ok {
			lines++
			if v != first {
				t.Errorf("the placeholder changed across the restart")
			}
		}
	}
	if lines != 2 {
		t.Errorf("the output has %d GH= lines, want one per attempt", lines)
	}
	for _, s := range f.upstreamSaw() {
		if strings.Contains(s, first) || strings.Contains(s, ghDecoy) {
			t.Error("the upstream got the placeholder or the secrets file's value")
		}
	}
	noFleetValue(t, e2, []*edgeHost{e}, []string{run.RunID}, ghFirst, ghSecond)
}
