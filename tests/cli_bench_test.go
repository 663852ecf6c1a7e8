package tests

import (
	"bufio"
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkCLIFirstOutput measures, on the local stack, what runfleet adds
// to a run's dispatch-to-first-output over the raw API (issue 32: under
// 50 ms): cli is `runfleet run` from its start to the first byte of the
// task's output on its stdout; curl is a curl of the dispatch, then a curl
// -N of the answer's links.stream, from the first curl's start to the
// first output event. The runs are alike (a shell task printing one line)
// and each is followed to its end before the next. Each reports its median
// (ms-to-first-output), and added what runfleet adds (ms-added, cli/curl).
// Both are about a second: the stream looks for new events once a second
// from its start (stream.DefaultPollInterval), so what a client spends
// before its stream starts shows in full, and a few samples are noisy:
// -benchtime=30x gives a steady median.
func BenchmarkCLIFirstOutput(b *testing.B) {
	s := startDevStack(b, localStackBinary(b), "", devEnv(filepath.Join(b.TempDir(), "data"), ""), nil)
	c := newCLIUser(b, s, s.base(), s.callerToken())
	const task = "echo first"
	medians := map[string]time.Duration{}

	b.Run("cli", func(b *testing.B) {
		medians["cli"] = firstOutputMedian(b, func() time.Duration {
			cmd := exec.Command(c.bin, "run", "--agent", "shell", "--", task)
			cmd.Env = c.env
			return timeToFirst(b, time.Now(), cmd, func(line string) bool { return line == "first" })
		})
	})
	b.Run("curl", func(b *testing.B) {
		body := `{"agent":"shell","prompt":"` + task + `"}`
		auth := "Authorization: Bearer " + c.token
		medians["curl"] = firstOutputMedian(b, func() time.Duration {
			start := time.Now()
			out, err := exec.Command("curl", "-sS", "-H", auth, "-H", "Content-Type: application/json", "-d", body, s.base()+"/fleet/runs").Output()
			var run dispatchedRun
			if err != nil || json.Unmarshal(out, &run) != nil || run.Links.Stream == "" {
				b.Fatalf("the dispatch: %v\n%s", err, out)
			}
			stream := exec.Command("curl", "-sS", "-N", "-H", auth, run.Links.Stream)
			return timeToFirst(b, start, stream, func(line string) bool {
				return strings.HasPrefix(line, "data: ") && strings.Contains(line, `"type":"output"`)
			})
		})
	})
	b.Run("added", func(b *testing.B) {
		cli, curl := medians["cli"], medians["curl"]
		if cli == 0 || curl == 0 {
			b.Skip("needs both cli and curl (-bench 'CLIFirstOutput$')")
		}
		b.ReportMetric(float64(cli-curl)/float64(time.Millisecond), "ms-added")
		b.ReportMetric(float64(cli)/float64(curl), "cli/curl")
		b.Logf("median dispatch-to-first-output: runfleet %v, curl %v; runfleet adds %v (%.3fx)", cli, curl, cli-curl, float64(cli)/float64(curl))
	})
	s.stop(b, syscall.SIGTERM)
}

// dispatchedRun is the part of a dispatch answer the benchmark reads.
type dispatchedRun struct {
	Links struct {
		Stream string `json:"stream"`
	} `json:"links"`
}

// firstOutputMedian runs one b.N times and reports the median of what it
// measured.
func firstOutputMedian(b *testing.B, one func() time.Duration) time.Duration {
	var took []time.Duration
	for b.Loop() {
		took = append(took, one())
	}
	slices.Sort(took)
	median := took[len(took)/2]
	b.ReportMetric(float64(median)/float64(time.Millisecond), "ms-to-first-output")
	return median
}

// timeToFirst starts cmd and returns the time from start to the first line
// of its stdout that match accepts; it reads the rest and waits for cmd to
// exit 0 (the run followed to its end) before it returns.
func timeToFirst(b *testing.B, start time.Time, cmd *exec.Cmd, match func(line string) bool) time.Duration {
	stdout, err := cmd.StdoutPipe()
	must(b, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	must(b, cmd.Start())
	var took time.Duration
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if took == 0 && match(sc.Text()) {
			took = time.Since(start)
		}
	}
	io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil || took == 0 {
		b.Fatalf("%s: %v (first output seen: %t)\n%s", cmd.Args, err, took > 0, stderr.String())
	}
	return took
}
