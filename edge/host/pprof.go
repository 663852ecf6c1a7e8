package host

import (
	"net/http"
	"net/http/pprof"
	"runtime"
	"sync"
	"time"
)

// Sampling while a mutex or block profile is being taken: one contention
// event in 5, and blocking events of 10µs and more (shorter ones in
// proportion). They cost enough under load to skew a CPU profile, so they
// are on only for the seconds such a profile asks for.
const (
	mutexProfileFraction = 5
	blockProfileRate     = int(10 * time.Microsecond)
)

// newPprofServer serves net/http/pprof's handlers on a mux of its own (never
// http.DefaultServeMux, which other packages may register on).
// /debug/pprof/mutex?seconds=N and /debug/pprof/block?seconds=N turn their
// sampling on for those N seconds and return what it saw.
func newPprofServer() *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("/debug/pprof/mutex", &sampled{profile: pprof.Handler("mutex"), set: func(on bool) {
		runtime.SetMutexProfileFraction(map[bool]int{true: mutexProfileFraction}[on])
	}})
	mux.Handle("/debug/pprof/block", &sampled{profile: pprof.Handler("block"), set: func(on bool) {
		runtime.SetBlockProfileRate(map[bool]int{true: blockProfileRate}[on])
	}})
	return &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
}

// sampled serves a profile whose sampling is on only while a delta of it
// (?seconds=N) is being taken; overlapping requests leave it on until the
// last ends.
type sampled struct {
	profile http.Handler
	set     func(on bool)

	mu     sync.Mutex
	active int
}

func (s *sampled) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("seconds") != "" {
		s.turn(+1)
		defer s.turn(-1)
	}
	s.profile.ServeHTTP(w, r)
}

func (s *sampled) turn(by int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active += by
	if s.active == 0 || (by > 0 && s.active == 1) {
		s.set(s.active > 0)
	}
}
