package syncbuf

import (
	"strings"
	"sync"
	"testing"

	"github.com/runfleet/runfleet/tests/kit/await"
)

func TestConcurrentWritesAllArrive(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				b.Write([]byte("x\n"))
				_ = b.String()
			}
		}()
	}
	await.Group(t, "the concurrent writers", &wg)
	if n := strings.Count(b.String(), "x\n"); n != 800 {
		t.Fatalf("%d lines, want 800", n)
	}
}
