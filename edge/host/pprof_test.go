package host

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"testing"
)

// proxy.pprof serves net/http/pprof on its own loopback address, and only
// when set.
func TestPprofServesProfilesOnlyWhenSet(t *testing.T) {
	off := newFixture(t).open(hostOptions{})
	if addr := off.PprofAddr(); addr != "" {
		t.Fatalf("profiles served on %s without proxy.pprof", addr)
	}

	f := newFixture(t)
	f.pprof = "127.0.0.1:0"
	h := f.open(hostOptions{})
	base := "http://" + h.PprofAddr() + "/debug/pprof/"
	get := func(path string) []byte {
		t.Helper()
		res, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, res.StatusCode, b)
		}
		return b
	}
	if index := get(""); !bytes.Contains(index, []byte("goroutine")) {
		t.Fatalf("the index lists no profiles:\n%s", index)
	}
	for _, name := range []string{"mutex", "block", "heap"} {
		if _, err := gzip.NewReader(bytes.NewReader(get(name))); err != nil {
			t.Fatalf("the %s profile is not a gzipped profile: %v", name, err)
		}
	}
}

// A mutex profile over some seconds samples contention for those seconds
// only: sampling left on would tax every lock under load.
func TestMutexSamplingOnlyWhileAProfileIsTaken(t *testing.T) {
	var during []int
	s := &sampled{
		profile: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			during = append(during, runtime.SetMutexProfileFraction(-1))
		}),
		set: func(on bool) { runtime.SetMutexProfileFraction(map[bool]int{true: mutexProfileFraction}[on]) },
	}
	for _, target := range []string{"/debug/pprof/mutex?seconds=5", "/debug/pprof/mutex"} {
		s.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, target, nil))
		if after := runtime.SetMutexProfileFraction(-1); after != 0 {
			t.Fatalf("%s left mutex sampling at 1 in %d", target, after)
		}
	}
	if want := []int{mutexProfileFraction, 0}; !slices.Equal(during, want) {
		t.Fatalf("sampling during a delta profile and a plain one: %v, want %v", during, want)
	}
}
