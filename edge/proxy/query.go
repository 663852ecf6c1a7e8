package proxy

import (
	"strconv"
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
		if d := unescapeLenient(key); d != key && len(ix.FindFolded(d, nil)) > 0 {
			key = ix.Redacted(d) // a placeholder percent-encoded: not kept as sent
		}
		b.WriteString(key[:min(len(key), limit-b.Len())])
		if hasValue {
			b.WriteString("=" + egress.MaskedValue)
		}
	}
	// Any case: a key may be matched however a server folds it.
	return ix.Redacted(b.String())
}

// unescapeLenient is s percent-decoded as a query is ("+" a space), each
// malformed escape left as it is: a server decodes each parameter on its
// own, so one malformed escape does not keep the others from being read
// decoded, and what looks for a placeholder or a real value in them must
// not stop there either (url.QueryUnescape fails the whole string).
func unescapeLenient(s string) string {
	i := strings.IndexAny(s, "%+")
	if i < 0 {
		return s
	}
	b := make([]byte, 0, len(s))
	b = append(b, s[:i]...)
	for ; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '+':
			c = ' '
		case c == '%' && i+2 < len(s):
			// ParseUint with base 16 takes exactly hex digits: no sign,
			// prefix or underscore.
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				c = byte(v)
				i += 2
			}
		}
		b = append(b, c)
	}
	return string(b)
}
