package redact

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/secrets"
)

const value = "sk-live-0123456789abcdefghij"

func set(values ...string) *Set {
	s := NewSet(0)
	for _, v := range values {
		s.Add(secrets.NewValue(v))
	}
	return s
}

func TestRedactReplacesEveryOccurrence(t *testing.T) {
	s := set(value, "other-value-zzzz", "sk-LIVE-ab")
	for _, c := range []struct{ in, want string }{
		{"nothing here", "nothing here"},
		{value, Mark},
		{"a " + value + " b " + value + value + " c", "a " + Mark + " b " + Mark + Mark + " c"},
		{"x" + value + "other-value-zzzz", "x" + Mark + Mark},
		{"sk-live-0123456789abcdefghi", "sk-live-0123456789abcdefghi"}, // one byte short: not a value
		{strings.ToUpper(value), strings.ToUpper(value)},               // upper case is another value
		{"host " + strings.ToLower("sk-LIVE-ab") + ".test", "host " + Mark + ".test"},
	} {
		if got := string(s.Redact([]byte(c.in))); got != c.want {
			t.Errorf("Redact(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// Overlapping occurrences (a value that overlaps itself) leave nothing
	// of either.
	o := set("abab")
	if got := string(o.Redact([]byte("xababab-abab"))); got != "x"+Mark+"-"+Mark {
		t.Errorf("overlap: %q", got)
	}
	// A line without a value is returned as it is, not copied.
	line := []byte("no value in this line")
	if out := s.Redact(line); &out[0] != &line[0] {
		t.Error("a clean line was copied")
	}
	if got := string(NewSet(0).Redact([]byte(value))); got != value {
		t.Errorf("an empty set redacted %q", got)
	}
}

// A value with characters encoders escape is found in the forms slog's
// JSON and text handlers, encoding/json and %q give it.
func TestRedactFindsEncodedForms(t *testing.T) {
	odd := "p\"w<d>&\\x\tq\u2028é\x01"
	s := set(odd)
	var buf bytes.Buffer
	w := s.Writer(&buf)
	slog.New(slog.NewJSONHandler(w, nil)).Info("json", "v", odd, "err", fmt.Sprintf("quoted %q", odd))
	slog.New(slog.NewTextHandler(w, nil)).Info("text", "v", odd)
	b, _ := json.Marshal(map[string]string{"v": odd})
	w.Write(append(b, '\n'))
	fmt.Fprintf(w, "%q %+q\n", odd, odd)
	fmt.Fprintf(w, "%s\n", odd)
	out := buf.String()
	if strings.Contains(out, "w<d") || strings.Contains(out, `w\u003cd`) || strings.Contains(out, "p\\\"w") || strings.Contains(out, "p\"w") {
		t.Fatalf("a form of the value is left:\n%s", out)
	}
	if n := strings.Count(out, Mark); n != 7 {
		t.Errorf("%d marks, want 7:\n%s", n, out)
	}
}

// The contract: each Write on its own. A value split across two Writes
// is not found (edge's writers never split a line).
func TestWriterRedactsEachWrite(t *testing.T) {
	s := set(value)
	var buf bytes.Buffer
	w := s.Writer(&buf)
	if n, err := w.Write([]byte("one " + value + "\n")); err != nil || n != len("one "+value+"\n") {
		t.Fatalf("Write = %d, %v", n, err)
	}
	w.Write([]byte(value[:10]))
	w.Write([]byte(value[10:] + "\n"))
	if buf.String() != "one "+Mark+"\n"+value+"\n" {
		t.Fatalf("%q", buf.String())
	}
}

// Past its bound the Set forgets the oldest value added; a value added
// again is held again.
func TestSetIsBounded(t *testing.T) {
	s := NewSet(3)
	for i := range 5 {
		s.Add(secrets.NewValue(fmt.Sprintf("value-%d-k3Rq9ZtW", i)))
	}
	s.Add(secrets.NewValue("value-4-k3Rq9ZtW")) // held: no change
	s.Add(secrets.Value{})                      // empty: ignored
	if s.Len() != 3 || s.Evicted() != 2 {
		t.Fatalf("len %d evicted %d", s.Len(), s.Evicted())
	}
	line := "value-0-k3Rq9ZtW value-1-k3Rq9ZtW value-2-k3Rq9ZtW value-4-k3Rq9ZtW"
	if got := string(s.Redact([]byte(line))); got != "value-0-k3Rq9ZtW value-1-k3Rq9ZtW "+Mark+" "+Mark {
		t.Fatalf("%q", got)
	}
	s.Add(secrets.NewValue("value-0-k3Rq9ZtW")) // back; value-2, the oldest, goes
	if got := string(s.Redact([]byte(line))); got != Mark+" value-1-k3Rq9ZtW value-2-k3Rq9ZtW "+Mark {
		t.Fatalf("%q", got)
	}
	if s.Evicted() != 3 {
		t.Fatalf("evicted %d", s.Evicted())
	}
}

// Add of a held value allocates nothing (the proxy calls it per request).
func TestAddOfAHeldValueDoesNotAllocate(t *testing.T) {
	s := set(value)
	v := secrets.NewValue(value)
	if n := testing.AllocsPerRun(100, func() { s.Add(v) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// auditLine is an audit line as the proxy writes one per request.
const auditLine = `{"ts":"2026-12-01T17:08:01.123456789Z","task":"run-0123456789abcdef","action":"substituted","keys":["acme/OPENAI_API_KEY"],"host":"api.openai.com:443","method":"POST","path":"/v1/chat/completions","status":200,"bytesIn":1834,"bytesOut":5120,"via":"transparent","durationMs":412.337,"upstreamMs":398.102}` + "\n"

func benchSet(n int) *Set {
	s := NewSet(0)
	for i := range n {
		// Values of several vendors' shapes, so their prefixes differ.
		prefix := [...]string{"sk-proj-", "ghp_", "xoxb-", "AKIA", "glpat-"}[i%5]
		s.Add(secrets.NewValue(fmt.Sprintf("%s%02dAbCdEfGhIjKlMnOpQrStUvWxYz0123456789", prefix, i)))
	}
	return s
}

// BenchmarkRedactAuditLine: one audit line (about 330 bytes) against 20
// held values, none in the line (every request's case).
func BenchmarkRedactAuditLine(b *testing.B) {
	s := benchSet(20)
	line := []byte(auditLine)
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		if out := s.Redact(line); len(out) != len(line) {
			b.Fatal("changed")
		}
	}
}

// BenchmarkRedactAuditLineWithValue: the same line holding one of them.
func BenchmarkRedactAuditLineWithValue(b *testing.B) {
	s := benchSet(20)
	line := []byte(strings.Replace(auditLine, "/v1/chat/completions", "/v1/AKIA08AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", 1))
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		if out := s.Redact(line); len(out) == len(line) {
			b.Fatal("unchanged")
		}
	}
}

// BenchmarkAddHeld: Add of a value already held, as every request's read
// of a value calls it, with 20 values held.
func BenchmarkAddHeld(b *testing.B) {
	s := benchSet(20)
	v := secrets.NewValue("AKIA08AbCdEfGhIjKlMnOpQrStUvWxYz0123456789")
	s.Add(v)
	b.ReportAllocs()
	for b.Loop() {
		s.Add(v)
	}
}

// Redact skips through a line by windows (snapshot.shift) yet finds and
// replaces what a search for every form at every byte would: values of any
// length and alphabet, lines built of their pieces and of whole forms.
func FuzzRedactFindsWhatEveryPositionWould(f *testing.F) {
	f.Add("sk-live-0123456789abcdefghij", "abab", "x", "a sk-live-0123456789abcdefghij b ababab", uint8(3))
	f.Add("AKIA08AbCdEfGhIj", "p\"w<d>", "abcd", "{\"path\":\"/v1/AKIA08AbCdEfGhIj\"} abcdabcd p\\\"w", uint8(7))
	f.Fuzz(func(t *testing.T, v1, v2, v3, line string, cut uint8) {
		s := set(v1, v2, v3)
		snap := s.snap.Load()
		// The line, then with every form of each value spliced in at cut.
		lines := []string{line}
		for _, e := range snap.order {
			for _, form := range e.forms {
				i := int(cut) % (len(line) + 1)
				lines = append(lines, line[:i]+string(form)+line[i:], string(form)+string(form[:len(form)/2]))
			}
		}
		for _, l := range lines {
			if got, want := string(s.Redact([]byte(l))), string(redactEveryPosition(snap, []byte(l))); got != want {
				t.Fatalf("Redact(%q) = %q, want %q", l, got, want)
			}
		}
	})
}

// redactEveryPosition is Redact without the windows: every form looked for
// at every byte, overlapping occurrences merged into one Mark.
func redactEveryPosition(snap *snapshot, line []byte) []byte {
	var spans [][2]int
	for _, e := range snap.order {
		for _, f := range e.forms {
			for i := 0; i+len(f) <= len(line); i++ {
				if bytes.HasPrefix(line[i:], f) {
					spans = append(spans, [2]int{i, i + len(f)})
				}
			}
		}
	}
	if len(spans) == 0 {
		return line
	}
	slices.SortFunc(spans, func(a, b [2]int) int { return a[0] - b[0] })
	var out []byte
	pos := 0
	for i := 0; i < len(spans); {
		start, end := spans[i][0], spans[i][1]
		for i++; i < len(spans) && spans[i][0] < end; i++ {
			end = max(end, spans[i][1])
		}
		out = append(append(out, line[pos:start]...), Mark...)
		pos = end
	}
	return append(out, line[pos:]...)
}

// realisticValues are 20 values shaped as the credentials a host's policy
// grants are: vendors' prefixes and alphabets, AWS's base64 secrets with
// '+' and '/', a password with punctuation.
func realisticValues() []string {
	var out []string
	for i := range 20 {
		switch i % 5 {
		case 0:
			out = append(out, fmt.Sprintf("sk-proj-%02dT3BlbkFJq8Zr4mW2xYvN7pLkQ9sHdE1uGfAaBbCcDd", i))
		case 1:
			out = append(out, fmt.Sprintf("ghp_%02dR7mKq2ZxW9vN4bT6yL1pH8sD3fG5jA0cE", i))
		case 2:
			out = append(out, fmt.Sprintf("AKIA%02dQW3RT5YU7IO9PA", i), fmt.Sprintf("wJalrXUtnFEMI/K7MDENG+bPxRfiCY%02dEXAMPLEKEY", i))
		case 3:
			out = append(out, fmt.Sprintf("xoxb-%02d1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx", i))
		case 4:
			out = append(out, fmt.Sprintf("p@ss:w0rd!%02d-Zq#9", i))
		}
	}
	return out[:20]
}

// body64K is 64 KiB of a JSON request body without a value.
func body64K() []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"gpt-test","messages":[`)
	for i := 0; b.Len() < 64<<10-200; i++ {
		fmt.Fprintf(&b, `{"role":"user","content":"Line %d of the conversation: lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor."},`, i)
	}
	b.WriteString(`{"role":"user","content":"end"}]}`)
	for b.Len() < 64<<10 {
		b.WriteByte(' ')
	}
	return b.Bytes()[:64<<10]
}

// BenchmarkFind64KiB: Find over a 64 KiB request body holding no value,
// against 20 realistic values and an empty Set.
func BenchmarkFind64KiB(b *testing.B) {
	body := body64K()
	for _, c := range []struct {
		name string
		s    *Set
	}{{"empty", NewSet(0)}, {"20-values", set(realisticValues()...)}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := c.s.Find(body); ok {
					b.Fatal("found")
				}
			}
		})
	}
}

// Find finds a value of FindMinLen bytes or more in every form a request
// may carry it, returns which value it is, and finds nothing else: not a
// shorter value, not a value cut short, not one it never held.
func TestFindFindsEveryRequestForm(t *testing.T) {
	odd := "wJalr+XUtn/FEMI=K7MD ENG&bPx%Rf" // '+', '/', '=', ' ', '&' and '%' need percent-encoding
	short := "hunter2-pw"                    // under FindMinLen: redacted, never found
	s := set(value, odd, short)
	b64 := func(enc *base64.Encoding, prefix, v string) string { return enc.EncodeToString([]byte(prefix + v)) }
	for _, v := range []string{value, odd} {
		cases := map[string]string{
			"as is":        "Authorization: Bearer " + v,
			"lower-cased":  "x-" + strings.ToLower(v) + ": 1",
			"JSON body":    string(must(json.Marshal(map[string]string{"token": v}))),
			"JSON in JSON": string(must(json.Marshal(string(must(json.Marshal(map[string]string{"token": v})))))),
			"Go-quoted":    strconv.Quote(v),
			"query":        "/x?token=" + url.QueryEscape(v) + "&a=b",
			"path segment": "/x/" + url.PathEscape(v) + "/y",
			"form body":    url.Values{"a": {"1"}, "token": {v}}.Encode(),
		}
		for user := range 4 {
			prefix := strings.Repeat("u", user) + ":"
			cases[fmt.Sprintf("Basic, user of %d", user)] = "Authorization: Basic " + b64(base64.StdEncoding, prefix, v)
			cases[fmt.Sprintf("URL-safe base64 after %d bytes", user+1)] = `{"content":"` + b64(base64.RawURLEncoding, prefix, v) + `"}`
		}
		for name, text := range cases {
			got, ok := s.Find([]byte(text))
			if !ok || got.Reveal() != v {
				t.Errorf("%q, %s: Find = %v, found %v", v, name, got.Reveal() == v, ok)
			}
			// What Find finds, Redact takes out of a log line.
			if red := string(s.Redact([]byte(text))); !strings.Contains(red, Mark) {
				t.Errorf("%q, %s: not redacted: %q", v, name, red)
			}
		}
	}
	for name, text := range map[string]string{
		"short value":        "password=" + short,
		"cut short":          "Bearer " + value[:len(value)-1],
		"one byte changed":   "Bearer " + value[:5] + "X" + value[6:],
		"upper-cased":        strings.ToUpper(value),
		"never held":         "Bearer sk-live-9999999999zyxwvutsrqpo",
		"nothing":            "",
		"shorter than forms": "sk-",
	} {
		if _, ok := s.Find([]byte(text)); ok {
			t.Errorf("%s: found in %q", name, text)
		}
	}
	if _, ok := NewSet(0).Find([]byte(value)); ok {
		t.Error("an empty Set found a value")
	}
	if n := testing.AllocsPerRun(100, func() { s.Find([]byte("GET /v1/models HTTP/1.1 with no value in it at all")) }); n != 0 {
		t.Errorf("Find of clean text: %v allocations", n)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// Pending holds back exactly the end of a text that a form would continue:
// for every cut of a form, a stream that held back Pending's bytes still has
// the form's first byte; clean text holds nothing back.
func TestPendingHoldsBackWhatMayBeginAValue(t *testing.T) {
	odd := "wJalr+XUtn/FEMI=K7MD"
	s := set(value, odd)
	snap := s.snap.Load()
	for _, e := range snap.order {
		for _, f := range e.forms {
			text := append([]byte("lorem ipsum: "), f...)
			start := len(text) - len(f)
			for cut := start + 1; cut < len(text); cut++ {
				if held := s.Pending(text[:cut]); cut-held > start {
					t.Fatalf("form %q cut after %d bytes: %d held back, the form's first byte would go", f, cut-start, held)
				}
			}
		}
	}
	for _, clean := range []string{"", "x", "lorem ipsum dolor", "sk-live-X"} {
		if held := s.Pending([]byte(clean)); held != 0 {
			t.Errorf("%q: %d held back", clean, held)
		}
	}
	if held := s.Pending([]byte("abc sk")); held != 2 {
		t.Errorf("the first bytes of a value: %d held back, want 2", held)
	}
	if held := NewSet(0).Pending([]byte("sk-live")); held != 0 {
		t.Errorf("an empty Set held back %d", held)
	}
}

// Find skips through text by windows as Redact does, yet finds a value
// wherever a search for every form at every byte would.
func FuzzFindFindsWhatEveryPositionWould(f *testing.F) {
	f.Add("sk-live-0123456789abcdefghij", "wJalr+XUtn/FEMI=K7MD", "short", "a sk-live-0123456789abcdefghij b", uint8(3))
	f.Add("AKIA08AbCdEfGhIjKlMn", "p\"w<d>&\\x\tq\u2028é\x01", "abcd", "{\"path\":\"/v1/AKIA08AbCdEfGhIj\"}", uint8(7))
	f.Fuzz(func(t *testing.T, v1, v2, v3, line string, cut uint8) {
		s := set(v1, v2, v3)
		snap := s.snap.Load()
		lines := []string{line}
		for _, e := range snap.order {
			for _, form := range e.forms {
				i := int(cut) % (len(line) + 1)
				lines = append(lines, line[:i]+string(form)+line[i:], string(form[:len(form)/2])+line)
			}
		}
		for _, l := range lines {
			want := false
			for _, e := range snap.order {
				if len(e.raw) < FindMinLen {
					continue
				}
				for _, form := range e.forms {
					want = want || strings.Contains(l, string(form))
				}
			}
			if _, got := s.Find([]byte(l)); got != want {
				t.Fatalf("Find(%q) = %v, want %v", l, got, want)
			}
		}
	})
}

// Find scans a text's two halves at once: a value is found wherever it
// lies, across the middle and at either end included, and in no clean
// text of any length.
func TestFindFindsAValueAnywhere(t *testing.T) {
	s := set(realisticValues()...)
	v := realisticValues()[7]
	text := bytes.Repeat([]byte("lorem ipsum dolor sit amet, "), 20)
	for n := 0; n <= len(text); n++ {
		if _, ok := s.Find(text[:n]); ok {
			t.Fatalf("found in %d clean bytes", n)
		}
	}
	for at := 0; at <= len(text); at++ {
		in := slices.Concat(text[:at], []byte(v), text[at:])
		if got, ok := s.Find(in); !ok || got.Reveal() != v {
			t.Fatalf("value at %d of %d bytes: found %v", at, len(in), ok)
		}
		if got, ok := s.Find(in[at:]); !ok || got.Reveal() != v {
			t.Fatalf("value at the start of %d bytes: found %v", len(in)-at, ok)
		}
		if got, ok := s.Find(in[:at+len(v)]); !ok || got.Reveal() != v {
			t.Fatalf("value at the end of %d bytes: found %v", at+len(v), ok)
		}
	}
}
