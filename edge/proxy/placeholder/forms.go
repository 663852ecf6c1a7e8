package placeholder

import (
	"bytes"
	"encoding/base64"
	"net/url"
	"strings"
	"unicode/utf8"
)

// A spelling is one form a value may take in an answer: the text, and for
// each of the value's bytes the part of the text that spells it. A run of
// the text spells the value's bytes whose parts it holds whole (covered),
// which is how a fragment is measured in the value's bytes whatever the
// form's expansion: six characters of \u00XX escapes are one byte of the
// value, not six.
type spelling struct {
	text []byte
	// lo[j], hi[j]: the text [lo[j], hi[j]) spells value byte j; lo[j] is
	// -1 for a byte this spelling does not hold whole (a base64 spelling's
	// edges, mixed with the bytes around the value). lo and hi are each
	// non-decreasing over the bytes that are held.
	lo, hi []int32
}

// covered is how many of the value's bytes from secretFrom on the text run
// [a, b) spells whole.
func (s *spelling) covered(a, b, secretFrom int) int {
	n := 0
	for j := secretFrom; j < len(s.lo); j++ {
		if s.lo[j] < 0 || int(s.lo[j]) < a {
			continue
		}
		if int(s.hi[j]) > b {
			break
		}
		n++
	}
	return n
}

// byteForm spells a value a byte (or, for JSON, a character) at a time.
type byteForm func(dst []byte, r rune, raw string) []byte

// spellings are the forms of v an answer may carry: those the proxy itself
// writes (the bytes as they are, path and query escaping, JSON escaping,
// Basic's base64 of user:value at whatever offset the value sits, and an
// escaped path escaped again as a query value) and those
// upstreams commonly apply (hex, every byte percent-encoded, \u00XX
// escapes, standard and URL-safe base64 at each of the three offsets a
// value can sit at, the other case of a hex-like value). Spellings with the
// same text are kept once; the bytes as they are come first. public is the
// length of v's public prefix (see Secret), which says nothing of whether
// v is hex-like.
func spellings(v string, public int) []spelling {
	var out []spelling
	add := func(s spelling) {
		if len(s.text) == 0 {
			return
		}
		for _, o := range out {
			if bytes.Equal(o.text, s.text) {
				return
			}
		}
		out = append(out, s)
	}
	for _, f := range byteForms {
		add(spellBytes(v, f, false))
	}
	for _, f := range jsonForms {
		add(spellBytes(v, f, true))
	}
	if hexLike(v[public:]) {
		add(spellBytes(strings.ToLower(v), literal, false))
		add(spellBytes(strings.ToUpper(v), literal, false))
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for phase := range 3 {
			add(spellBase64(v, enc, phase))
		}
	}
	return out
}

var (
	byteForms = []byteForm{
		literal, hexLower, hexUpper, percentUpper, percentLower, unicodeLower, unicodeUpper,
		escapeWith(url.QueryEscape, false), escapeWith(url.QueryEscape, true),
		escapeWith(url.PathEscape, false), escapeWith(url.PathEscape, true),
		escapeWith(uriComponent, false), escapeWith(uriComponent, true),
		// An escaped URL escaped again as a query value: a login redirect's
		// "?next=" quoting the path it was asked for.
		escapeWith(func(s string) string { return url.QueryEscape(url.PathEscape(s)) }, false),
		escapeWith(func(s string) string { return url.QueryEscape(url.QueryEscape(s)) }, false),
	}
	jsonForms = []byteForm{jsonForm(true, false, false), jsonForm(false, false, false), jsonForm(false, true, false), jsonForm(false, true, true)}
)

// spellBytes spells v through f a byte at a time, or a character at a
// time (byRune: JSON escapes a character, not a byte): each character's
// bytes are spelt by what f wrote for it, each byte by itself when f wrote
// them as they are.
func spellBytes(v string, f byteForm, byRune bool) spelling {
	s := spelling{text: make([]byte, 0, len(v)), lo: make([]int32, len(v)), hi: make([]int32, len(v))}
	for j := 0; j < len(v); {
		r, size := rune(v[j]), 1
		if byRune {
			r, size = utf8.DecodeRuneInString(v[j:])
		}
		start := len(s.text)
		s.text = f(s.text, r, v[j:j+size])
		verbatim := string(s.text[start:]) == v[j:j+size]
		for k := j; k < j+size; k++ {
			s.lo[k], s.hi[k] = int32(start), int32(len(s.text))
			if verbatim { // each byte is its own
				s.lo[k], s.hi[k] = int32(start+k-j), int32(start+k-j+1)
			}
		}
		j += size
	}
	return s
}

// spellBase64 is the part of enc's encoding of a text holding v at byte
// offset phase (mod 3) that depends on v's bytes alone: the characters
// whose six bits all lie within v. A Basic credential "user:value" holds
// one of the three whatever the user.
func spellBase64(v string, enc *base64.Encoding, phase int) spelling {
	padded := make([]byte, phase+len(v)+2)
	copy(padded[phase:], v)
	full := []byte(enc.WithPadding(base64.NoPadding).EncodeToString(padded))
	// Character k holds bits [6k, 6k+6); v's bytes hold bits
	// [8*phase, 8*(phase+len(v))).
	first := (8*phase + 5) / 6
	end := 8 * (phase + len(v)) / 6
	if end <= first {
		return spelling{}
	}
	s := spelling{text: full[first:end], lo: make([]int32, len(v)), hi: make([]int32, len(v))}
	for j := range v {
		bit := 8 * (phase + j)
		lo, hi := bit/6, (bit+7)/6+1
		if lo < first || hi > end {
			s.lo[j], s.hi[j] = -1, -1
			continue
		}
		s.lo[j], s.hi[j] = int32(lo-first), int32(hi-first)
	}
	return s
}

func literal(dst []byte, _ rune, raw string) []byte { return append(dst, raw...) }

const lowerHex, upperHex = "0123456789abcdef", "0123456789ABCDEF"

func hexLower(dst []byte, _ rune, raw string) []byte { return appendHex(dst, raw, "", lowerHex) }
func hexUpper(dst []byte, _ rune, raw string) []byte { return appendHex(dst, raw, "", upperHex) }
func percentUpper(dst []byte, _ rune, raw string) []byte {
	return appendHex(dst, raw, "%", upperHex)
}
func percentLower(dst []byte, _ rune, raw string) []byte {
	return appendHex(dst, raw, "%", lowerHex)
}
func unicodeLower(dst []byte, _ rune, raw string) []byte {
	return appendHex(dst, raw, `\u00`, lowerHex)
}
func unicodeUpper(dst []byte, _ rune, raw string) []byte {
	return appendHex(dst, raw, `\u00`, upperHex)
}

func appendHex(dst []byte, raw string, lead, digits string) []byte {
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		dst = append(dst, lead...)
		dst = append(dst, digits[c>>4], digits[c&15])
	}
	return dst
}

// escapeWith spells each byte as escape does (both of Go's escapers work a
// byte at a time), its %XX in lower case when lower. The 256 answers are
// worked out once.
func escapeWith(escape func(string) string, lower bool) byteForm {
	var table [256]string
	for c := range table {
		e := escape(string([]byte{byte(c)}))
		if lower && len(e) == 3 && e[0] == '%' {
			e = strings.ToLower(e)
		}
		table[c] = e
	}
	return func(dst []byte, _ rune, raw string) []byte {
		for i := 0; i < len(raw); i++ {
			dst = append(dst, table[raw[i]]...)
		}
		return dst
	}
}

// uriComponent is JavaScript's encodeURIComponent on one byte.
func uriComponent(s string) string {
	c := s[0]
	if isAlnum(c) || strings.IndexByte("-_.!~*'()", c) >= 0 {
		return s
	}
	return "%" + string([]byte{upperHex[c>>4], upperHex[c&15]})
}

// jsonForm spells characters as JSON string encoders do: Go's
// encoding/json (html: <, > and & as \u003c...), and the ASCII-only
// encoders (Python's json.dumps, PHP's json_encode with slash: "\/") that
// write every other character as a \u escape of four hex digits
// (\u00e9), a surrogate pair of them past the BMP.
func jsonForm(html, ascii, slash bool) byteForm {
	return func(dst []byte, r rune, raw string) []byte {
		switch {
		case r == '"' || r == '\\':
			return append(dst, '\\', byte(r))
		case r == '/' && slash:
			return append(dst, '\\', '/')
		case r == '\n':
			return append(dst, '\\', 'n')
		case r == '\r':
			return append(dst, '\\', 'r')
		case r == '\t':
			return append(dst, '\\', 't')
		case r < 0x20 || html && (r == '<' || r == '>' || r == '&') || r == 0x2028 || r == 0x2029:
			return appendUnicode(dst, r)
		case r >= 0x80 && ascii:
			if r == utf8.RuneError && len(raw) == 1 {
				return append(dst, raw...) // not UTF-8: no encoder writes it as is
			}
			if r > 0xFFFF {
				r -= 0x10000
				dst = appendUnicode(dst, 0xD800+(r>>10))
				return appendUnicode(dst, 0xDC00+(r&0x3FF))
			}
			return appendUnicode(dst, r)
		}
		return append(dst, raw...)
	}
}

func appendUnicode(dst []byte, r rune) []byte {
	return append(dst, '\\', 'u', lowerHex[r>>12&15], lowerHex[r>>8&15], lowerHex[r>>4&15], lowerHex[r&15])
}

// hexLike reports whether v is spelt in hex digits with a letter among
// them: an answer may carry it in either case.
func hexLike(v string) bool {
	letter := false
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c >= '0' && c <= '9':
		case c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F':
			letter = true
		default:
			return false
		}
	}
	return letter
}
