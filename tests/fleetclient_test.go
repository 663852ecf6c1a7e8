package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/fleetclient"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// newTestClient is a fleetclient on the stack with the given token, its
// waits between retries recorded rather than slept.
func newTestClient(t *testing.T, s *stack, token string, rt http.RoundTripper) (*fleetclient.Client, *waits) {
	t.Helper()
	w := &waits{}
	hc := s.srv.Client()
	if rt != nil {
		hc = &http.Client{Transport: rt}
	}
	c, err := fleetclient.New(fleetclient.Options{BaseURL: s.srv.URL + "/", Token: token, HTTPClient: hc, Wait: w.wait})
	if err != nil {
		t.Fatal(err)
	}
	return c, w
}

type waits struct {
	mu  sync.Mutex
	all []time.Duration
}

func (w *waits) wait(ctx context.Context, d time.Duration) error {
	w.mu.Lock()
	w.all = append(w.all, d)
	w.mu.Unlock()
	return ctx.Err()
}

func (w *waits) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.all)
}

// losesAnswers is a transport that delivers a request matching lose to
// the server, reads its answer, and then reports the connection lost, n
// times: the client never learns the answer of a request that took effect.
type losesAnswers struct {
	next http.RoundTripper
	lose func(*http.Request) bool
	mu   sync.Mutex
	n    int
	keys []string // each matching request's Idempotency-Key or body key
}

func (l *losesAnswers) RoundTrip(req *http.Request) (*http.Response, error) {
	if !l.lose(req) {
		return l.next.RoundTrip(req)
	}
	body, _ := io.ReadAll(req.Body)
	var b struct {
		Idempotency string `json:"idempotency"`
	}
	json.Unmarshal(body, &b)
	req.Body = io.NopCloser(bytes.NewReader(body))
	l.mu.Lock()
	l.keys = append(l.keys, b.Idempotency+req.Header.Get("Idempotency-Key"))
	lose := l.n > 0
	l.n--
	l.mu.Unlock()
	resp, err := l.next.RoundTrip(req)
	if err != nil || !lose {
		return resp, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return nil, errors.New("connection reset by peer (the test lost the answer)")
}

// TestClientDispatchRetriesWithItsKey: a dispatch whose answer is lost is
// sent again with the same generated idempotency key, and Fleet answers it
// with the run the first try created: one run on the host, not two.
func TestClientDispatchRetriesWithItsKey(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{})
			host := s.addHost(t, "h1", fakehost.Config{}, nil)
			s.probe(t, "h1")
			alice := s.mint(t, "alice", "*", "*")
			lost := &losesAnswers{next: s.srv.Client().Transport, n: 2, lose: func(r *http.Request) bool {
				return r.Method == http.MethodPost && r.URL.Path == "/fleet/runs"
			}}
			c, w := newTestClient(t, s, alice, lost)

			d, err := c.Dispatch(context.Background(), fleetapi.DispatchRequest{Agent: "shell", Prompt: "true"})
			if err != nil {
				t.Fatalf("dispatch: %v", err)
			}
			if !d.Reused || d.HTTPStatus != http.StatusOK || d.FleetRunID == "" {
				t.Fatalf("the third try's answer: reused %v, status %d, run %q; want the first try's run, reused", d.Reused, d.HTTPStatus, d.FleetRunID)
			}
			if host.Created() != 1 {
				t.Fatalf("the host created %d runs; want 1", host.Created())
			}
			if len(lost.keys) != 3 || lost.keys[0] == "" || lost.keys[1] != lost.keys[0] || lost.keys[2] != lost.keys[0] || d.IdempotencyKey != lost.keys[0] {
				t.Fatalf("the tries carried keys %q (answer's %q); want one generated key, three times", lost.keys, d.IdempotencyKey)
			}
			if w.count() != 2 {
				t.Fatalf("waited %d times between tries; want 2", w.count())
			}

			// A caller's own key is sent as given, and a second client's
			// dispatch of the same key finds the same run.
			c2, _ := newTestClient(t, s, alice, nil)
			own, err := c2.Dispatch(context.Background(), fleetapi.DispatchRequest{Agent: "shell", Prompt: "true", Idempotency: "job-42"})
			if err != nil || own.IdempotencyKey != "job-42" || own.HTTPStatus != http.StatusCreated {
				t.Fatalf("own key: %+v, %v", own, err)
			}
			again, err := c2.Dispatch(context.Background(), fleetapi.DispatchRequest{Agent: "shell", Prompt: "true", Idempotency: "job-42"})
			if err != nil || !again.Reused || again.FleetRunID != own.FleetRunID {
				t.Fatalf("the same key again: %+v, %v; want run %s reused", again, err, own.FleetRunID)
			}
		})
	}
}

// TestClientNeverRepeatsInput: an input whose answer is lost is not sent
// again (the task would read it twice): the caller gets the failure.
func TestClientNeverRepeatsInput(t *testing.T) {
	s := newStack(t, "bolt", stackOptions{})
	host, alice, id, child := s.aliceRun(t)
	lost := &losesAnswers{next: s.srv.Client().Transport, n: 1, lose: func(r *http.Request) bool {
		return strings.HasSuffix(r.URL.Path, "/input")
	}}
	c, _ := newTestClient(t, s, alice, lost)
	if _, err := c.Input(context.Background(), id, "yes\n"); err == nil {
		t.Fatal("an input whose answer was lost reported success")
	}
	if got := host.Inputs(child); len(got) != 1 {
		t.Fatalf("the host received %d inputs; want the one that was sent", len(got))
	}
}

// TestClientErrorsCarryTheAPIsCodeAndDetails: every refusal is an *Error
// with the API's status, code, message and details, and none names the
// token.
func TestClientErrorsCarryTheAPIsCodeAndDetails(t *testing.T) {
	s := newStack(t, "bolt", stackOptions{})
	s.addHost(t, "h1", fakehost.Config{}, nil)
	s.probe(t, "h1")
	alice := s.mint(t, "alice", "*", "*")
	c, _ := newTestClient(t, s, alice, nil)
	ctx := context.Background()

	_, err := c.Dispatch(ctx, fleetapi.DispatchRequest{Agent: "nobody-runs-this"})
	var apiErr *fleetclient.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusConflict || apiErr.Code != fleetapi.CodeNoEligibleHost {
		t.Fatalf("an agent no host has: %v; want 409 no_eligible_host", err)
	}
	details, ok := apiErr.NoEligibleHost()
	if !ok || len(details.Excluded) != 1 || details.Excluded[0].HostID != "h1" || len(details.Excluded[0].Reasons) == 0 {
		t.Fatalf("no_eligible_host details %+v (%v); want h1 excluded with its reasons", details, ok)
	}

	_, err = c.Dispatch(ctx, fleetapi.DispatchRequest{Agent: "shell", Secrets: []runspec.Secret{{ProjectID: "p", Key: "bad key", Domains: []string{"a.example"}}}})
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest || !strings.Contains(apiErr.Message, "key") {
		t.Fatalf("a bad secret key: %v; want a 400 naming the key", err)
	}

	_, err = c.Run(ctx, "run-that-does-not-exist")
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound || apiErr.Code == "" {
		t.Fatalf("an unknown run: %v; want a 404 with a code", err)
	}

	_, err = c.DrainHost(ctx, "h1")
	if !fleetclient.IsCode(err, "admin_required") {
		t.Fatalf("a caller draining a host: %v; want admin_required", err)
	}

	wrong, _ := newTestClient(t, s, "rft_not-a-token-anyone-minted", nil)
	_, err = wrong.Hosts(ctx)
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnauthorized || strings.Contains(err.Error(), "rft_not-a-token") {
		t.Fatalf("a wrong token: %v; want a 401 that does not repeat the token", err)
	}
	if _, err := fleetclient.New(fleetclient.Options{BaseURL: "127.0.0.1:8080"}); err == nil || !strings.Contains(err.Error(), "http") {
		t.Fatalf("a base URL without a scheme: %v; want a refusal saying what to write", err)
	}
}

// cutsStreams is a transport that cuts each stream connection whose number
// is in cut in the middle of its second message: the client sees the
// connection fail with half a message read.
type cutsStreams struct {
	next http.RoundTripper
	cut  map[int]bool
	mu   sync.Mutex
	n    int
	last []string // each stream request's Last-Event-ID
}

func (c *cutsStreams) RoundTrip(req *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(req.URL.Path, "/stream") {
		return c.next.RoundTrip(req)
	}
	c.mu.Lock()
	c.n++
	cut := c.cut[c.n]
	c.last = append(c.last, req.Header.Get("Last-Event-ID"))
	c.mu.Unlock()
	resp, err := c.next.RoundTrip(req)
	if err == nil && cut {
		resp.Body = &cutBody{ReadCloser: resp.Body}
	}
	return resp, err
}

func (c *cutsStreams) lastEventIDs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.last...)
}

// cutBody passes the body through until 8 bytes past its first blank line
// (the end of the first message), then fails as a reset connection does.
// A stream that ends sooner (its planned end raced the cut, on a busy
// machine) fails the same way: a cut connection never ends cleanly.
type cutBody struct {
	io.ReadCloser
	seen   []byte
	cutAt  int
	passed int
}

func (b *cutBody) Read(p []byte) (int, error) {
	if b.cutAt > 0 && b.passed >= b.cutAt {
		return 0, io.ErrUnexpectedEOF
	}
	n, err := b.ReadCloser.Read(p)
	b.seen = append(b.seen, p[:n]...)
	if b.cutAt == 0 {
		if i := bytes.Index(b.seen, []byte("\n\n")); i >= 0 {
			b.cutAt = i + 2 + 8
		}
	}
	if b.cutAt > 0 && b.passed+n > b.cutAt {
		n = b.cutAt - b.passed
	}
	b.passed += n
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// TestClientFollowsAcrossPlannedEndsAndCuts: Follow reads a run's output to
// its end while the stream ends as planned (a short maximum duration) and
// connections are cut in the middle of a message, and hands each line on
// exactly once, in order, resuming each time with the last message's id.
func TestClientFollowsAcrossPlannedEndsAndCuts(t *testing.T) {
	s := newStack(t, "bolt", stackOptions{env: map[string]string{config.EnvStreamMaxDuration: "3s"}})
	host, alice, id, child := s.aliceRun(t)
	cuts := &cutsStreams{next: s.srv.Client().Transport, cut: map[int]bool{2: true, 4: true}}
	c, w := newTestClient(t, s, alice, cuts)
	run, err := c.Run(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	const lines = 12
	for i := 1; i <= 4; i++ {
		host.AppendOutput(child, fmt.Sprintf("line %d\n", i))
	}

	var got []string
	var causes []error
	var mu sync.Mutex
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type result struct {
		f   fleetclient.Followed
		err error
	}
	done := make(chan result, 1)
	go func() {
		f, err := c.Follow(ctx, run.Run.Links.Stream, fleetclient.FollowOptions{
			// The task goes on printing between connections, and ends
			// after the third: each connection has lines to deliver.
			OnReconnect: func(cause error, _ time.Duration) {
				mu.Lock()
				causes = append(causes, cause)
				n := len(causes)
				mu.Unlock()
				switch n {
				case 1:
					for i := 5; i <= 8; i++ {
						host.AppendOutput(child, fmt.Sprintf("line %d\n", i))
					}
				case 3:
					for i := 9; i <= lines; i++ {
						host.AppendOutput(child, fmt.Sprintf("line %d\n", i))
					}
					zero := 0
					host.SetRun(child, "succeeded", &zero, "")
				}
			},
		}, func(ev fleetclient.StreamEvent) error {
			if ev.Event == nil || ev.Event.Type != fleetapi.EventOutput {
				return nil
			}
			var text string
			json.Unmarshal(ev.Event.Data, &text)
			mu.Lock()
			got = append(got, text)
			mu.Unlock()
			return nil
		})
		done <- result{f, err}
	}()
	var res result
	for loop := true; loop; {
		select {
		case res = <-done:
			loop = false
		case <-s.parked:
			s.clk.Advance(time.Second)
		case <-ctx.Done():
			mu.Lock()
			t.Fatalf("Follow did not end: %q so far", got)
		}
	}
	if res.err != nil || res.f.Done.Status != "succeeded" {
		t.Fatalf("Follow ended %+v, %v; want done, succeeded", res.f, res.err)
	}
	var want []string
	for i := 1; i <= lines; i++ {
		want = append(want, fmt.Sprintf("line %d\n", i))
	}
	if strings.Join(got, "") != strings.Join(want, "") {
		t.Fatalf("the lines handed on:\n%q\nwant each once, in order:\n%q", got, want)
	}
	planned, cut := 0, 0
	for _, c := range causes {
		if c == nil {
			planned++
		} else {
			cut++
		}
	}
	ids := cuts.lastEventIDs()
	if cut < 2 || planned < 1 || len(ids) < 4 || ids[0] != "" {
		t.Fatalf("reconnections: %d after a cut, %d planned, Last-Event-IDs %q; want the two cuts, a planned end, and no id on the first connection", cut, planned, ids)
	}
	for i, id := range ids[1:] {
		if id == "" {
			t.Fatalf("connection %d resumed without a Last-Event-ID (%q)", i+2, ids)
		}
	}
	if w.count() != len(causes) {
		t.Fatalf("waited %d times for %d reconnections", w.count(), len(causes))
	}
}

// stallsStreams is a transport whose first stream connection goes silent
// after its first message, as a connection lost without a reset does: its
// reads block until the request is cancelled.
type stallsStreams struct {
	next http.RoundTripper
	mu   sync.Mutex
	n    int
}

func (s *stallsStreams) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := s.next.RoundTrip(req)
	if err != nil || !strings.HasSuffix(req.URL.Path, "/stream") {
		return resp, err
	}
	s.mu.Lock()
	s.n++
	first := s.n == 1
	s.mu.Unlock()
	if first {
		resp.Body = &stalledBody{ReadCloser: resp.Body, done: req.Context().Done()}
	}
	return resp, nil
}

type stalledBody struct {
	io.ReadCloser
	done <-chan struct{}
	seen []byte
}

func (b *stalledBody) Read(p []byte) (int, error) {
	if bytes.Contains(b.seen, []byte("\n\n")) {
		<-b.done
		return 0, context.Canceled
	}
	n, err := b.ReadCloser.Read(p)
	b.seen = append(b.seen, p[:n]...)
	return n, err
}

// TestClientFollowReconnectsAStalledStream: a stream that goes silent (no
// keep-alive, no reset) is given up after StallTimeout and resumed on a
// new connection, where the run's end arrives.
func TestClientFollowReconnectsAStalledStream(t *testing.T) {
	s := newStack(t, "bolt", stackOptions{})
	host, alice, id, child := s.aliceRun(t)
	stalls := &stallsStreams{next: s.srv.Client().Transport}
	c, _ := newTestClient(t, s, alice, stalls)
	run, err := c.Run(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	host.AppendOutput(child, "before\n")
	var causes []error
	var got []string
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go func() {
		_, err := c.Follow(ctx, run.Run.Links.Stream, fleetclient.FollowOptions{
			StallTimeout: 200 * time.Millisecond,
			OnReconnect: func(cause error, _ time.Duration) {
				causes = append(causes, cause)
				host.AppendOutput(child, "after\n")
				zero := 0
				host.SetRun(child, "succeeded", &zero, "")
			},
		}, func(ev fleetclient.StreamEvent) error {
			if ev.Event != nil && ev.Event.Type == fleetapi.EventOutput {
				var text string
				json.Unmarshal(ev.Event.Data, &text)
				got = append(got, text)
			}
			return nil
		})
		done <- err
	}()
	for loop := true; loop; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			loop = false
		case <-s.parked:
			s.clk.Advance(time.Second)
		case <-ctx.Done():
			t.Fatal("Follow never gave the stalled connection up")
		}
	}
	if len(causes) != 1 || causes[0] == nil || strings.Join(got, "") != "before\nafter\n" {
		t.Fatalf("reconnections %v, output %q; want one after the stall, then the rest", causes, got)
	}
}
