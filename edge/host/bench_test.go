package host

import (
	"fmt"
	"net/http"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/edge/ledger"
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

// BenchmarkKeepAliveLedger: what recording runs' egress ledgers costs the
// proxy, as keep-alive HTTPS requests/s through a whole edge (8
// connections, one substitution per request with a query, a task's
// credential) with the ledger on against the same build with it off, in
// one process. "kept": the ledger's host keeps every record
// (proxy.ledger.maxRecords at its largest, so each is redacted, hashed and
// stored); "bounded": the default bound, past which a busy run's records
// are counted, not kept. The two hosts take turns, rounds interleaved and
// their order alternating, so load from elsewhere lands on both; reported
// are the medians of each side's requests/s and CPU time per request (the
// whole process: client, edge and upstream) and of the per-round ratios.
// ratio (on/off requests/s) is the figure issue 31 bounds: at least 0.95.
func BenchmarkKeepAliveLedger(b *testing.B) {
	b.Run("kept", func(b *testing.B) { keepAliveLedger(b, config.MaxLedgerRecords) })
	b.Run("bounded", func(b *testing.B) { keepAliveLedger(b, ledger.DefaultMaxRecords) })
}

func keepAliveLedger(b *testing.B, bound int) {
	const conc, rounds = 8, 20
	type side struct {
		c          *http.Client
		target, ph string
		rates, cpu []float64
	}
	open := func(off bool) *side {
		f := newFixture(b)
		f.withLedgerBound(bound)
		e := f.openWritten(hostOptions{ledgerOff: off})
		_, proxyURL, ph := e.taskProxy()
		return &side{c: e.proxiedClient(proxyURL, conc, false), target: "https://" + f.upstreamHost + "/v1/bench?page=1", ph: ph}
	}
	on, off := open(false), open(true)
	run := func(s *side, n int) {
		var wg sync.WaitGroup
		errs := make([]error, conc)
		cpu0, start := processCPU(), time.Now()
		for w := range conc {
			wg.Go(func() {
				for i := w; i < n; i += conc {
					if err := call(s.c, s.target, s.ph); err != nil {
						errs[w] = err
						return
					}
				}
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		s.rates = append(s.rates, float64(n)/time.Since(start).Seconds())
		s.cpu = append(s.cpu, float64((processCPU()-cpu0).Microseconds())/float64(n))
	}
	run(on, 400) // warm both: connections, leaves, pools
	run(off, 400)
	on.rates, off.rates, on.cpu, off.cpu = nil, nil, nil, nil
	n := max(b.N/rounds, 2000)
	var ratios, cpuRatios []float64
	b.ResetTimer()
	for round := range rounds {
		if round%2 == 0 {
			run(on, n)
			run(off, n)
		} else {
			run(off, n)
			run(on, n)
		}
		ratios = append(ratios, on.rates[round]/off.rates[round])
		cpuRatios = append(cpuRatios, on.cpu[round]/off.cpu[round])
	}
	b.StopTimer()
	b.ReportMetric(medianOf(on.rates), "ledger_on_req/s")
	b.ReportMetric(medianOf(off.rates), "ledger_off_req/s")
	b.ReportMetric(medianOf(ratios), "ratio")
	b.ReportMetric(medianOf(on.cpu), "ledger_on_cpu_µs/req")
	b.ReportMetric(medianOf(off.cpu), "ledger_off_cpu_µs/req")
	b.ReportMetric(medianOf(cpuRatios), "cpu_ratio")
}

// processCPU is the process's CPU time so far, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func medianOf(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}
