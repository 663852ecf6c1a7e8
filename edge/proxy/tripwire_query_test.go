package proxy

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/proxy/placeholder"
	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/runspec"
)

// percentEncodeAll writes every byte of s as %XX, as an encoder that
// escapes everything does: a form no redact.Set form matches, which only
// the tripwire's decoding of the query finds.
func percentEncodeAll(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "%%%02X", s[i])
	}
	return b.String()
}

// A real value percent-encoded whole in the query is found however the
// rest of the query is written: a malformed escape in another parameter
// (which a server drops, decoding the others) does not keep the tripwire
// from decoding the one that holds the value. On HTTP/1.1 and HTTP/2 the
// request is refused and the upstream gets nothing of it.
func TestTripwireDecodesAQueryPastAMalformedEscape(t *testing.T) {
	r := newTripRig(t)
	for _, proto := range []string{"http/1.1", "h2"} {
		for _, c := range []struct{ id, name, query string }{
			{"whole", "encoded whole", "token=" + percentEncodeAll(realA)},
			{"after", "after a malformed escape", "x=%zz&token=" + percentEncodeAll(realA)},
			{"before", "before a trailing %", "token=" + percentEncodeAll(realA) + "&y=%"},
			{"plus", "with + for spaces elsewhere", "q=a+b&x=%G1&token=" + percentEncodeAll(realA)},
		} {
			path := "/" + proto + "/q-" + c.id
			status, answer := r.do(t, proto, tripRequest(t, "GET", "https://"+r.api+path+"?"+c.query, nil))
			if status != http.StatusForbidden || answer != "runfleet edge: real_value_from_task\n" {
				t.Errorf("%s, %s: %d %q", proto, c.name, status, answer)
			}
			if got := r.seen(path); len(got) != 0 {
				t.Errorf("%s, %s: the upstream got the request, the value in its query", proto, c.name)
			}
		}
	}
}

// Another run's placeholder percent-encoded in the query is blocked and
// alerted past a malformed escape elsewhere in the query too, as it is
// without one.
func TestAnEncodedForeignPlaceholderPastAMalformedEscapeIsAlerted(t *testing.T) {
	r := newTripRig(t)
	_, other := r.task("run-b", runspec.Secret{ProjectID: "acme", Key: "A"})
	for _, proto := range []string{"http/1.1", "h2"} {
		path := "/" + proto + "/foreign-encoded"
		status, _ := r.do(t, proto, tripRequest(t, "GET", "https://"+r.api+path+"?x=%zz&k="+percentEncodeAll(other["A"]), nil))
		if status != http.StatusForbidden || len(r.seen(path)) != 0 {
			t.Errorf("%s: %d, the upstream got %d requests", proto, status, len(r.seen(path)))
		}
		line := r.waitAudit(func(m map[string]any) bool { return m["path"] == path })
		if line["action"] != "blocked" || line["alert"] != egress.AlertForeignPlaceholder {
			t.Errorf("%s: audit %v", proto, line)
		}
	}
}

// A query key that holds a placeholder once percent-decoded is redacted
// in what the ledger keeps, as one written plainly is.
func TestMaskedQueryRedactsAnEncodedPlaceholderKey(t *testing.T) {
	const ph = "ph-Q7xYz0123456789abcdEF"
	ix := placeholder.NewIndex(map[string]placeholder.Owner{ph: {Task: "run-1"}})
	for _, raw := range []string{percentEncodeAll(ph) + "=1", "%70h-Q7xYz0123456789abcdEF&x=%zz", "a=1&k" + percentEncodeAll(ph)} {
		got := maskedQuery(ix, raw)
		if strings.Contains(strings.ToLower(got), strings.ToLower(ph)) || strings.Contains(got, "%70h") || !strings.Contains(got, placeholder.RedactedMark) {
			t.Errorf("maskedQuery(%q) = %q", raw, got)
		}
	}
}
