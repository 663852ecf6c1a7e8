package await

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fatalRecorder is a testing.TB whose Fatalf records the message and ends
// its goroutine, as the real one does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestAWaitThatNeverEndsFailsNamingIt(t *testing.T) {
	r := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		recvWithin(r, "the host to answer", make(chan int), time.Millisecond)
	}()
	Recv(t, "the recorder's wait to fail", done)
	if want := "waiting for the host to answer: nothing in 1ms"; r.msg != want {
		t.Fatalf("failed with %q, want %q", r.msg, want)
	}
}

func TestRecvAndGroupReturnWhatCame(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if v := Recv(t, "a value", ch); v != 7 {
		t.Fatalf("Recv = %d, want 7", v)
	}
	close(ch)
	if v, ok := RecvOK(t, "the close", ch); ok || v != 0 {
		t.Fatalf("RecvOK on a closed channel = %d, %v; want 0, false", v, ok)
	}
	var wg sync.WaitGroup
	ran := false
	wg.Add(1)
	go func() {
		defer wg.Done()
		ran = true
	}()
	Group(t, "the worker", &wg)
	if !ran {
		t.Fatal("Group returned before the worker ended")
	}
}

func TestWithin(t *testing.T) {
	var written atomic.Bool
	go func() { written.Store(true) }()
	if !Within(5*time.Second, written.Load) {
		t.Fatal("Within gave up on a condition that came true")
	}
	start := time.Now()
	if Within(20*time.Millisecond, func() bool { return false }) || time.Since(start) < 20*time.Millisecond {
		t.Fatal("Within held a condition that never came true, or gave up early")
	}
}
