package proxy

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// What a task could get back of a real value, as issue 27 states it: the
// value in any form the proxy writes (Basic's base64 of user:value, path
// and query escaping, JSON escaping, form encoding) or an upstream commonly
// applies (standard and URL-safe base64 at each alignment, hex, percent-
// encoding, case folds of a hex-like value, \u00XX escapes), and any run of
// fragmentBound bytes of its secret part in any of those forms. The checks
// below look for exactly that in the bytes a task's client received, and
// decode what base64, hex, percent and JSON escapes they find, as a task
// would; they know nothing of how the proxy scrubs.

// fragmentBound is the bound: a run of this many consecutive bytes
// of a value's secret part is as secret as the value.
const fragmentBound = 12

// realValue is a key's real value and the prefix of its placeholders'
// shape: the value's secret part is what follows that prefix when the value
// starts with it (sk_live_... keeps its sk_live_ public), else all of it.
type realValue struct {
	key, value, prefix string
}

func (v realValue) secret() string {
	if v.prefix != "" && strings.HasPrefix(v.value, v.prefix) {
		return v.value[len(v.prefix):]
	}
	return v.value
}

// hexLike is a value a case fold leaves meaning the same: hex digits only.
var hexLike = regexp.MustCompile(`^[0-9A-Fa-f]+$`)

// form is one way of writing a string, named for the messages.
type form struct{ name, text string }

// forms is every form of s issue 27 lists, each as the text any writing of
// s in that form must hold whatever surrounds s: for base64, the characters
// that encode s's bits alone at each of the three alignments s can have in
// the encoded stream (Basic's user:value puts it at any of them).
// Duplicates (an escape that changes nothing) are dropped.
func forms(s string) []form {
	out := []form{{"literal", s}}
	for phase := range 3 {
		out = append(out,
			form{fmt.Sprintf("base64/%d", phase), base64Core(base64.RawStdEncoding, s, phase)},
			form{fmt.Sprintf("base64url/%d", phase), base64Core(base64.RawURLEncoding, s, phase)})
	}
	out = append(out,
		form{"hex", hex.EncodeToString([]byte(s))},
		form{"HEX", strings.ToUpper(hex.EncodeToString([]byte(s)))},
		form{"%XX every byte", percentEvery(s, "%%%02X")},
		form{"%xx every byte", percentEvery(s, "%%%02x")},
		form{"query escape", url.QueryEscape(s)},
		form{"query escape (lower-case hex)", lowerEscapes(url.QueryEscape(s))},
		form{"path escape", url.PathEscape(s)},
		form{"path escape (lower-case hex)", lowerEscapes(url.PathEscape(s))},
		form{"JSON", jsonText(s, true)},
		form{"JSON (HTML left alone)", jsonText(s, false)},
		form{`\u00xx every byte`, percentEvery(s, `\u%04x`)},
		form{`\u00XX every byte`, percentEvery(s, `\u%04X`)},
	)
	if hexLike.MatchString(s) {
		out = append(out, form{"upper case", strings.ToUpper(s)}, form{"lower case", strings.ToLower(s)})
	}
	seen := map[string]bool{}
	return slices.DeleteFunc(out, func(f form) bool {
		dup := f.text == "" || seen[f.text]
		seen[f.text] = true
		return dup
	})
}

// base64Core is what enc (unpadded) writes for s when s starts phase bytes
// into a 3-byte group, less the characters that also hold bits of the
// bytes around s.
func base64Core(enc *base64.Encoding, s string, phase int) string {
	full := enc.EncodeToString(append(make([]byte, phase), s...))
	out := full[[3]int{0, 2, 3}[phase]:]
	if (phase+len(s))%3 != 0 && out != "" {
		out = out[:len(out)-1]
	}
	return out
}

// percentEvery writes every byte of s with format.
func percentEvery(s, format string) string {
	var b strings.Builder
	for i := range len(s) {
		fmt.Fprintf(&b, format, s[i])
	}
	return b.String()
}

var escapeHex = regexp.MustCompile(`%[0-9A-F]{2}`)

// lowerEscapes writes the %XX escapes of s in lower case.
func lowerEscapes(s string) string { return escapeHex.ReplaceAllStringFunc(s, strings.ToLower) }

// jsonText is s as a JSON string's contents, as encoding/json writes it.
func jsonText(s string, escapeHTML bool) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(escapeHTML)
	if err := enc.Encode(s); err != nil {
		panic(err)
	}
	return strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(b.String()), `"`), `"`)
}

// findValue reports every way answer holds v, one finding per kind: the
// whole value in forms, a fragmentBound-byte run of its secret part in
// forms, or such a run in what decodings of answer yield (base64 and hex
// runs, percent and JSON escapes, and those nested). Each names the forms
// or decodings, never the bytes.
func findValue(answer []byte, v realValue) []string {
	var whole, runs, decodedIn []string
	for _, f := range forms(v.value) {
		if bytes.Contains(answer, []byte(f.text)) {
			whole = append(whole, f.name)
		}
	}
	secret := v.secret()
	for i := 0; i+fragmentBound <= len(secret); i++ {
		for _, f := range forms(secret[i : i+fragmentBound]) {
			if !slices.Contains(whole, f.name) && !slices.Contains(runs, f.name) && bytes.Contains(answer, []byte(f.text)) {
				runs = append(runs, f.name)
			}
		}
	}
	fold := hexLike.MatchString(secret)
	for _, d := range decodings(answer) {
		if slices.Contains(decodedIn, d.name) {
			continue
		}
		blob := d.data
		if fold {
			blob = bytes.ToLower(blob)
		}
		for i := 0; i+fragmentBound <= len(secret); i++ {
			run := secret[i : i+fragmentBound]
			if fold {
				run = strings.ToLower(run)
			}
			if bytes.Contains(blob, []byte(run)) {
				decodedIn = append(decodedIn, d.name)
				break
			}
		}
	}
	var found []string
	if len(whole) > 0 {
		found = append(found, "the whole value as "+strings.Join(whole, ", "))
	}
	if len(runs) > 0 {
		found = append(found, fmt.Sprintf("%d-byte runs of its secret part as %s", fragmentBound, strings.Join(runs, ", ")))
	}
	if len(decodedIn) > 0 {
		found = append(found, fmt.Sprintf("%d-byte runs of its secret part once %s", fragmentBound, strings.Join(decodedIn, ", ")))
	}
	return found
}

// assertNoFragment fails t if answer (what the task's client received:
// status, fields, body, trailers or a message) holds v in any way findValue
// finds.
func assertNoFragment(t testing.TB, what string, answer []byte, v realValue) {
	t.Helper()
	if found := findValue(answer, v); len(found) > 0 {
		t.Errorf("%s: the task got %s's real value: %s", what, v.key, strings.Join(found, "; "))
	}
}

// decoded is what a decoding of an answer yields.
type decoded struct {
	name string
	data []byte
}

// decodings decodes answer as a task would hunt for a value in it: percent
// escapes, JSON escapes, then every base64 run (standard or URL-safe, at
// each of the four starting characters) and every hex run (at both
// starting digits) in the answer and in those.
func decodings(answer []byte) []decoded {
	base := []decoded{
		{"as it is", answer},
		{"percent-decoded", percentDecode(answer)},
		{"JSON-unescaped", jsonUnescape(answer)},
		{"JSON-unescaped and percent-decoded", percentDecode(jsonUnescape(answer))},
	}
	var out []decoded
	for i, d := range base {
		if slices.ContainsFunc(base[:i], func(e decoded) bool { return bytes.Equal(e.data, d.data) }) {
			continue // nothing there to decode
		}
		if i > 0 {
			out = append(out, d)
		}
		for _, run := range base64Run.FindAll(d.data, -1) {
			run = bytes.ReplaceAll(bytes.ReplaceAll(run, []byte("-"), []byte("+")), []byte("_"), []byte("/"))
			for off := 0; off < 4 && len(run)-off >= 4; off++ {
				r := run[off:]
				r = r[:len(r)-len(r)%4]
				if b, err := base64.RawStdEncoding.AppendDecode(nil, r); err == nil {
					out = append(out, decoded{strings.TrimPrefix(d.name+", then base64-decoded", "as it is, then "), b})
				}
			}
		}
		for _, run := range hexRun.FindAll(d.data, -1) {
			for off := range 2 {
				r := run[off:]
				r = r[:len(r)-len(r)%2]
				if b, err := hex.AppendDecode(nil, r); err == nil {
					out = append(out, decoded{strings.TrimPrefix(d.name+", then hex-decoded", "as it is, then "), b})
				}
			}
		}
	}
	return out
}

var (
	// Runs long enough to hold fragmentBound bytes at any alignment.
	base64Run = regexp.MustCompile(`[A-Za-z0-9+/_-]{16,}`)
	hexRun    = regexp.MustCompile(`[0-9A-Fa-f]{24,}`)
	pctEscape = regexp.MustCompile(`%[0-9A-Fa-f]{2}`)
	jsonU     = regexp.MustCompile(`\\u[0-9A-Fa-f]{4}|\\["\\/bfnrt]`)
)

// percentDecode decodes every %XX in b and leaves the rest as it is.
func percentDecode(b []byte) []byte {
	return pctEscape.ReplaceAllFunc(b, func(m []byte) []byte {
		c, _ := hex.DecodeString(string(m[1:]))
		return c
	})
}

// jsonUnescape decodes every JSON escape in b (a \uXXXX as UTF-8).
func jsonUnescape(b []byte) []byte {
	return jsonU.ReplaceAllFunc(b, func(m []byte) []byte {
		var s string
		if err := json.Unmarshal([]byte(`"`+string(m)+`"`), &s); err != nil {
			return m
		}
		return []byte(s)
	})
}

// answerText is what a task's client received: the status line, the
// fields, the body and the trailers, as one text to search.
func answerText(res *http.Response, body []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s\n", res.Proto, res.Status)
	res.Header.Write(&b)
	b.Write(body)
	res.Trailer.Write(&b)
	return b.Bytes()
}

// randomText draws n characters of alphabet from a fixed seed: the values
// are the same on every run, so a failure can be reproduced.
func randomText(seed uint64, alphabet string, n int) string {
	r := rand.New(rand.NewPCG(seed, 27))
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

// The checks must see every form a scrubber has to take out, and must not
// see one where there is none: else the attack tests would fail for the
// right scrubber or pass for the wrong one. Realistic writings of a value
// (inside Basic credentials, a JSON document, a query string, cut to a
// fragment) are found; the value's placeholder, a run one byte shorter than
// the bound, and its public prefix are not.
func TestAnswerAttackChecksSeeEveryForm(t *testing.T) {
	v := realValue{key: "K", prefix: "sk_", value: "sk_" + randomText(1, alnum+`/+=&% "\<>'`+"\t", 40)}
	h := realValue{key: "H", value: randomText(2, "0123456789abcdef", 40)}
	for _, val := range []realValue{v, h} {
		for _, s := range []string{val.value, val.secret()[3 : 3+fragmentBound]} {
			for _, f := range forms(s) {
				if len(findValue([]byte("<<"+f.text+">>"), val)) == 0 {
					t.Errorf("%s: %s of %d bytes not found", val.key, f.name, len(s))
				}
			}
		}
		sec := val.secret()
		for _, w := range []string{
			"Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+val.value)),
			"Basic " + base64.StdEncoding.EncodeToString([]byte("us:"+val.value)),
			"Basic " + base64.StdEncoding.EncodeToString([]byte("usr:"+val.value)),
			"t=" + base64.RawURLEncoding.EncodeToString([]byte("x"+sec[5:5+fragmentBound]+"y")),
			`{"quote": ` + strings.TrimSpace(jsonText(sec[:20], true)) + `}`,
			"next=/a?k=" + url.QueryEscape(sec) + "&x=1",
			hex.EncodeToString([]byte("zz" + sec[7:7+fragmentBound])),
			url.QueryEscape(base64.StdEncoding.EncodeToString([]byte("usr:" + val.value))),
		} {
			if len(findValue([]byte(w), val)) == 0 {
				t.Errorf("%s: a realistic writing not found: %q", val.key, w)
			}
		}
		for _, clean := range []string{
			"Bearer sk_" + randomText(3, alnum, 45),
			"short run: " + sec[:fragmentBound-1] + " ... " + sec[fragmentBound:2*fragmentBound-1],
			base64.StdEncoding.EncodeToString([]byte(sec[:fragmentBound-1])),
			"the prefix alone: " + val.prefix + val.prefix,
		} {
			if found := findValue([]byte(clean), val); len(found) > 0 {
				t.Errorf("%s: found in clean text %q: %v", val.key, clean, found)
			}
		}
	}
}
