// Package leakcheck reads what a task received as an attacker would, for
// issue 27: it looks for a real value in every form an upstream commonly
// writes it in (Forms: Basic's base64 of user:value, base64 at each
// alignment, hex, percent, query, path and form escaping, JSON escaping,
// \u00XX escapes, case folds of a hex-like value), for any run of Bound
// consecutive bytes of its secret part in those forms, and for such a run
// in what decoding the received bytes yields (percent, form and JSON
// escapes, and every base64 and hex run in the bytes and in those). Tests
// of the secrets proxy assert with it that an answer carries nothing of a
// value. It shares no code with the proxy's scrubber, so a form the
// scrubber forgets is one it finds, and it says where it found a value by
// naming forms and decodings, never by the value's bytes.
package leakcheck

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"
)

// Bound is the issue's: a run of this many consecutive bytes of a value's
// secret part is as secret as the value.
const Bound = 12

// Real is a real value as the checks look for it.
type Real struct {
	// Key names the value in messages (a key's name): never its bytes.
	Key string
	// Value is the real value.
	Value string
	// Public is how many of Value's first bytes are public (the prefix
	// its placeholders share, as sk_live_ of sk_live_...); the rest is
	// its secret part.
	Public int
	// Fragment is how many consecutive bytes of the secret part are as
	// secret as the value; 0 is Bound. A secret part shorter than that
	// is looked for with the value whole.
	Fragment int
}

func (r Real) fragment() int {
	if r.Fragment > 0 {
		return r.Fragment
	}
	return Bound
}

// needles is what must not be read anywhere: every fragment-byte run of
// the secret part, or the value whole when its secret part is shorter.
func (r Real) needles() []string {
	secret, n := r.Value[r.Public:], r.fragment()
	if len(secret) < n {
		return []string{r.Value}
	}
	out := make([]string, 0, len(secret)-n+1)
	for i := 0; i+n <= len(secret); i++ {
		out = append(out, secret[i:i+n])
	}
	return out
}

// Find reports every way received holds r, one finding per kind: the
// whole value in Forms, a run of its secret part in Forms, or a run of it
// (the value whole, if shorter) in what a decoding of received yields
// (hex-like runs in either case). Each finding names the forms or
// decodings and never holds the value's bytes; none means clean.
func Find(received []byte, r Real) []string {
	var whole, runs, decodedIn []string
	for _, f := range Forms(r.Value) {
		if bytes.Contains(received, []byte(f.Text)) {
			whole = append(whole, f.Name)
		}
	}
	needles, short := r.needles(), len(r.Value)-r.Public < r.fragment()
	if !short {
		for _, n := range needles {
			for _, f := range Forms(n) {
				if !slices.Contains(whole, f.Name) && !slices.Contains(runs, f.Name) && bytes.Contains(received, []byte(f.Text)) {
					runs = append(runs, f.Name)
				}
			}
		}
	}
	for _, d := range readings(received) {
		if slices.Contains(decodedIn, d.name) || d.name == asReceived && len(whole)+len(runs) > 0 {
			continue
		}
		for _, n := range needles {
			if holds(d.data, n) {
				decodedIn = append(decodedIn, d.name)
				break
			}
		}
	}
	what := fmt.Sprintf("%d-byte runs of its secret part", r.fragment())
	if short {
		what = "the whole value"
	}
	var found []string
	if len(whole) > 0 {
		found = append(found, "the whole value as "+strings.Join(whole, ", "))
	}
	if len(runs) > 0 {
		found = append(found, what+" as "+strings.Join(runs, ", "))
	}
	if len(decodedIn) > 0 {
		found = append(found, what+" once read "+strings.Join(decodedIn, ", "))
	}
	return found
}

// AssertClean fails t if received (what a task got: status, fields,
// body, trailers, a message) holds r in any way Find finds, naming what,
// r's key and the findings, never the value's bytes.
func AssertClean(t testing.TB, what string, received []byte, r Real) {
	t.Helper()
	if found := Find(received, r); len(found) > 0 {
		t.Errorf("%s: %s's real value can be read in what was received (%d bytes): %s", what, r.Key, len(received), strings.Join(found, "; "))
	}
}

// holds reports whether data holds needle, in either case if needle is
// spelt in hex digits only (a case fold leaves it meaning the same).
func holds(data []byte, needle string) bool {
	if !hexDigits.MatchString(needle) {
		return bytes.Contains(data, []byte(needle))
	}
	return bytes.Contains(bytes.ToLower(data), []byte(strings.ToLower(needle)))
}

var hexDigits = regexp.MustCompile(`^[0-9A-Fa-f]+$`)

// A Form is one way of writing a string, named for messages.
type Form struct{ Name, Text string }

// Forms is every form of s an upstream that echoes, quotes or re-encodes
// it commonly writes, each computed with the standard library's encoder
// for it, not with the scrubber's spellings: Basic credentials of a few
// users (which put s at each of base64's three alignments), base64 and
// base64url after 0, 1 and 2 leading bytes, hex in both cases, every
// byte percent- or \u00XX-escaped in both cases, query, path and form
// escaping (their escapes in either case), JSON with and without HTML
// escaping and with only ASCII, and, when s is spelt in hex digits, s in
// upper and lower case. Forms that write s the same are dropped.
func Forms(s string) []Form {
	out := []Form{{"literal", s}}
	for _, user := range []string{"u", "us", "usr", "user", "someone-else"} {
		out = append(out, Form{fmt.Sprintf("Basic %q", user+":value"), "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+s))})
	}
	out = append(out, Form{`base64 of ":value"`, base64.StdEncoding.EncodeToString([]byte(":" + s))})
	for lead := range 3 {
		pad := strings.Repeat("x", lead)
		out = append(out,
			Form{fmt.Sprintf("base64 after %d bytes", lead), base64.StdEncoding.EncodeToString([]byte(pad + s))},
			Form{fmt.Sprintf("base64url after %d bytes", lead), base64.RawURLEncoding.EncodeToString([]byte(pad + s + "tail"))})
	}
	query, path := url.QueryEscape(s), url.PathEscape(s)
	out = append(out,
		Form{"hex", hex.EncodeToString([]byte(s))},
		Form{"HEX", strings.ToUpper(hex.EncodeToString([]byte(s)))},
		Form{"%XX every byte", everyByte(s, "%%%02X")},
		Form{"%xx every byte", everyByte(s, "%%%02x")},
		Form{`\u00XX every byte`, everyByte(s, `\u%04X`)},
		Form{`\u00xx every byte`, everyByte(s, `\u%04x`)},
		Form{"query escape", query},
		Form{"query escape (lower-case hex)", lowerEscapes(query)},
		Form{"path escape", path},
		Form{"path escape (lower-case hex)", lowerEscapes(path)},
		Form{"form encoding", url.Values{"token": {s}}.Encode()},
		Form{"JSON", jsonString(s, true)},
		Form{"JSON (HTML left alone)", jsonString(s, false)},
		Form{"JSON, ASCII only", jsonASCII(s)},
		Form{`JSON, "/" as "\/" (PHP)`, strings.ReplaceAll(jsonASCII(s), "/", `\/`)},
		Form{"path, escaped again as a query value (?next=)", "/login?next=" + url.QueryEscape("/notes/"+path)},
		Form{"query value, escaped again", url.QueryEscape(query)},
	)
	if hexDigits.MatchString(s) {
		out = append(out, Form{"upper case", strings.ToUpper(s)}, Form{"lower case", strings.ToLower(s)})
	}
	seen := map[string]bool{}
	return slices.DeleteFunc(out, func(f Form) bool {
		dup := f.Text == "" || seen[f.Text]
		seen[f.Text] = true
		return dup
	})
}

// everyByte writes every byte of s with format.
func everyByte(s, format string) string {
	var b strings.Builder
	for i := range len(s) {
		fmt.Fprintf(&b, format, s[i])
	}
	return b.String()
}

var upperEscape = regexp.MustCompile(`%[0-9A-F]{2}`)

// lowerEscapes writes the %XX escapes of s in lower case.
func lowerEscapes(s string) string { return upperEscape.ReplaceAllStringFunc(s, strings.ToLower) }

// jsonString is s as encoding/json writes a JSON string, quotes included.
func jsonString(s string, escapeHTML bool) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(escapeHTML)
	if err := enc.Encode(s); err != nil {
		panic(err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// jsonASCII is s as a JSON string with every character that is not
// printable ASCII, and the quote and the backslash, as a \u escape of four
// hex digits (\u00e9; a surrogate pair of them past U+FFFF): how an encoder that keeps to ASCII writes it.
func jsonASCII(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r >= 0x20 && r < 0x80 && r != '"' && r != '\\':
			b.WriteRune(r)
		case r > 0xFFFF:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// decoded is what a decoding of received yields.
type decoded struct {
	name string
	data []byte
}

const asReceived = "as received"

// A step is one decoding a task may apply to what it received.
type step struct {
	name   string
	decode func([]byte) []byte
}

var (
	percent   = step{"percent-decoded", func(b []byte) []byte { return percentDecode(b, false) }}
	form      = step{"form-decoded", func(b []byte) []byte { return percentDecode(b, true) }}
	unescape  = step{"JSON-unescaped", jsonUnescape}
	byteWise  = step{`\u00XX read as bytes`, unicodeBytes}
	decodings = [][]step{
		{}, {percent}, {form}, {unescape}, {byteWise},
		{percent, percent}, {form, form},
		{unescape, percent}, {unescape, form}, {byteWise, percent},
		{percent, unescape}, {percent, byteWise},
	}
)

// readings decodes received as a task would hunt for a value in it:
// percent escapes (with and without '+' for a space; once, and twice as
// in a URL inside a URL), JSON escapes (a \u escape such as \u00e9 as
// UTF-8, or, read byte-wise, \u00e9 as the byte 0xe9), and both in either order,
// then every base64 run (standard or URL-safe, at each of the four
// starting characters) and every hex run (at both starting digits) in
// received and in each of those.
func readings(received []byte) []decoded {
	var base []decoded
	for _, steps := range decodings {
		d := decoded{asReceived, received}
		for i, s := range steps {
			if i == 0 {
				d.name = s.name
			} else {
				d.name += ", then " + s.name
			}
			d.data = s.decode(d.data)
		}
		if !slices.ContainsFunc(base, func(e decoded) bool { return bytes.Equal(e.data, d.data) }) {
			base = append(base, d) // else nothing there to decode
		}
	}
	out := slices.Clone(base)
	for _, d := range base {
		prefix := d.name + ", then "
		if d.name == asReceived {
			prefix = ""
		}
		for _, run := range base64Run.FindAll(d.data, -1) {
			run = bytes.ReplaceAll(bytes.ReplaceAll(run, []byte("-"), []byte("+")), []byte("_"), []byte("/"))
			for off := 0; off < 4 && len(run)-off >= 2; off++ {
				r := run[off:]
				if len(r)%4 == 1 {
					r = r[:len(r)-1] // no bits of a whole byte
				}
				if b, err := base64.RawStdEncoding.AppendDecode(nil, r); err == nil {
					out = append(out, decoded{prefix + "base64-decoded", b})
				}
			}
		}
		for _, run := range hexRun.FindAll(d.data, -1) {
			for off := 0; off < 2 && len(run)-off >= 2; off++ {
				r := run[off:]
				if b, err := hex.AppendDecode(nil, r[:len(r)-len(r)%2]); err == nil {
					out = append(out, decoded{prefix + "hex-decoded", b})
				}
			}
		}
	}
	return out
}

var (
	base64Run  = regexp.MustCompile(`[A-Za-z0-9+/_-]{4,}`)
	hexRun     = regexp.MustCompile(`[0-9A-Fa-f]{2,}`)
	pctEscape  = regexp.MustCompile(`%[0-9A-Fa-f]{2}`)
	jsonEscape = regexp.MustCompile(`\\u[dD][89abAB][0-9A-Fa-f]{2}\\u[dD][c-fC-F][0-9A-Fa-f]{2}|\\u[0-9A-Fa-f]{4}|\\["\\/bfnrt]`)
	byteEscape = regexp.MustCompile(`\\u00[0-9A-Fa-f]{2}`)
)

// percentDecode decodes every %XX in b (and, for form encoding, every '+'
// as a space) and leaves the rest as it is.
func percentDecode(b []byte, form bool) []byte {
	if form {
		b = bytes.ReplaceAll(b, []byte("+"), []byte(" "))
	}
	return pctEscape.ReplaceAllFunc(b, func(m []byte) []byte {
		c, _ := hex.DecodeString(string(m[1:]))
		return c
	})
}

// jsonUnescape decodes every JSON escape in b as encoding/json does (a \u
// escape of four hex digits, or a surrogate pair of them, as UTF-8).
func jsonUnescape(b []byte) []byte {
	return jsonEscape.ReplaceAllFunc(b, func(m []byte) []byte {
		var s string
		if err := json.Unmarshal([]byte(`"`+string(m)+`"`), &s); err != nil {
			return m
		}
		return []byte(s)
	})
}

// unicodeBytes decodes every \u00XX in b as the byte XX: how a value
// escaped a byte at a time reads back.
func unicodeBytes(b []byte) []byte {
	return byteEscape.ReplaceAllFunc(b, func(m []byte) []byte {
		c, _ := hex.DecodeString(string(m[4:]))
		return c
	})
}
