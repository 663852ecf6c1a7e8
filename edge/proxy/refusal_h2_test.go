package proxy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// TestAnHTTP2RefusalReachesAClientStillSendingItsBody: a request refused
// before its body is read (here a placeholder in a header where its key
// is substituted only in the body) gets its 403 and reason whole over
// HTTP/2 too, while curl is still uploading: the refusal ends the
// connection (GOAWAY), and ending it with the body unread reset the
// stream, so curl lost the answer about one time in five ("curl: (18)
// Transferred a partial file"). Edge reads the rest of the body first, as
// HTTP/1.1 does, and the upstream gets nothing.
func TestAnHTTP2RefusalReachesAClientStillSendingItsBody(t *testing.T) {
	uca := edgetest.NewCA(t)
	up := startUpstream(t, uca, true, "api.example.test")
	e := newEnv(t, envOptions{
		uca:     uca,
		pins:    map[string]string{"api.example.test": "127.0.0.1"},
		keys:    fmt.Sprintf(`{"acme": {"keys": {"K": {"domains": ["api.example.test:%d"], "in": ["body"]}}}}`, up.port),
		secrets: map[string]string{"acme/K": "real-value-of-k-0123456789"},
	})
	proxyURL, phs := e.task("run-h2-refusal", runspec.Secret{ProjectID: "acme", Key: "K"})
	body := filepath.Join(t.TempDir(), "body")
	if err := os.WriteFile(body, []byte(strings.Repeat("x", 4<<20)), 0o600); err != nil {
		t.Fatal(err)
	}
	target := fmt.Sprintf("https://api.example.test:%d/upload", up.port)
	env := e.clientEnv(proxyURL)
	for i := range 20 {
		out := runClient(t, env, "/usr/bin/curl", "-sS", "--http2", "-o", "-", "-w", "\nstatus=%{http_code} http=%{http_version}\n",
			"-H", "Authorization: Bearer "+phs["K"], "--data-binary", "@"+body, target)
		if !strings.Contains(out, "status=403 http=2") || !strings.Contains(out, "substituted only in the body") {
			t.Fatalf("attempt %d: curl got %s", i, out)
		}
	}
	if n := len(up.requests()); n != 0 {
		t.Fatalf("the upstream got %d requests", n)
	}
}
