package ledger

import (
	"crypto/ed25519"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/internal/redact"
	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/edge/secrets"
)

// BenchmarkRecordKept: the process's CPU per record kept (converted,
// redacted, hashed, counted and stored in the run log), handed over as the
// audit's flush does, in batches, each batch's pass waited for (through a
// seal: one signature per batch) as the flush interval lets the writer
// keep up: what a host pays per request besides the request itself while
// a run is under its bound.
func BenchmarkRecordKept(b *testing.B) { benchmarkRecord(b, 1_000_000) }

// BenchmarkRecordPastTheBound: the same past the bound, where a record is
// only counted.
func BenchmarkRecordPastTheBound(b *testing.B) { benchmarkRecord(b, 1) }

func benchmarkRecord(b *testing.B, max int) {
	store, err := runlog.Open(filepath.Join(b.TempDir(), "runs.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	if _, _, err := store.Create(runlog.Record{RunID: "run-1", ClientToken: "ct"}); err != nil {
		b.Fatal(err)
	}
	_, key, _ := ed25519.GenerateKey(nil)
	set := redact.NewSet(0)
	set.Add(secrets.NewValue("sk-bench-real-value-0123456789abcdef"))
	l, err := New(Config{Store: store, Key: key, MaxRecords: max, Redact: set.Redact})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	// The audit's largest batch (its maxPending).
	const batchSize = 4096
	batch := make([]audit.Entry, batchSize)
	for i := range batch {
		batch[i] = audit.Entry{TS: time.Unix(1_800_000_000, int64(i)), Task: "run-1", Action: audit.Substituted, Keys: []string{"acme/K"},
			Host: "api.example.test:443", Method: "GET", Path: "/v1/bench", Query: "page=*", Status: 200, BytesIn: 120, BytesOut: 2048,
			Duration: 1500 * time.Microsecond, Upstream: time.Millisecond}
	}
	b.ResetTimer()
	cpu0 := processCPU()
	for i := 0; i < b.N; i += batchSize {
		l.Record(batch[:min(batchSize, b.N-i)])
		if err := l.Seal("run-1"); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/record")
}

// processCPU is the process's CPU time so far, user and system: the
// writer's goroutine and the run log's, not only the benchmark's.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
