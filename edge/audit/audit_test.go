package audit

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
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

// The ledger gets every entry, in the order recorded, once its batch is
// written: a timed flush hands it on from the timer's goroutine, and Flush
// before it returns. An entry recorded for the ledger alone reaches it in
// its place among the others, and neither the file nor the metrics.
func TestLedgerGetsEveryEntryInOrder(t *testing.T) {
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	fake := clock.NewFake(time.Unix(1_800_000_000, 0))
	var mu sync.Mutex
	var got []Entry
	batches := 0
	l, err := Open(Config{Dir: dir, Registerer: reg, Clock: fake, Logger: slog.New(slog.DiscardHandler),
		Ledger: func(batch []Entry) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, batch...)
			batches++
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	seen := func() []Entry {
		mu.Lock()
		defer mu.Unlock()
		return append([]Entry(nil), got...)
	}
	l.Record(Entry{Task: "run-1", Action: Substituted, Host: "a.test:443", Path: "/one", Query: "q=*"})
	l.RecordLedgerOnly(Entry{Task: "run-1", Action: Denied, Via: ViaDNS, Host: "nope.test", Reason: "refused"})
	l.Record(Entry{Task: "run-1", Action: Blocked, Host: "a.test:443", Path: "/two"})
	if len(seen()) != 0 {
		t.Fatal("the ledger got entries before their flush")
	}
	fake.Advance(FlushEvery)
	await.Cond(t, 5*time.Second, "the timed flush to hand the batch on", func() bool { return len(seen()) == 3 })
	l.Record(Entry{Task: "run-2", Action: Forwarded, Host: "b.test:443", Query: strings.Repeat("k=*&", 1000)})
	l.Flush()
	all := seen()
	if len(all) != 4 {
		t.Fatalf("after Flush the ledger holds %d entries, want 4", len(all))
	}
	for i, want := range []string{"/one", "", "/two", ""} {
		if all[i].Path != want {
			t.Errorf("entry %d: path %q, want %q (order: %+v)", i, all[i].Path, want, all)
		}
	}
	if all[0].Query != "q=*" || all[1].Via != ViaDNS || all[1].TS.IsZero() {
		t.Errorf("entries as handed on: %+v", all[:2])
	}
	if q := all[3].Query; len(q) > MaxPathBytes || !strings.HasSuffix(q, "…") {
		t.Errorf("a long query is %d bytes, want it cut to %d", len(q), MaxPathBytes)
	}
	b, err := os.ReadFile(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(string(b), "\n"); lines != 3 || strings.Contains(string(b), "nope.test") || strings.Contains(string(b), "q=") {
		t.Errorf("the file holds %d lines, want 3, without the ledger's alone nor a query:\n%s", lines, b)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range families {
		if fam.GetName() != "edge_proxy_decisions_total" {
			continue
		}
		for _, m := range fam.GetMetric() {
			if m.GetLabel()[0].GetValue() == string(Denied) {
				t.Errorf("the ledger's entry was counted as a decision of the proxy: %v", m)
			}
		}
	}
}

// Without a ledger, an entry for the ledger alone goes nowhere.
func TestRecordLedgerOnlyWithoutALedgerDoesNothing(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(Config{Dir: dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	l.RecordLedgerOnly(Entry{Task: "run-1", Action: Denied, Via: ViaDNS, Host: "nope.test"})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, FileName)); len(b) != 0 {
		t.Errorf("the file holds %q", b)
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
