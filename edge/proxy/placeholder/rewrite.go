package placeholder

import (
	"encoding/base64"
	"strings"

	"github.com/runfleet/runfleet/edge/policy"
)

// Substituter is the caller's decision on one occurrence of o's placeholder
// found at loc: the bytes to put in its place (the real value, escaped for
// where it goes), or an error that stops the rewrite or the stream, which
// returns it as it is. Package proxy's is bound to one request and decides
// by policy and the task's grants, recording the refusal behind its error.
//
// It is called on the goroutine that rewrites (for a Scanner, the one
// reading it), once per occurrence, overlapping ones included, and for
// every occurrence before any is replaced: one refused occurrence refuses
// the whole text.
type Substituter func(o Owner, loc policy.Location) (string, error)

// decide asks sub about every occurrence in ms, overlapping ones included,
// before anything is replaced, so one blocked occurrence blocks the whole
// request. values receives the replacements, by match.
func decide(ms []Match, loc policy.Location, sub Substituter, values []string) ([]string, error) {
	values = values[:0]
	for _, m := range ms {
		v, err := sub(m.Owner, loc)
		if err != nil {
			return nil, err
		}
		values = append(values, v)
	}
	return values, nil
}

// splice appends b to out with the decided occurrences replaced, skipping
// one that overlaps one already replaced; n counts the replacements.
func splice[T ~string | ~[]byte](out []byte, b T, ms []Match, values []string) (_ []byte, n int) {
	pos := 0
	for i, m := range ms {
		if m.Start < pos {
			continue
		}
		out = append(out, b[pos:m.Start]...)
		out = append(out, values[i]...)
		pos = m.End
		n++
	}
	return append(out, b[pos:]...), n
}

// Rewrite replaces every placeholder in b as sub decides for loc, and
// reports how many occurrences it replaced (of overlapping ones, the first
// by start). It returns b itself when there is none, and a new slice
// otherwise: b is never written. An error is sub's.
func (ix *Index) Rewrite(b []byte, loc policy.Location, sub Substituter) ([]byte, int, error) {
	ms := ix.Find(b, nil)
	if len(ms) == 0 {
		return b, 0, nil
	}
	values, err := decide(ms, loc, sub, nil)
	if err != nil {
		return nil, 0, err
	}
	out, n := splice(make([]byte, 0, len(b)+64), b, ms, values)
	return out, n, nil
}

// RewriteString is Rewrite for a string, with the caller's scratch for the
// matches: a string without a placeholder comes back as it is, with no
// allocation.
func (ix *Index) RewriteString(s string, loc policy.Location, sub Substituter, scratch *[]Match) (string, int, error) {
	ms := findIn(ix, s, *scratch)
	*scratch = ms
	if len(ms) == 0 {
		return s, 0, nil
	}
	var small [4]string
	values, err := decide(ms, loc, sub, small[:0])
	if err != nil {
		return "", 0, err
	}
	size := len(s)
	for i, m := range ms {
		size += len(values[i]) - (m.End - m.Start)
	}
	var b strings.Builder
	b.Grow(max(size, 0))
	pos, n := 0, 0
	for i, m := range ms {
		if m.Start < pos {
			continue // overlaps one already replaced
		}
		b.WriteString(s[pos:m.Start])
		b.WriteString(values[i])
		pos = m.End
		n++
	}
	b.WriteString(s[pos:])
	return b.String(), n, nil
}

// RewriteBasic rewrites inside an Authorization field's
// "Basic base64(user:password)" credentials: decoded, rewritten as
// Rewrite does for policy.InHeader, and encoded again. It returns "" when
// there was nothing to replace: v is no Basic credential, does not decode,
// or holds no placeholder.
func (ix *Index) RewriteBasic(v string, sub Substituter) (string, error) {
	scheme, b64, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", nil
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
	if err != nil {
		return "", nil
	}
	out, n, err := ix.Rewrite(raw, policy.InHeader, sub)
	if err != nil || n == 0 {
		return "", err
	}
	return scheme + " " + base64.StdEncoding.EncodeToString(out), nil
}
