package host

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
)

// BenchmarkHundredConcurrentRuns starts 100 runs at once through the host
// API, each declaring a secret (so each is registered with the proxy, gets a
// fresh proxy credential and a trust file) and writing 64 KiB of output,
// and waits until all have succeeded. One iteration is one batch of 100,
// after an untimed warm-up batch.
// It reports edge's heap at its peak and after the batches, and the peak
// RSS of the whole test process, to show memory stays bounded while the
// runs' records and events accumulate on disk.
func BenchmarkHundredConcurrentRuns(b *testing.B) {
	const runs = 100
	f := newFixture(b)
	f.runner = map[string]any{"maxConcurrent": runs}
	e := f.open(hostOptions{})
	prompt := `head -c 65536 /dev/zero | tr '\0' x; echo; echo "key=${#API_TOKEN}"`

	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	// A first batch, untimed, warms edge up (first handshakes, bbolt's
	// pages, pools), so what is retained afterwards is the batches' own.
	batch(b, e, "warmup", runs, prompt)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	goroutinesBefore := runtime.NumGoroutine()

	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		batch(b, e, strconv.Itoa(i), runs, prompt)
	}
	b.StopTimer()
	close(stop)
	<-sampled

	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	total := float64(b.N * runs)
	b.ReportMetric(total/b.Elapsed().Seconds(), "runs/s")
	b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heap-MiB")
	b.ReportMetric(float64(after.HeapInuse)/(1<<20), "heap-after-MiB")
	b.ReportMetric((float64(after.HeapInuse)-float64(before.HeapInuse))/total, "retained-heap-B/run")
	b.ReportMetric(float64(runtime.NumGoroutine()-goroutinesBefore), "goroutines-added")
	if kb := vmHWM(); kb > 0 {
		b.ReportMetric(float64(kb)/1024, "peak-rss-MiB")
	}
	b.StartTimer()
}

// vmHWM is the process's peak resident set in KiB (/proc/self/status).
func vmHWM() int {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return kb
		}
	}
	return 0
}

// batch starts runs at once, each with its own client token, and waits
// until every one has succeeded.
func batch(b *testing.B, e *edgeHost, name string, runs int, prompt string) {
	var wg sync.WaitGroup
	ids := make([]string, runs)
	for j := 0; j < runs; j++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run, err := e.client.Start(bg, hostproto.StartRequest{
				ClientToken: fmt.Sprintf("bench-%s-%d", name, j),
				Request: runspec.Request{
					Agent:   "shell",
					Prompt:  prompt,
					Secrets: e.apiToken(),
				},
			})
			if err != nil {
				b.Error(err)
				return
			}
			ids[j] = run.RunID
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id == "" {
			b.Fatal("a start failed")
		}
		if r := e.waitEnd(id); r.Status != hostproto.StatusSucceeded {
			b.Fatalf("run %s ended %+v", id, r)
		}
	}
}
