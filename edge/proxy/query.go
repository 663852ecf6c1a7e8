package proxy

import (
	"strings"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy/placeholder"
	"github.com/runfleet/runfleet/shared/egress"
)

// maskedQuery is what a run's egress ledger keeps of a request's query
// (raw, as the task sent it): each key as sent with its placeholders
// redacted, each value replaced by egress.MaskedValue, the separators as
// they were ("service=git-upload-pack&page=2" is "service=*&page=*"; a key
// without "=" stays as it is). A value is where a task puts what it sends
// (a token, a search, its data), so none is kept whole or in part.
//
// What a task sends past audit.MaxPathBytes is not read: the audit cuts
// the result there, after the redaction, which sees a placeholder that
// starts before the cut whole (one is at most
// policy.MaxPlaceholderLength bytes).
func maskedQuery(ix *placeholder.Index, raw string) string {
	if raw == "" {
		return ""
	}
	const limit = audit.MaxPathBytes + policy.MaxPlaceholderLength
	var b strings.Builder
	b.Grow(min(len(raw), limit))
	first := true
	for part := range strings.SplitSeq(raw, "&") {
		if b.Len() >= limit {
			break
		}
		if !first {
			b.WriteByte('&')
		}
		first = false
		key, _, hasValue := strings.Cut(part, "=")
		b.WriteString(key[:min(len(key), limit-b.Len())])
		if hasValue {
			b.WriteString("=" + egress.MaskedValue)
		}
	}
	// Any case: a key may be matched however a server folds it.
	return ix.Redacted(b.String())
}
