package host

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// apiToken declares the fixture's key for the one domain its policy grants
// it.
func (e *edgeHost) apiToken() []runspec.Secret {
	return []runspec.Secret{{ProjectID: "acme", Key: "API_TOKEN", Domains: []string{e.f.upstreamHost}}}
}

func TestTaskGetsThePlaceholderAndTheUpstreamTheRealValue(t *testing.T) {
	f := newFixture(t)
	e := f.open(hostOptions{})
	prompt := fmt.Sprintf(`env
curl -sS --fail -H "Authorization: Bearer $API_TOKEN" https://%s/echo; echo
curl -sS --fail https://%s/; echo`, f.upstreamHost, f.tunnelHost)
	run := e.start(runspec.Request{Prompt: prompt, Secrets: e.apiToken()})
	end := e.waitEnd(run.RunID)
	out := e.output(run.RunID)
	if end.Status != hostproto.StatusSucceeded {
		t.Fatalf("run ended %+v: %s", end, out)
	}
	placeholder := envLine(out, "API_TOKEN")
	if !strings.HasPrefix(placeholder, "ph-") || len(placeholder) != 40 {
		t.Fatalf("the task's API_TOKEN is %q, want a placeholder", placeholder)
	}
	if strings.Contains(out, realSecret) {
		t.Fatal("the task saw the real value")
	}
	trust := envLine(out, "SSL_CERT_FILE")
	for _, v := range []string{"REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "AWS_CA_BUNDLE"} {
		if envLine(out, v) != trust {
			t.Errorf("%s = %q, want the trust file %q", v, envLine(out, v), trust)
		}
	}
	bundle, _ := os.ReadFile(envLine(out, "NODE_EXTRA_CA_CERTS"))
	if string(bundle) != string(e.CABundle()) {
		t.Error("NODE_EXTRA_CA_CERTS is not the CA bundle alone")
	}
	trustPEM, _ := os.ReadFile(trust)
	sys, _ := os.ReadFile(f.systemRoots)
	if !strings.HasPrefix(string(trustPEM), string(sys)) || !strings.HasSuffix(string(trustPEM), string(e.CABundle())) {
		t.Error("the trust file is not the system roots followed by the CA bundle")
	}
	var proxied []map[string]any
	if err := json.Unmarshal([]byte(envLine(out, "RUNFLEET_PROXIED_KEYS")), &proxied); err != nil || len(proxied) != 1 ||
		proxied[0]["key"] != "API_TOKEN" || fmt.Sprint(proxied[0]["domains"]) != "["+f.upstreamHost+"]" {
		t.Errorf("RUNFLEET_PROXIED_KEYS = %s", envLine(out, "RUNFLEET_PROXIED_KEYS"))
	}
	if u, err := url.Parse(envLine(out, "HTTPS_PROXY")); err != nil || u.User.Username() != run.RunID || envLine(out, "https_proxy") != u.String() {
		t.Errorf("HTTPS_PROXY = %q, want the task's own credential", envLine(out, "HTTPS_PROXY"))
	}
	if !strings.Contains(out, "upstream-ok") || !strings.Contains(out, "tunnel-ok") {
		t.Fatalf("the intercepted or the tunnelled call failed: %s", out)
	}
	if saw := f.upstreamSaw(); len(saw) != 1 || saw[0] != "Bearer "+realSecret {
		t.Fatalf("the upstream saw %q, want the real value", saw)
	}
	raw, _ := json.Marshal(e.events(run.RunID))
	if strings.Contains(string(raw), realSecret) {
		t.Fatal("the run's events hold the real value")
	}
	metrics, err := e.client.Metrics(bg)
	must(t, err)
	for _, want := range []string{`edge_proxy_decisions_total{action="substituted"} 1`, `edge_proxy_decisions_total{action="tunnelled"} 1`, `edge_runs{status="succeeded"} 1`} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// The audit batches its lines (audit.FlushEvery, on the host's clock): a
// clean shutdown writes every line recorded, however recent. The fake clock
// never moves here, so no timed flush writes them first.
func TestCleanShutdownWritesEveryAuditLine(t *testing.T) {
	f := newFixture(t)
	e := f.open(hostOptions{clock: clock.NewFake(time.Now())})
	run := e.start(runspec.Request{Prompt: fmt.Sprintf(`curl -sS --fail -H "Authorization: Bearer $API_TOKEN" https://%s/echo`, f.upstreamHost), Secrets: e.apiToken()})
	if end := e.waitEnd(run.RunID); end.Status != hostproto.StatusSucceeded {
		t.Fatalf("run ended %+v: %s", end, e.output(run.RunID))
	}
	e.shutdown()
	b, err := os.ReadFile(filepath.Join(f.dataDir, "logs", audit.FileName))
	must(t, err)
	if !strings.Contains(string(b), `"action":"substituted"`) || !strings.Contains(string(b), `"task":"`+run.RunID+`"`) {
		t.Fatalf("the audit file after a clean shutdown lacks the run's request: %q", b)
	}
}

func TestRestartKeepsPlaceholdersAndTheCAAndPurgeDropsThem(t *testing.T) {
	f := newFixture(t)
	f.runner = map[string]any{"retention": "2h"}
	fake := clock.NewFake(time.Now())
	e := f.open(hostOptions{clock: fake})
	run := e.start(runspec.Request{Prompt: `echo "token=$API_TOKEN"`, Secrets: e.apiToken()})
	e.waitEnd(run.RunID)
	placeholder := envLine(e.output(run.RunID), "token")
	bundle := string(e.CABundle())
	e.shutdown()

	e = f.open(hostOptions{clock: fake})
	if string(e.CABundle()) != bundle {
		t.Fatal("the CA changed across a restart")
	}
	again, err := e.client.Retry(bg, run.RunID)
	if err != nil || again.Attempt != 2 {
		t.Fatalf("retry after the restart: %+v %v", again, err)
	}
	e.waitEnd(run.RunID)
	out := e.output(run.RunID)
	if strings.Count(out, "token="+placeholder) != 2 {
		t.Fatalf("the placeholder changed across the restart: %q", out)
	}
	stored := filepath.Join(f.dataDir, "secrets-proxy", "placeholders", run.RunID+".json")
	if _, err := os.Stat(stored); err != nil {
		t.Fatalf("the run's placeholders are not where the proxy keeps them: %v", err)
	}
	// Past runner.retention the run goes: events, placeholders, directories.
	// The purge runs hourly on a goroutine of its own, and counts a pass in
	// edge_purge_passes_total once the next one is armed: each hour is over
	// when the count moves, and only then may the clock move on. (Counting
	// pending timers cannot tell: other timers of the host re-arm too.)
	passes := e.metric("edge_purge_passes_total")
	for hour := 1; hour <= 3; hour++ {
		fake.Advance(time.Hour)
		want := fmt.Sprint(hour)
		if !await.Within(10*time.Second, func() bool { passes = e.metric("edge_purge_passes_total"); return passes == want }) {
			t.Fatalf("hour %d: edge_purge_passes_total = %q, want %s", hour, passes, want)
		}
		_, err := e.client.Get(bg, run.RunID)
		switch {
		case hour < 3 && err != nil:
			t.Fatalf("%dh after the run ended (retention 2h): %v", hour, err)
		case hour == 3 && !errors.Is(err, hostproto.ErrRunNotFound):
			t.Fatalf("3h after the run ended (retention 2h) it is still there: %v", err)
		}
	}
	if got := e.metric("edge_runs_purged_total"); got != "1" {
		t.Errorf("edge_runs_purged_total = %q, want 1", got)
	}
	if _, err := os.Stat(stored); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the purged run's placeholders remain: %v", err)
	}
	if _, err := os.Stat(filepath.Join(f.dataDir, "work", run.RunID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the purged run's directories remain: %v", err)
	}
}

func TestTaskUserCannotReadEdgesFilesOrAnotherTasksDir(t *testing.T) {
	f := newFixture(t)
	e := f.open(hostOptions{})
	// Task A keeps a file in its work dir and runs on, its env holding its
	// placeholder and proxy credential.
	a := e.start(runspec.Request{Prompt: `echo private > mine.txt; echo "ns=$(readlink /proc/$$/ns/pid)"; sleep 1000`, Secrets: e.apiToken()})
	outA := e.waitOutput(a.RunID, "]")
	// Task A's shell as the host knows it: its id in A's own PID namespace
	// means nothing outside.
	pidA := processIn(t, strings.Fields(outA[strings.Index(outA, "ns=")+3:])[0], "mine.txt")
	runDirA := filepath.Join(f.dataDir, "work", a.RunID)
	if _, err := os.Stat(filepath.Join(runDirA, "work", "mine.txt")); err != nil {
		t.Fatalf("task A's file: %v", err)
	}
	targets := map[string]string{
		"seal key":          filepath.Join(f.dataDir, "seal.key"),
		"secrets file":      f.secretsPath,
		"host token":        f.tokenPath,
		"run log":           filepath.Join(f.dataDir, "runs.db"),
		"data dir":          f.dataDir,
		"other task's dir":  filepath.Join(runDirA, "work"),
		"other task's file": filepath.Join(runDirA, "work", "mine.txt"),
		"other task's env":  fmt.Sprintf("/proc/%d/environ", pidA),
		"other task's cwd":  fmt.Sprintf("/proc/%d/cwd/mine.txt", pidA),
	}
	var script strings.Builder
	script.WriteString("echo own > own.txt\n")
	for name, path := range targets {
		fmt.Fprintf(&script, "if [ -d %q ]; then ls %q >/dev/null 2>&1 && echo \"READ:%s\" || echo \"DENIED:%s\"; else cat %q >/dev/null 2>&1 && echo \"READ:%s\" || echo \"DENIED:%s\"; fi\n",
			path, path, name, name, path, name, name)
	}
	// The positive control: the same check reads the task's own file.
	script.WriteString(`cat own.txt >/dev/null 2>&1 && echo "READ:own file" || echo "DENIED:own file"` + "\n")
	b := e.start(runspec.Request{Prompt: script.String(), Secrets: e.apiToken()})
	e.waitEnd(b.RunID)
	out := e.output(b.RunID)
	for name := range targets {
		if !strings.Contains(out, "DENIED:"+name) || strings.Contains(out, "READ:"+name) {
			t.Errorf("the task user could read the %s (%s)", name, targets[name])
		}
	}
	if !strings.Contains(out, "READ:own file") {
		t.Fatalf("the control failed: the task could not read its own file: %s", out)
	}
	if _, err := e.client.Cancel(bg, a.RunID); err != nil {
		t.Fatal(err)
	}
	e.waitEnd(a.RunID)
}

func TestCancelRevokesProxyAccessAtOnce(t *testing.T) {
	f := newFixture(t)
	e := f.open(hostOptions{})
	run := e.start(runspec.Request{Prompt: `echo "proxy=$HTTPS_PROXY"; sleep 1000`, Secrets: e.apiToken()})
	out := e.waitOutput(run.RunID, "proxy=")
	proxyURL := strings.TrimSpace(strings.TrimPrefix(out[strings.Index(out, "proxy="):], "proxy="))
	call := func() string {
		cmd := exec.Command("/usr/bin/curl", "-sS", "-o", "/dev/null", "-w", "%{http_connect}", "--cacert", filepath.Join(f.dataDir, "work", run.RunID, "trust", "trust.pem"),
			"--proxy", proxyURL, "https://"+f.upstreamHost+"/")
		b, _ := cmd.CombinedOutput()
		return string(b)
	}
	if got := call(); !strings.HasPrefix(got, "200") {
		t.Fatalf("the live attempt's credential is refused: %s", got)
	}
	if _, err := e.client.Cancel(bg, run.RunID); err != nil {
		t.Fatal(err)
	}
	// Revoked at once: before the process has even ended.
	if got := call(); !strings.Contains(got, "response 407") {
		t.Fatalf("after cancel the credential still passes the proxy: %s", got)
	}
	if end := e.waitEnd(run.RunID); end.Status != hostproto.StatusCanceled {
		t.Fatalf("run ended %+v", end)
	}
}

func TestKillSwitchRefusesSecretsAndStillRunsTheRest(t *testing.T) {
	f := newFixture(t)
	e := f.open(hostOptions{killSwitch: true})
	h, err := e.client.Health(bg)
	if err != nil || h.Features.SecretsProxy || !h.Features.ExecRequire {
		t.Fatalf("health with the kill switch on: %+v %v", h, err)
	}
	marker := filepath.Join(f.dir, "spawned")
	must(t, os.Chmod(f.dir, 0o777))
	refused := e.start(runspec.Request{Prompt: "touch " + marker, Secrets: e.apiToken()})
	if refused.Status != hostproto.StatusFailed || refused.Reason != hostproto.ReasonBrokerNotReady {
		t.Fatalf("a run with secrets under the kill switch answered %+v", refused)
	}
	if e.metric("edge_task_processes_started_total") != "0" {
		t.Fatal("a process was spawned")
	}
	plain := e.start(runspec.Request{Prompt: "echo plain-ok"})
	if end := e.waitEnd(plain.RunID); end.Status != hostproto.StatusSucceeded || !strings.Contains(e.output(plain.RunID), "plain-ok") {
		t.Fatalf("a run without secrets ended %+v", end)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the refused run's command ran")
	}
}

func TestKeyTheHostDoesNotGrantIsRefusedNamingIt(t *testing.T) {
	f := newFixture(t)
	e := f.open(hostOptions{})
	run := e.start(runspec.Request{Prompt: "echo nope", Secrets: append(e.apiToken(), runspec.Secret{ProjectID: "acme", Key: "OTHER_KEY", Domains: []string{f.upstreamHost}})})
	if run.Status != hostproto.StatusFailed || run.Reason != hostproto.ReasonKeyNotGranted {
		t.Fatalf("answered %+v", run)
	}
	var detail string
	for _, ev := range e.events(run.RunID) {
		if ev.Type == hostproto.EventState {
			var s hostproto.StateChange
			json.Unmarshal(ev.Data, &s)
			detail = s.Detail
		}
	}
	if !strings.Contains(detail, "acme/OTHER_KEY") {
		t.Fatalf("the refusal does not name the key: %q", detail)
	}
	// A granted key asked for a domain the host policy does not give it.
	wider := e.start(runspec.Request{Prompt: "echo nope", Secrets: []runspec.Secret{{ProjectID: "acme", Key: "API_TOKEN", Domains: []string{"evil.example.test"}}}})
	if wider.Status != hostproto.StatusFailed || wider.Reason != hostproto.ReasonKeyNotGranted {
		t.Fatalf("a key declared for a domain outside the policy answered %+v", wider)
	}
	if e.metric("edge_task_processes_started_total") != "0" {
		t.Fatal("a process was spawned")
	}
}

func TestCancelOrDrainBetweenAdmissionAndExecStartsNothing(t *testing.T) {
	for _, race := range []string{"cancel", "drain"} {
		t.Run(race, func(t *testing.T) {
			f := newFixture(t)
			var e *edgeHost
			e = f.open(hostOptions{beforeExec: func(runID string) {
				if race == "cancel" {
					if _, err := e.client.Cancel(bg, runID); err != nil {
						t.Errorf("cancel in the hook: %v", err)
					}
				} else if _, err := e.client.Drain(bg); err != nil {
					t.Errorf("drain in the hook: %v", err)
				}
			}})
			marker := filepath.Join(f.dir, "spawned")
			must(t, os.Chmod(f.dir, 0o777))
			run := e.start(runspec.Request{Prompt: "touch " + marker, Secrets: e.apiToken()})
			err := e.Runner().WaitForStart(bg, run.RunID)
			end := e.waitEnd(run.RunID)
			want := map[string]string{"cancel": hostproto.ReasonCanceled, "drain": hostproto.ReasonHostUnavailable}[race]
			if err == nil || end.Reason != want {
				t.Fatalf("WaitForStart = %v, run ended %+v; want refused %s", err, end, want)
			}
			if e.metric("edge_task_processes_started_total") != "0" || e.metric("edge_admission_tickets") != "0" {
				t.Fatal("a process started, or the ticket was not released")
			}
			if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
				t.Fatal("the task's command ran")
			}
		})
	}
}

func TestTrustFileFollowsTheCAsRotation(t *testing.T) {
	f := newFixture(t)
	f.caCfg = map[string]any{"lifetime": "10m", "successorWindow": "4m", "switchBefore": "1m", "leafLifetime": "2m"}
	fake := clock.NewFake(time.Now())
	e := f.open(hostOptions{clock: fake})
	run := e.start(runspec.Request{Prompt: `echo up; sleep 1000`, Secrets: e.apiToken()})
	e.waitOutput(run.RunID, "up")
	bundlePath := filepath.Join(f.dataDir, "work", run.RunID, "trust", "ca-bundle.pem")
	first, _ := os.ReadFile(bundlePath)
	if string(first) != string(e.CABundle()) || strings.Count(string(first), "BEGIN CERTIFICATE") != 1 {
		t.Fatalf("the task's CA bundle is not the CA's (%d certificates)", strings.Count(string(first), "BEGIN CERTIFICATE"))
	}
	// Into the successor window: the CA mints a successor and delivers the
	// two-certificate bundle to every running task.
	fake.Advance(7 * time.Minute)
	await.Cond(t, 20*time.Second, "the task's trust files to receive the new bundle", func() bool {
		now, _ := os.ReadFile(bundlePath)
		trust, _ := os.ReadFile(filepath.Join(f.dataDir, "work", run.RunID, "trust", "trust.pem"))
		return strings.Count(string(now), "BEGIN CERTIFICATE") == 2 && string(now) == string(e.CABundle()) && strings.HasSuffix(string(trust), string(now))
	})
	e.client.Cancel(bg, run.RunID)
	fake.Advance(10 * time.Second)
	e.waitEnd(run.RunID)
}

func TestHostAPIOverTLS(t *testing.T) {
	f := newFixture(t)
	f.serveAPIOverTLS()
	e := f.open(hostOptions{})
	client, err := hostproto.NewClient(hostproto.ClientConfig{BaseURL: "https://" + e.APIAddr().String(), Token: hostToken, CAPEM: string(f.ca.PEM)})
	must(t, err)
	h, err := client.Health(bg)
	if err != nil || !h.OK || !h.Features.SecretsProxy || h.CA == nil {
		t.Fatalf("health over TLS: %+v %v", h, err)
	}
	resp, err := http.Get("http://" + e.APIAddr().String() + "/healthz")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatal("the TLS host API answered plain HTTP")
		}
	}
}

func TestOpenRefusesAHostTokenSecretsFileOrTLSKeyEveryoneCanRead(t *testing.T) {
	f := newFixture(t)
	keyFile := f.serveAPIOverTLS()
	f.writeConfig()
	for field, path := range map[string]string{"api.tokenFile": f.tokenPath, "secrets.file": f.secretsPath, "api.tls.keyFile": keyFile} {
		must(t, os.Chmod(path, 0o644))
		cfg, err := config.Load(f.cfgPath)
		must(t, err)
		_, err = Open(bg, Options{Config: cfg, SystemRootsFile: f.systemRoots})
		if err == nil || !strings.Contains(err.Error(), field) || !strings.Contains(err.Error(), "readable by every user") {
			t.Errorf("Open with a world-readable %s = %v", field, err)
		}
		// Refused before anything is written: no data dir, so no CA.
		if _, err := os.Stat(f.dataDir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Open refused a world-readable %s, but made %s (%v)", field, f.dataDir, err)
		}
		must(t, os.Chmod(path, 0o600))
	}
}

// processIn is the host's id of the process in PID namespace ns (as
// readlink /proc/<pid>/ns/pid says it) whose command line holds marker.
func processIn(t *testing.T, ns, marker string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	must(t, err)
	for _, e := range entries {
		if link, err := os.Readlink("/proc/" + e.Name() + "/ns/pid"); err != nil || link != ns {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if strings.Contains(string(cmdline), marker) {
			pid, _ := strconv.Atoi(e.Name())
			return pid
		}
	}
	t.Fatalf("no process of namespace %s runs %q", ns, marker)
	return 0
}

func TestTheDataDirIsPassableOnlyWhenTasksWorkInside(t *testing.T) {
	for _, c := range []struct {
		dataDir, workDir string
		want             os.FileMode
	}{
		{"/var/lib/edge", "/var/lib/edge/work", 0o711},
		{"/var/lib/edge", "/var/lib/edge/a/b", 0o711},
		{"/var/lib/edge", "/srv/work", 0o700},
		{"/var/lib/edge", "/var/lib/edge-work", 0o700},
	} {
		cfg := &config.Config{DataDir: c.dataDir}
		cfg.Runner.WorkDir = c.workDir
		if got := dataDirMode(cfg); got != c.want {
			t.Errorf("data dir %s with work dir %s: mode %04o, want %04o", c.dataDir, c.workDir, got, c.want)
		}
	}
}
