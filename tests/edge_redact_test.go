package tests

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
)

// edge serve's last line of defence: once the proxy has read a value, a
// task that sends that value itself (one that learned it) does not get it
// into edge's log or audit file: the lines hold "[redacted]". The upstream
// is pinned to a loopback port nothing listens on, so the requests go no
// further than the proxy; those holding the value are refused by the
// tripwire before that (403).
func TestEdgeServeRedactsValuesFromItsLogAndAudit(t *testing.T) {
	const value = "real-api-key-value"
	e := newEdgeProc(t)
	e.proxy = `{"listen": "127.0.0.1:0", "upstream": {"resolve": {"api.example.com": "127.0.0.1"}, "allowPrivate": ["127.0.0.0/8"]}}`
	e.writeConfig()
	e.start()
	prompt := `set -u
curl -sS -o /dev/null -w 'first=%{http_code}\n' -H "Authorization: Bearer $API_KEY" https://api.example.com/first
curl -sS -o /dev/null -w 'path=%{http_code}\n' https://api.example.com/` + value + `
curl -sS -o /dev/null -w 'host=%{http_code}\n' -H "X: $API_KEY" https://` + value + `.api.example.com:1/ 2>&1 | head -c 0
true`
	run := e.run(hostproto.StartRequest{
		Request: runspec.Request{
			Agent:   "shell",
			Prompt:  prompt,
			Secrets: []runspec.Secret{{ProjectID: "acme", Key: "API_KEY", Domains: []string{"api.example.com"}}},
		},
	})
	end := e.waitFor(run.RunID, terminal)
	out, _ := e.output(run.RunID, 0)
	if end.Status != hostproto.StatusSucceeded || !strings.Contains(out, "first=502") || !strings.Contains(out, "path=403") {
		t.Fatalf("run ended %+v: %s", end, out)
	}
	// The redactor holds the one value: nothing was forgotten past its bound.
	metrics, err := e.client.Metrics(context.Background())
	must(t, err)
	if !strings.Contains(string(metrics), "\nedge_log_redactor_evicted_total 0\n") {
		t.Errorf("no edge_log_redactor_evicted_total 0 in the metrics")
	}
	if code := e.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("edge exited %d", code)
	}
	files, _ := filepath.Glob(filepath.Join(e.dir, "data", "logs", "proxy-audit.jsonl*"))
	var audit strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(f)
		must(t, err)
		audit.Write(b)
	}
	logs := e.logs.String()
	if strings.Contains(strings.ToLower(audit.String()+logs), value) {
		t.Fatalf("the value reached edge's log or audit:\naudit:\n%s\nlog:\n%s", audit.String(), logs)
	}
	if !strings.Contains(audit.String(), `"path":"/[redacted]"`) {
		t.Fatalf("the task's request with the value in its path is not in the audit, redacted:\n%s", audit.String())
	}
	if !strings.Contains(logs, "secrets proxy request failed") {
		t.Fatalf("the failed requests were not logged:\n%s", logs)
	}
}
