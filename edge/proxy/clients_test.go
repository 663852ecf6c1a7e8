package proxy

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// goClientEnv makes this test binary act as a task's Go program: net/http's
// default client, configured only by HTTPS_PROXY and SSL_CERT_FILE.
const goClientEnv = "RUNFLEET_PROXY_TEST_GO_CLIENT"

func TestMain(m *testing.M) {
	if url := os.Getenv(goClientEnv); url != "" {
		os.Exit(goClientMain(url))
	}
	if os.Getenv(benchChildEnv) != "" {
		os.Exit(benchChildMain())
	}
	os.Exit(m.Run())
}

func goClientMain(url string) int {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("key="+os.Getenv("OPENAI_API_KEY")))
	req.Header.Set("Authorization", "Bearer "+os.Getenv("OPENAI_API_KEY"))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	fmt.Printf("%s\n", res.Status)
	res.Header.Write(os.Stdout)
	fmt.Printf("\n%s", body)
	return 0
}

const pythonClient = `
import os, requests
r = requests.post(os.environ["URL"], headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
                  data="key=" + os.environ["OPENAI_API_KEY"])
print(r.status_code)
for k, v in r.headers.items():
    print(k + ": " + v)
print(r.text)
`

// The three kinds of client a task runs, configured only through the
// standard variables, reach a loopback HTTPS upstream through the proxy with
// the placeholder; the upstream gets the real value and echoes it back (in
// a header and in the body, as APIs quoting a key in an error do); nothing
// the client sees, and nothing logged, holds it: the client gets its
// placeholder back instead.
func TestRealClientsGetTheirPlaceholderSubstituted(t *testing.T) {
	if err := exec.Command("/usr/bin/python3", "-c", "import requests").Run(); err != nil {
		t.Fatalf("%v: run infra/scripts/test-deps.sh (make test does) to install Debian's python3-requests", err)
	}
	uca := edgetest.NewCA(t)
	up := startUpstream(t, uca, true, "api.example.test")
	up.handler = func(w http.ResponseWriter, r *http.Request) {
		got := up.requests() // the recording upstream read the body
		body := got[len(got)-1].Body
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("X-Echo-Authorization", r.Header.Get("Authorization"))
		fmt.Fprintf(w, "hello from upstream; you sent %s and %s\n", r.Header.Get("Authorization"), body)
	}
	const real = "sk-real-value-0123456789-abcdef"
	e := newEnv(t, envOptions{
		uca:     uca,
		pins:    map[string]string{"api.example.test": "127.0.0.1"},
		keys:    fmt.Sprintf(`{"acme": {"keys": {"OPENAI_API_KEY": {"domains": ["api.example.test:%d"], "in": ["header", "body"], "placeholder": {"prefix": "sk-"}}}}}`, up.port),
		secrets: map[string]string{"acme/OPENAI_API_KEY": real},
	})
	proxyURL, phs := e.task("run-clients", runspec.Secret{ProjectID: "acme", Key: "OPENAI_API_KEY"})
	ph := phs["OPENAI_API_KEY"]
	if !strings.HasPrefix(ph, "sk-") || len(ph) != 48 {
		t.Fatalf("placeholder shape: %d chars", len(ph))
	}
	target := fmt.Sprintf("https://api.example.test:%d/v1/models", up.port)
	clientEnv := e.clientEnv(proxyURL, "OPENAI_API_KEY="+ph, "URL="+target)

	outputs := map[string]string{
		"curl":   runClient(t, clientEnv, "/usr/bin/curl", "-sS", "-i", "-H", "Authorization: Bearer "+ph, "--data", "key="+ph, target),
		"python": runClient(t, clientEnv, "/usr/bin/python3", "-c", pythonClient),
		"go":     runClient(t, append(clientEnv, goClientEnv+"="+target), os.Args[0]),
	}
	got := up.requests()
	if len(got) != 3 {
		t.Fatalf("upstream got %d requests, want 3", len(got))
	}
	for i, r := range got {
		if r.Header.Get("Authorization") != "Bearer "+real || string(r.Body) != "key="+real {
			t.Errorf("request %d reached the upstream without the real value", i)
		}
		if r.Host != fmt.Sprintf("api.example.test:%d", up.port) || r.Path != "/v1/models" {
			t.Errorf("request %d: host %q path %q", i, r.Host, r.Path)
		}
		if r.Header.Get("Proxy-Authorization") != "" {
			t.Errorf("request %d carried the proxy credential upstream", i)
		}
	}
	for name, out := range outputs {
		if !strings.Contains(out, "hello from upstream; you sent Bearer "+ph+" and key="+ph+"\n") {
			t.Errorf("%s did not get the upstream's answer with its placeholder echoed: %s", name, out)
		}
		if !regexp.MustCompile(`(?i)X-Echo-Authorization: Bearer ` + ph).MatchString(out) {
			t.Errorf("%s did not get the echoing header with its placeholder: %s", name, out)
		}
		if strings.Contains(out, real) {
			t.Errorf("%s saw the real value", name)
		}
	}
	line := e.waitAudit(func(m map[string]any) bool { return m["action"] == "substituted" })
	if line["task"] != "run-clients" || fmt.Sprint(line["keys"]) != "[acme/OPENAI_API_KEY]" || line["path"] != "/v1/models" ||
		line["status"] != float64(200) || line["scrubbed"] != float64(3) {
		t.Errorf("audit line = %v", line)
	}
	e.assertNoLeak(real, ph, proxyURL.User.String())
}
