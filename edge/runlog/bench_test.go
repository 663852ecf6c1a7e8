package runlog

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkAppendOutput is what the runner does with a task's output: one
// 4 KiB chunk per append, from one run alone and from 8 at once, at the
// batch delay edge uses and at bbolt's default (10 ms), in one run so the
// two compare as a ratio. A run's appends are sequential (its terminal is
// read, then recorded), so the delay bounds one run's output rate.
func BenchmarkAppendOutput(b *testing.B) {
	chunk := output(strings.Repeat("0123456789abcdef", 256))
	for _, delay := range []time.Duration{batchDelay, 10 * time.Millisecond} {
		for _, runs := range []int{1, 8} {
			b.Run(fmt.Sprintf("delay=%s/runs=%d", delay, runs), func(b *testing.B) {
				l, err := Open(filepath.Join(b.TempDir(), "runs.db"), nil)
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				l.db.MaxBatchDelay = delay
				for i := range runs {
					if _, _, err := l.Create(Record{RunID: fmt.Sprintf("run-%d", i), ClientToken: fmt.Sprintf("tok-%d", i)}); err != nil {
						b.Fatal(err)
					}
				}
				b.SetBytes(int64(len(chunk.Data)) * int64(runs))
				b.ResetTimer()
				var wg sync.WaitGroup
				for i := range runs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range b.N {
							if _, err := l.Append(fmt.Sprintf("run-%d", i), chunk); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
			})
		}
	}
}
