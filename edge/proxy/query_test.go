package proxy

import (
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/proxy/placeholder"
)

// The ledger keeps a query's keys, placeholders redacted, and never a
// value: each becomes "*", whatever it holds (a placeholder, a real value,
// data), the separators as sent.
func TestMaskedQueryKeepsKeysAndNoValue(t *testing.T) {
	const ph = "ph-Q7xYz0123456789abcdEF"
	ix := placeholder.NewIndex(map[string]placeholder.Owner{ph: {Task: "run-1"}})
	for _, c := range []struct{ raw, want string }{
		{"", ""},
		{"service=git-upload-pack", "service=*"},
		{"service=git-upload-pack&page=2", "service=*&page=*"},
		{"flag", "flag"},
		{"a=1&flag&b=", "a=*&flag&b=*"},
		{"a=1&&b=2", "a=*&&b=*"},
		{"token=" + ph, "token=*"},
		{"token=sk-real-value&x=a=b", "token=*&x=*"},
		{ph + "=1", placeholder.RedactedMark + "=*"},
		{"k" + strings.ToLower(ph) + "&z=9", "k" + placeholder.RedactedMark + "&z=*"},
		{"q=%41%42&%6B=v", "q=*&%6B=*"},
	} {
		if got := maskedQuery(ix, c.raw); got != c.want {
			t.Errorf("maskedQuery(%q) = %q, want %q", c.raw, got, c.want)
		}
	}
}

// A query of any length costs at most the audit's cap and a placeholder's
// length to mask, and a placeholder across that cap is still redacted
// whole before the audit cuts it.
func TestMaskedQueryIsBounded(t *testing.T) {
	const ph = "ph-Q7xYz0123456789abcdEF"
	ix := placeholder.NewIndex(map[string]placeholder.Owner{ph: {Task: "run-1"}})
	long := strings.Repeat("k=v&", 1<<20)
	if got := maskedQuery(ix, long); len(got) > audit.MaxPathBytes+300 || !strings.HasPrefix(got, "k=*&k=*") {
		t.Errorf("a 4 MiB query masks to %d bytes", len(got))
	}
	key := strings.Repeat("a", audit.MaxPathBytes-10) + ph
	got := maskedQuery(ix, key+"=1")
	if strings.Contains(got, ph[:12]) || !strings.Contains(got, placeholder.RedactedMark) {
		t.Errorf("a placeholder across the cap is not redacted whole: ...%s", got[len(got)-40:])
	}
}
