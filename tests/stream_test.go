package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/lambdatest"
	"github.com/runfleet/runfleet/tests/kit/ssetest"
)

// streamClient reads one stream of the stack, moving its fake clock a
// poll at a time whenever a stream session waits on its timer (parked) and
// no message came: never while a session is polling.
type streamClient struct {
	t      *testing.T
	clk    *clock.Fake
	parked <-chan struct{}
	ch     <-chan ssetest.Message
}

func (s *stack) openStream(t *testing.T, path string, headers ...string) *streamClient {
	t.Helper()
	req, _ := http.NewRequest("GET", s.srv.URL+path, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := s.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return &streamClient{t: t, clk: s.clk, parked: s.parked, ch: ssetest.Read(resp.Body)}
}

// next returns the next message; while none comes, each time a session is
// parked it lets the next poll happen (the stream is driven by the fake
// clock). A missing message is a bug, not a slow machine: 20 s is a bound
// on the test, not a wait.
func (c *streamClient) next() ssetest.Message {
	c.t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case m, ok := <-c.ch:
			if !ok {
				c.t.Fatal("the stream ended")
			}
			return m
		case <-c.parked:
			c.clk.Advance(time.Second)
		case <-deadline:
			c.t.Fatal("no message in 20s")
		}
	}
}

// until collects the sequences of event messages up to one named stop.
func (c *streamClient) until(stop string) ([]int64, ssetest.Message) {
	c.t.Helper()
	var seqs []int64
	for {
		m := c.next()
		switch m.Event {
		case "event":
			var ev hostproto.Event
			if err := json.Unmarshal([]byte(m.Data), &ev); err != nil || m.ID != fmt.Sprint(ev.Sequence) {
				c.t.Fatalf("event message %+v: %v", m, err)
			}
			seqs = append(seqs, ev.Sequence)
		case stop:
			return seqs, m
		}
	}
}

// events reads n event messages.
func (c *streamClient) events(n int) []int64 {
	c.t.Helper()
	var seqs []int64
	for len(seqs) < n {
		m := c.next()
		if m.Event == "event" {
			var ev hostproto.Event
			json.Unmarshal([]byte(m.Data), &ev)
			seqs = append(seqs, ev.Sequence)
		}
	}
	return seqs
}

func (c *streamClient) ended() bool {
	select {
	case _, ok := <-c.ch:
		return !ok
	case <-time.After(10 * time.Second):
		return false
	}
}

// TestStreamFollowsARun: the stack's stream (the handler the stream
// function runs, on the local stack's address) sends the backlog, the
// snapshot, live events pulled through from the host, and done; clients
// resuming with ?after= and Last-Event-ID lose and repeat nothing.
func TestStreamFollowsARun(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{})
			host, alice, id, child := s.aliceRun(t)
			for i := 0; i < 3; i++ {
				host.AppendOutput(child, fmt.Sprintf("backlog %d\n", i))
			}
			s.sweep(t)
			path := "/fleet/runs/" + id + "/stream"

			// EventSource style: the token as a parameter.
			first := s.openStream(t, path+"?token="+alice)
			seqs, snap := first.until("snapshot")
			if fmt.Sprint(seqs) != "[1 2 3 4]" || !strings.Contains(snap.Data, `"cursor":4`) || !strings.Contains(snap.Data, `"live":true`) {
				t.Fatalf("backlog %v, snapshot %s", seqs, snap.Data)
			}
			host.AppendOutput(child, "live 1\n")
			host.AppendOutput(child, "live 2\n")
			if got := first.events(2); fmt.Sprint(got) != "[5 6]" {
				t.Fatalf("live events %v", got)
			}

			// A reconnection after event 5 (EventSource sends Last-Event-ID).
			second := s.openStream(t, path+"?after=1", "Authorization", "Bearer "+alice, "Last-Event-ID", "5")
			if seqs, _ := second.until("snapshot"); fmt.Sprint(seqs) != "[6]" {
				t.Fatalf("resumed after 5: %v", seqs)
			}

			zero := 0
			host.SetRun(child, hostproto.StatusSucceeded, &zero, "")
			for name, c := range map[string]*streamClient{"first": first, "second": second} {
				seqs, done := c.until("done")
				if fmt.Sprint(seqs) != "[7]" || !strings.Contains(done.Data, `"status":"succeeded"`) || !strings.Contains(done.Data, `"cursor":7`) {
					t.Fatalf("%s client's end: %v, done %s", name, seqs, done.Data)
				}
				if !c.ended() {
					t.Fatalf("%s client's stream did not end after done", name)
				}
			}

			// After the end, ?after= resumes and ends at once.
			third := s.openStream(t, path+"?after=3", "Authorization", "Bearer "+alice)
			seqs, snap = third.until("snapshot")
			if fmt.Sprint(seqs) != "[4 5 6 7]" || !strings.Contains(snap.Data, `"live":false`) {
				t.Fatalf("after the end: %v, %s", seqs, snap.Data)
			}
			if _, done := third.until("done"); !strings.Contains(done.Data, "succeeded") {
				t.Fatalf("done %s", done.Data)
			}
			// The mirror the stream served is the host's, exactly.
			sameAsHost(t, s.allEvents(t, alice, id), host.Events(child))
		})
	}
}

// TestStreamFunctionUnderTheEmulator builds functions/stream as it ships
// (for this machine's architecture), runs it under the Lambda runtime
// interface emulator against moto_server, and reads a run's stream from a
// Function URL event: the answer is the streaming wire format (a JSON
// prelude with statusCode and headers, 8 NUL bytes, the SSE body).
func TestStreamFunctionUnderTheEmulator(t *testing.T) {
	s := newStack(t, "dynamodb", stackOptions{})
	host := s.addHost(t, "h1", fakehost.Config{}, nil)
	s.probe(t, "h1")
	alice := s.mint(t, "alice", "*", "*")
	a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
	id, child := a.str("fleetRunId"), a.str("childRunId")
	host.AppendOutput(child, "hello from the host\n")
	zero := 0
	host.SetRun(child, hostproto.StatusSucceeded, &zero, "")
	s.sweep(t)

	dir := t.TempDir()
	creds := filepath.Join(dir, "credentials.json")
	os.WriteFile(creds, []byte(fmt.Sprintf(`{%q: %q}`, hostCredRef, hostToken)), 0o600)
	tables := s.app.Config.Tables
	env := map[string]string{
		config.EnvStore: "dynamodb", config.EnvDynamoDBEndpoint: moto.URL, config.EnvCredentials: "file:" + creds,
		config.EnvTableHosts: tables.Hosts, config.EnvTableRuns: tables.Runs, config.EnvTableEvents: tables.Events,
		config.EnvTableEgress: tables.Egress, config.EnvTableCallers: tables.Callers, config.EnvTableIdempotency: tables.Idempotency,
		"AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
	}
	fn := lambdatest.Start(t, functionBootstrap(t, "stream"), env, 30*time.Second)

	ev := events.LambdaFunctionURLRequest{
		Version: "2.0", RawPath: "/fleet/runs/" + id + "/stream", RawQueryString: "after=1&token=" + alice,
		Headers: map[string]string{"accept": "text/event-stream", "host": "abc.lambda-url.us-east-1.on.aws"},
		RequestContext: events.LambdaFunctionURLRequestContext{RequestID: "req-stream-1", DomainName: "abc.lambda-url.us-east-1.on.aws",
			HTTP: events.LambdaFunctionURLRequestContextHTTPDescription{Method: "GET", Path: "/fleet/runs/" + id + "/stream"}},
	}
	prelude, body, err := lambdatest.StreamedResponse(fn.Invoke(t, ev))
	if err != nil {
		t.Fatal(err)
	}
	if prelude.StatusCode != 200 || prelude.Headers["content-type"] != "text/event-stream" || prelude.Headers["cache-control"] != "no-cache" {
		t.Fatalf("prelude %+v", prelude)
	}
	c := &streamClient{t: t, clk: s.clk, ch: ssetest.Read(bytes.NewReader(body))}
	seqs, done := c.until("done")
	if fmt.Sprint(seqs) != "[2 3]" || !strings.Contains(done.Data, `"status":"succeeded"`) {
		t.Fatalf("body %s", body)
	}

	// A refusal comes back in the same format.
	ev.RawQueryString = "token=rft_not-a-token-000000000000000000"
	prelude, body, err = lambdatest.StreamedResponse(fn.Invoke(t, ev))
	if err != nil || prelude.StatusCode != 401 || !strings.Contains(string(body), "unauthenticated") {
		t.Fatalf("refusal: %+v %s %v", prelude, body, err)
	}
	if strings.Contains(fn.Output(), alice) || strings.Contains(fn.Output(), "rft_not-a-token") {
		t.Fatalf("a token reached the function's log:\n%s", fn.Output())
	}
	for _, r := range fn.Reports() {
		t.Logf("stream function: init %s, duration %s, memory %d MB", r.InitDuration, r.Duration, r.MaxMemoryMB)
	}
	if len(fn.Reports()) != 2 {
		t.Fatalf("REPORT lines: %+v\n%s", fn.Reports(), fn.Output())
	}
}
