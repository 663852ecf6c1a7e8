package redact

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
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
