package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/proxy/placeholder"
)

// echoWindow is what a streamed answer holds back for key B's 29-byte value
// (answerWindow).
const echoWindow = 256

// The answer oracle of issue 12, as an attacker runs it: an upstream that
// echoes each piece of a streamed request body as it comes (an LLM API
// repeating a prompt), the task sending guesses at key B's value and
// watching when their echo reaches it: the echo of a guess ends with the
// guess, which the old scrubber held back only if it began the value. A guess that is a prefix of the
// value and one that is not (same length, same place) are released the
// same way: at each step the same number of answer bytes has arrived, and
// that number is all the proxy has read less a fixed window. The value
// itself, echoed whole (split across the upstream's writes), reaches the
// task as its placeholder. Over HTTP/1.1 and HTTP/2 to the proxy.
func TestAnswerReleaseDoesNotTellAPrefixOfAValue(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			f := newFixture(t, "open")
			echoUpstream(f)
			filler := strings.Repeat("#", echoWindow+44)
			var runs [2][]int
			for i, guess := range []func(k int) string{
				func(k int) string { return realB[:k] },              // (a) a prefix of the value
				func(k int) string { return strings.Repeat("x", k) }, // (b) not one
			} {
				e := startEchoTask(t, f, h2, "Bearer "+f.phB)
				step := func(s string) {
					e.send(s)
					// Everything echoed but the window, never more: the
					// next piece is not sent before this is checked.
					echoed := len(e.echoed())
					want := max(echoed-echoWindow, 0)
					got := e.waitFor(want)
					if got != want {
						t.Errorf("run %d: %d answer bytes arrived after %d echoed, want %d", i, got, echoed, want)
					}
					runs[i] = append(runs[i], got)
				}
				step(filler)
				// Every guess shorter than a fragment: one of FragmentBytes
				// or more comes back as the placeholder, by content
				// (TestSetConfirmsNoGuess), whenever it arrives.
				for _, k := range []int{1, 2, 10, placeholder.FragmentBytes - 1} {
					step(guess(k) + "~")
					step(filler)
				}
				e.send("the value: " + f.phB + " ~")
				body := e.end()
				if want := e.echoed(); body != want {
					t.Errorf("run %d: the answer is not the echo with the placeholder (%d bytes, want %d; holds the value: %v)",
						i, len(body), len(want), strings.Contains(body, realB))
				}
			}
			if fmt.Sprint(runs[0]) != fmt.Sprint(runs[1]) {
				t.Errorf("bytes arrived %v after guessing a prefix, %v after guessing another string", runs[0], runs[1])
			}
		})
	}
}

// A value put in a streamed request body after its answer began (nothing
// substituted before it) is scrubbed from its echo, split across the
// upstream's writes, all the same. The answer is held back by the window
// from its start: the run's values are known before any is substituted.
func TestValueSubstitutedWhileTheAnswerStreamsIsScrubbed(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			f := newFixture(t, "open")
			echoUpstream(f)
			e := startEchoTask(t, f, h2, "")
			e.send("nothing secret yet " + strings.Repeat("#", echoWindow))
			if want := len(e.echoed()) - echoWindow; e.waitFor(want) != want {
				t.Fatalf("%d of %d bytes arrived", e.waitFor(want), want)
			}
			for range 3 {
				e.send("echo " + f.phB + " ~")
			}
			body := e.end()
			if body != e.echoed() {
				t.Fatalf("the answer is not the echo with the placeholder (%d bytes, want %d; holds the value: %v, its first half: %v)",
					len(body), len(e.echoed()), strings.Contains(body, realB), strings.Contains(body, realB[:len(realB)/2]))
			}
			line := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/echo" })
			if line["scrubbed"] != float64(3) {
				t.Errorf("audit %v", line)
			}
		})
	}
}

// Server-sent events stay interactive: each event reaches the task as soon
// as its blank line does, however short (far below the window); an event
// whose value the upstream split across two writes reaches it whole, with
// the placeholder.
func TestServerSentEventsGoOutAsTheyEnd(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			f := newFixture(t, "open")
			writes := make(chan string)
			var once sync.Once
			stop := func() { once.Do(func() { close(writes) }) }
			t.Cleanup(stop) // before the upstream's Close, which waits for the handler
			f.up.handler = func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				for s := range writes {
					io.WriteString(w, s)
					w.(http.Flusher).Flush()
				}
			}
			req := mustRequest(t, "https://"+f.other+"/events", "Bearer "+f.phB)
			res, err := f.goClient(f.proxyURL, h2).Do(req)
			must(t, err)
			defer res.Body.Close()
			a := readAnswer(res.Body)
			sent := ""
			event := func(parts ...string) {
				for _, p := range parts {
					writes <- p
				}
				sent += strings.Join(parts, "")
				want := strings.ReplaceAll(sent, realB, f.phB)
				if got := a.waitFor(len(want)); got != len(want) || a.text() != want {
					t.Fatalf("after %q: %d answer bytes arrived, want the %d of every event so far", parts, got, len(want))
				}
			}
			event("data: one\n\n")
			event(`data: {"delta": "tw`, `o"}`+"\n", "\n")
			event("data: "+realB[:12], realB[12:]+"\n\n")
			event("id: 4\ndata: four\n\n")
			stop()
			if body := a.wait(t); body != strings.ReplaceAll(sent, realB, f.phB) {
				t.Fatalf("the stream ended as %q", body)
			}
		})
	}
}

// echoUpstream makes f's upstream echo a request body piece by piece as it
// comes, each piece in two writes, flushed, so that what it echoes is
// split, and without the '~' that ends a piece (or any other): a task ends
// a guess with one so that the request's own scanner, which holds back a run of bytes a
// placeholder could hold, lets it go, and the echo still ends with the
// guess (as an API's echo of a prompt ends with the prompt). It reads on
// while it writes (full duplex).
func echoUpstream(f *fixture) {
	f.up.noRecord = true
	f.up.handler = func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex() // HTTP/2 always is
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		rc.Flush()
		buf := make([]byte, 4096)
		for {
			n, err := r.Body.Read(buf)
			echo := bytes.ReplaceAll(buf[:n], []byte("~"), nil)
			if len(echo) > 0 {
				w.Write(echo[:len(echo)/2])
				rc.Flush()
				w.Write(echo[len(echo)/2:])
				rc.Flush()
			}
			if err != nil {
				return
			}
		}
	}
}

// echoTask is a task's request to an echoing upstream whose body it writes
// piece by piece while it reads the answer.
type echoTask struct {
	t    *testing.T
	pw   *io.PipeWriter
	sent []byte // what the task wrote
	a    *answerReader
}

// startEchoTask posts to f.other's /echo with the body still open; auth is
// the Authorization field ("" for none).
func startEchoTask(t *testing.T, f *fixture, h2 bool, auth string) *echoTask {
	t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, "https://"+f.other+"/echo", pr)
	must(t, err)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	type result struct {
		res *http.Response
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := f.goClient(f.proxyURL, h2).Do(req)
		done <- result{res, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("no answer head")
	}
	must(t, r.err)
	if r.res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", r.res.StatusCode)
	}
	t.Cleanup(func() { pw.CloseWithError(io.ErrUnexpectedEOF); r.res.Body.Close() })
	return &echoTask{t: t, pw: pw, a: readAnswer(r.res.Body)}
}

// send writes s as one piece of the body (one chunk on HTTP/1.1).
func (e *echoTask) send(s string) {
	e.t.Helper()
	if _, err := io.WriteString(e.pw, s); err != nil {
		e.t.Fatalf("sending: %v", err)
	}
	e.sent = append(e.sent, s...)
}

// echoed is what the upstream echoes of what the task sent.
func (e *echoTask) echoed() string { return strings.ReplaceAll(string(e.sent), "~", "") }

// waitFor is answerReader.waitFor.
func (e *echoTask) waitFor(n int) int { return e.a.waitFor(n) }

// end closes the body and returns the whole answer.
func (e *echoTask) end() string {
	e.t.Helper()
	e.pw.Close()
	return e.a.wait(e.t)
}

// answerReader reads an answer body as it arrives, keeping it.
type answerReader struct {
	mu      sync.Mutex
	got     []byte
	err     error // the read's end: io.EOF for a complete body
	arrived chan struct{}
}

func readAnswer(body io.Reader) *answerReader {
	a := &answerReader{arrived: make(chan struct{}, 1)}
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := body.Read(buf)
			a.mu.Lock()
			a.got = append(a.got, buf[:n]...)
			if err != nil {
				a.err = err
			}
			a.mu.Unlock()
			select {
			case a.arrived <- struct{}{}:
			default:
			}
			if err != nil {
				return
			}
		}
	}()
	return a
}

func (a *answerReader) text() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return string(a.got)
}

// waitFor waits (up to 10s) until at least n bytes or the end arrived, and
// returns how many bytes have.
func (a *answerReader) waitFor(n int) int {
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		a.mu.Lock()
		got, end := len(a.got), a.err != nil
		a.mu.Unlock()
		if got >= n || end {
			return got
		}
		select {
		case <-a.arrived:
		case <-deadline.C:
			return got
		}
	}
}

// wait waits (up to 10s) for the body's end and returns it; a body that did
// not end cleanly fails the test.
func (a *answerReader) wait(t *testing.T) string {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		a.mu.Lock()
		body, err := string(a.got), a.err
		a.mu.Unlock()
		if err == io.EOF {
			return body
		}
		if err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		select {
		case <-a.arrived:
		case <-deadline.C:
			t.Fatal("the answer did not end")
		}
	}
}
