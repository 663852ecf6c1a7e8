package host

import (
	"net/http"
	"net/http/pprof"
	"runtime"
	"time"
)

// Profiling rates while proxy.pprof is set: one mutex contention event in
// 5 and one blocking event per 10µs blocked are sampled, enough to see
// where goroutines wait under load at a cost the profile itself shows.
const (
	mutexProfileFraction = 5
	blockProfileRate     = int(10 * time.Microsecond)
)

// newPprofServer serves net/http/pprof's handlers on a mux of its own (never
// http.DefaultServeMux, which other packages may register on) and turns on
// mutex and block profiling for the process.
func newPprofServer() *http.Server {
	runtime.SetMutexProfileFraction(mutexProfileFraction)
	runtime.SetBlockProfileRate(blockProfileRate)
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
}
