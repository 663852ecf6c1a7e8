package proxy

import (
	"net/http"
	"strings"
	"testing"
)

// A task that sends its placeholder in an Upgrade the proxy refuses (a
// byte no protocol name holds) must not get the real value into edge's log:
// the header is substituted before the upgrade is checked, and the refusal
// once quoted it (issue 12).
func TestLeakInvalidUpgradeDoesNotLogTheValue(t *testing.T) {
	for _, junk := range []string{"x\t", "\x80"} {
		f := newFixture(t, "open")
		tc, br := f.dialIntercepted(f.proxyURL, f.api, "api.example.test")
		res, body := roundTrip(t, tc, br, "GET /up HTTP/1.1\r\nHost: "+f.api+"\r\nConnection: Upgrade\r\nUpgrade: "+junk+f.phA+"\r\n\r\n")
		tc.Close()
		if res.StatusCode < 400 || strings.Contains(body, realA) {
			t.Fatalf("%q: %d %q", junk, res.StatusCode, body)
		}
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("%q: status %d, want 400", junk, res.StatusCode)
		}
		f.assertNoLeak(realA, f.phA)
	}
}
