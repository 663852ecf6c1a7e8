package tests

import (
	"bufio"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// stackLog is a local stack's stdout, read as it comes: its log, which
// must be JSON lines throughout (one object a line, whatever logged it).
type stackLog struct {
	mu      sync.Mutex
	lines   []string
	notJSON []string
	// read (capacity 1) is signalled after each line is kept; done is
	// closed at EOF.
	read chan struct{}
	done chan struct{}
}

// logRecord is one line of the log and its msg.
type logRecord struct {
	Msg  string `json:"msg"`
	line string
}

// readStackLog reads r until EOF.
func readStackLog(r io.Reader) *stackLog {
	l := &stackLog{read: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		sc := bufio.NewScanner(r)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			var obj map[string]json.RawMessage
			var rec logRecord
			isRecord := json.Unmarshal([]byte(line), &obj) == nil && json.Unmarshal([]byte(line), &rec) == nil && rec.Msg != ""
			l.mu.Lock()
			l.lines = append(l.lines, line)
			if !isRecord {
				l.notJSON = append(l.notJSON, line)
			}
			l.mu.Unlock()
			select {
			case l.read <- struct{}{}:
			default:
			}
		}
	}()
	return l
}

// find returns the first record with msg at or after line from, and the
// line after it.
func (l *stackLog) find(msg string, from int) (logRecord, int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := from; i < len(l.lines); i++ {
		var rec logRecord
		if json.Unmarshal([]byte(l.lines[i]), &rec) == nil && rec.Msg == msg {
			rec.line = l.lines[i]
			return rec, i + 1, true
		}
	}
	return logRecord{}, len(l.lines), false
}

// String is the log so far.
func (l *stackLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// checkJSON fails the test for each line of the log that is not a JSON
// object with a msg: the log is meant for machines, throughout.
func (l *stackLog) checkJSON(t testing.TB) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.notJSON {
		t.Errorf("the local stack's stdout has a line that is no JSON log record: %q", line)
	}
}

// await returns the first record with msg, failing the test when the log
// ends or timeout passes first.
func (l *stackLog) await(t testing.TB, msg string, timeout time.Duration, stderr func() string) logRecord {
	t.Helper()
	deadline := time.After(timeout)
	for from := 0; ; {
		rec, next, ok := l.find(msg, from)
		if ok {
			return rec
		}
		from = next
		select {
		case <-l.read:
		case <-l.done:
			if rec, _, ok := l.find(msg, from); ok {
				return rec
			}
			t.Fatalf("the local stack's log ended before %q:\n%s\nstderr:\n%s", msg, l.String(), stderr())
		case <-deadline:
			t.Fatalf("no %q in the local stack's log in %s:\n%s\nstderr:\n%s", msg, timeout, l.String(), stderr())
		}
	}
}

// wait waits for the log to end (the stack exited) and returns all of it.
func (l *stackLog) wait(t testing.TB) []string {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the local stack's stdout still open 60s after it exited")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// readyRecord is the local stack's "ready" record: where everything is,
// and the commands its banner prints (README: The local stack).
type readyRecord struct {
	Fleet          string `json:"fleet"`
	Store          string `json:"store"`
	Credentials    string `json:"credentials"`
	AdminTokenFile string `json:"adminTokenFile"`
	ProbeEvery     string `json:"probeEvery"`
	SweepEvery     string `json:"sweepEvery"`
	Edge           *struct {
		ID           string   `json:"id"`
		API          string   `json:"api"`
		Proxy        string   `json:"proxy"`
		Probe        string   `json:"probe"`
		SecretsProxy bool     `json:"secretsProxy"`
		Agents       []string `json:"agents"`
		DataDir      string   `json:"dataDir"`
		Config       string   `json:"config"`
		TaskDirs     string   `json:"taskDirs"`
		TasksRunAs   string   `json:"tasksRunAs"`
	} `json:"edge"`
	Demo *struct {
		Upstream        string `json:"upstream"`
		UpstreamAddr    string `json:"upstreamAddr"`
		UpstreamCA      string `json:"upstreamCA"`
		Secret          string `json:"secret"`
		SecretsFile     string `json:"secretsFile"`
		Caller          string `json:"caller"`
		CallerTokenFile string `json:"callerTokenFile"`
		Dispatch        string `json:"dispatch"`
		Stream          string `json:"stream"`
		DemoRun         string `json:"demoRun"`
	} `json:"demo"`
	SecondEdge *struct {
		ID            string `json:"id"`
		Config        string `json:"config"`
		API           string `json:"api"`
		CredentialRef string `json:"credentialRef"`
	} `json:"secondEdge"`
	Try []string `json:"try"`
}

// awaitReady waits for the "ready" record and decodes it.
func (l *stackLog) awaitReady(t testing.TB, timeout time.Duration, stderr func() string) readyRecord {
	t.Helper()
	rec := l.await(t, "ready", timeout, stderr)
	var r readyRecord
	if err := json.Unmarshal([]byte(rec.line), &r); err != nil || r.Fleet == "" || len(r.Try) != 3 {
		t.Fatalf("the ready record %s: %v", rec.line, err)
	}
	return r
}
