package audit

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/tests/kit/await"
)

func TestAuditLinesRotateAndCount(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "logs")
	reg := prometheus.NewRegistry()
	fake := clock.NewFake(time.Unix(1_800_000_000, 0))
	l, err := Open(Config{Dir: dir, MaxBytes: 600, Keep: 2, Registerer: reg, Clock: fake, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := 0; i < 20; i++ {
		l.Record(Entry{TS: time.Unix(1_800_000_000, 0), Task: "run-1", Action: Substituted, Keys: []string{"acme/K"},
			Host: "api.example.test:443", Method: "GET", Path: "/v1/x", Status: 200, BytesOut: 12, Duration: 1500 * time.Microsecond})
	}
	l.Record(Entry{Task: "run-1", Action: Blocked, Reason: "key acme/K may not reach b.example:443", Host: "b.example:443", Status: 403})
	// Lines are batched: the last one is written within FlushEvery.
	if b, _ := os.ReadFile(filepath.Join(dir, FileName)); strings.Contains(string(b), "blocked") {
		t.Fatal("written before the flush")
	}
	fake.Advance(FlushEvery)
	// The flush runs on the timer's goroutine: wait for it.
	await.Cond(t, 5*time.Second, "the timed flush to write the line", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, FileName))
		return strings.Contains(string(b), "blocked")
	})

	fi, err := os.Stat(filepath.Join(dir, FileName))
	if err != nil || fi.Size() > 600 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("live file: %v %v", fi, err)
	}
	for _, name := range []string{FileName + ".1", FileName + ".2"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("rotated file %s: %v", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, FileName+".3")); err == nil {
		t.Error("more than Keep rotated files")
	}
	// The last line is the blocked one, well formed.
	f, _ := os.Open(filepath.Join(dir, FileName))
	defer f.Close()
	var last map[string]any
	for sc := bufio.NewScanner(f); sc.Scan(); {
		last = nil
		if err := json.Unmarshal(sc.Bytes(), &last); err != nil {
			t.Fatal(err)
		}
	}
	if last["action"] != "blocked" || last["task"] != "run-1" || last["status"] != float64(403) || last["ts"] == nil || last["durationMs"] == nil {
		t.Errorf("last line = %v", last)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	for _, fam := range families {
		if fam.GetName() != "edge_proxy_decisions_total" {
			continue
		}
		for _, m := range fam.GetMetric() {
			counts[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	if counts["substituted"] != 20 || counts["blocked"] != 1 {
		t.Errorf("counters = %v", counts)
	}
}

// What a task can choose is cut to the caps before it is written: a line
// stays small whatever a task sends.
func TestLongFieldsAreCut(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(Config{Dir: dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	l.Record(Entry{Action: Denied, Method: strings.Repeat("M", 5000), Host: strings.Repeat("h", 5000) + ":443",
		Path: "/" + strings.Repeat("é", 5000), Reason: strings.Repeat("r", 5000)})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, FileName))
	var line map[string]string
	_ = json.Unmarshal(b, &line) // numbers do not fit; the strings do
	for field, max := range map[string]int{"method": MaxMethodBytes, "host": MaxHostBytes, "path": MaxPathBytes, "reason": MaxReasonBytes} {
		v := line[field]
		if len(v) > max || !strings.HasSuffix(v, "…") || !utf8.ValidString(v) {
			t.Errorf("%s: %d bytes (cap %d), valid UTF-8 %v", field, len(v), max, utf8.ValidString(v))
		}
	}
}

// Config.Redact gets each encoded line whole, newline included, and what
// it returns is what the file holds (rotation counts the redacted size).
func TestRedactFiltersEveryLine(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "logs")
	var seen []string
	redact := func(line []byte) []byte {
		seen = append(seen, string(line))
		return []byte(strings.ReplaceAll(string(line), "sk-real-value", "[redacted]"))
	}
	l, err := Open(Config{Dir: dir, Logger: slog.New(slog.DiscardHandler), Redact: redact})
	if err != nil {
		t.Fatal(err)
	}
	l.Record(Entry{Task: "run-1", Action: Denied, Host: "sk-real-value.example:443", Path: "/sk-real-value"})
	l.Record(Entry{Task: "run-1", Action: Forwarded, Host: "a.example:443", Path: "/ok"})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, FileName))
	if strings.Contains(string(b), "sk-real-value") || strings.Count(string(b), "[redacted]") != 2 || strings.Count(string(b), "\n") != 2 {
		t.Fatalf("file:\n%s", b)
	}
	if len(seen) != 2 || !strings.HasSuffix(seen[0], "}\n") || !strings.Contains(seen[0], "sk-real-value") {
		t.Fatalf("Redact saw %q", seen)
	}
}

// Decisions are counted by the flush, off the request's path; a scrape
// flushes first, so it counts every decision recorded before it, though no
// timed flush has run (the fake clock never moves here).
func TestScrapeCountsEveryRecordedDecision(t *testing.T) {
	reg := prometheus.NewRegistry()
	l, err := Open(Config{Dir: t.TempDir(), Registerer: reg, Clock: clock.NewFake(time.Unix(1_800_000_000, 0)),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := 0; i < 3; i++ {
		l.Record(Entry{Action: Substituted, Host: "a.test:443", BytesIn: 5, BytesOut: 7, Duration: time.Millisecond, Upstream: time.Millisecond})
	}
	l.Record(Entry{Action: Blocked, Host: "a.test:443"})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, fam := range families {
		for _, m := range fam.GetMetric() {
			name := fam.GetName()
			for _, lp := range m.GetLabel() {
				name += "/" + lp.GetValue()
			}
			switch {
			case m.GetCounter() != nil:
				got[name] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				got[name] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	want := map[string]float64{
		"edge_proxy_decisions_total/substituted": 3, "edge_proxy_decisions_total/blocked": 1,
		"edge_proxy_request_duration_seconds/substituted": 3, "edge_proxy_request_duration_seconds/blocked": 1,
		"edge_proxy_upstream_duration_seconds": 3, "edge_proxy_bytes_total/in": 15, "edge_proxy_bytes_total/out": 21,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}

// BenchmarkRecordParallel: what recording a decision costs the proxy's
// goroutines, recording from every processor at once as requests do.
func BenchmarkRecordParallel(b *testing.B) {
	l, err := Open(Config{Dir: b.TempDir(), Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	e := Entry{TS: time.Unix(1_800_000_000, 0), Task: "run-1", Action: Substituted, Keys: []string{"acme/K"},
		Host: "api.example.test:443", Method: "GET", Path: "/v1/x", Status: 200, BytesOut: 12,
		Duration: 1500 * time.Microsecond, Upstream: time.Millisecond}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.Record(e)
		}
	})
}
