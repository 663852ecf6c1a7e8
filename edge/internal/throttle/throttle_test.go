package throttle

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

func lines(t *testing.T, buf *syncbuf.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func waitLines(t *testing.T, buf *syncbuf.Buffer, n int) []map[string]any {
	t.Helper()
	var got []map[string]any
	if !await.Within(5*time.Second, func() bool { got = lines(t, buf); return len(got) >= n }) {
		t.Fatalf("%d log lines, want %d: %s", len(got), n, buf.String())
	}
	return got
}

// closed polls until key's interval has ended (its timer runs on a
// goroutine of its own).
func closed(t *testing.T, l *Log, key string) {
	t.Helper()
	if !await.Within(5*time.Second, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.windows[key] == nil
	}) {
		t.Fatalf("the interval of %q never ended", key)
	}
}

func TestTheFirstLineThenOneCountPerInterval(t *testing.T) {
	var buf syncbuf.Buffer
	clk := clock.NewFake(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	l := New(slog.New(slog.NewJSONHandler(&buf, nil)), clk, time.Minute)

	for i := range 50 {
		l.Error("disk", "recording output", "run", "run-1", "n", i)
	}
	got := lines(t, &buf)
	if len(got) != 1 || got[0]["msg"] != "recording output" || got[0]["n"] != 0.0 || got[0][FieldSuppressed] != nil {
		t.Fatalf("after 50 lines at once the log holds %v, want the first line alone", got)
	}
	// Another condition is not held back by this one.
	l.Warn("other", "storage low")
	if got = lines(t, &buf); len(got) != 2 || got[1]["msg"] != "storage low" || got[1]["level"] != "WARN" {
		t.Fatalf("another condition's first line: %v", got)
	}

	clk.Advance(time.Minute)
	got = waitLines(t, &buf, 3)
	sum := got[2]
	if sum[FieldSuppressed] != 49.0 || sum["level"] != "ERROR" || !strings.HasPrefix(sum["msg"].(string), "recording output") || sum["n"] != 49.0 {
		t.Fatalf("the summary line is %v, want 49 suppressed with the newest line's fields", sum)
	}
	closed(t, l, "other") // no line was held back: no summary

	// The condition goes on: the next interval counts again.
	await.Recv(t, "the throttle to arm its timer", clk.WaitForTimers(1))
	l.Error("disk", "recording output", "n", 50)
	l.Error("disk", "recording output", "n", 51)
	if n := len(lines(t, &buf)); n != 3 {
		t.Fatalf("%d lines within the second interval, want none new", n)
	}
	clk.Advance(time.Minute)
	if got = waitLines(t, &buf, 4); got[3][FieldSuppressed] != 2.0 {
		t.Fatalf("second summary %v, want 2 suppressed", got[3])
	}
	// A quiet interval ends the condition: its next line is logged whole.
	await.Recv(t, "the throttle to arm its timer", clk.WaitForTimers(1))
	clk.Advance(time.Minute)
	closed(t, l, "disk")
	if n := len(lines(t, &buf)); n != 4 {
		t.Fatalf("a quiet interval logged %d lines, want none", n-4)
	}
	l.Error("disk", "recording output", "n", 52)
	if got = lines(t, &buf); len(got) != 5 || got[4]["n"] != 52.0 || got[4][FieldSuppressed] != nil {
		t.Fatalf("after a quiet interval: %v", got)
	}
}
