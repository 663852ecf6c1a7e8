package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/stream"
	"github.com/runfleet/runfleet/tests/kit/ssetest"
)

// The stream's ceilings and the long-poll, through the
// stack's real handlers on bbolt and on DynamoDB (moto_server), with the
// stack's fake clock.

// getRaw sends a GET with a bearer token and returns the response, its
// body unread (closed at the test's end).
func (s *stack) getRaw(t *testing.T, path, token string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", s.srv.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := s.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// refusedFull checks a 429 beyond the cap and returns its Retry-After.
func refusedFull(t *testing.T, resp *http.Response, limit int) int {
	t.Helper()
	body, _ := io.ReadAll(resp.Body)
	var e struct {
		Error   string         `json:"error"`
		Code    string         `json:"code"`
		Details map[string]any `json:"details"`
	}
	json.Unmarshal(body, &e)
	retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusTooManyRequests || err != nil || retry < 1 || e.Code != stream.CodeTooManyStreams ||
		!strings.Contains(e.Error, fmt.Sprintf("%d streams open", limit)) || e.Details["maxStreamsPerCaller"] != float64(limit) {
		t.Fatalf("beyond the cap: %d, Retry-After %q, %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	return retry
}

// TestStreamCapPerCaller: a caller holds at most RUNFLEET_STREAM_MAX_PER_CALLER
// (10) streams; the 11th is 429 with Retry-After and the cap named;
// another caller is not affected; closing a stream frees its slot; slots
// left by crashed streams (leases nobody renews) hold only until they
// expire.
func TestStreamCapPerCaller(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{})
			_, alice, id, _ := s.aliceRun(t)
			path := "/fleet/runs/" + id + "/stream"
			var open []*http.Response
			for i := 0; i < stream.DefaultMaxPerCaller; i++ {
				resp := s.getRaw(t, path, alice)
				if resp.StatusCode != 200 {
					t.Fatalf("stream %d: %d", i+1, resp.StatusCode)
				}
				eventsUntilSnapshot(t, resp)
				open = append(open, resp)
			}
			refusedFull(t, s.getRaw(t, path, alice), stream.DefaultMaxPerCaller)

			// The cap is per caller: the admin still streams alice's run.
			if resp := s.getRaw(t, path, adminToken); resp.StatusCode != 200 {
				t.Fatalf("another caller: %d", resp.StatusCode)
			}

			// Closing a stream frees its slot (the server sees the client
			// go, ends the session and releases the lease).
			open[0].Body.Close()
			deadline := time.Now().Add(10 * time.Second)
			for {
				resp := s.getRaw(t, path, alice)
				if resp.StatusCode == 200 {
					break
				}
				refusedFull(t, resp, stream.DefaultMaxPerCaller)
				if time.Now().After(deadline) {
					t.Fatal("a closed stream's slot was not freed within 10 s")
				}
			}
			refusedFull(t, s.getRaw(t, path, alice), stream.DefaultMaxPerCaller)

			// Carol's slots are all held by streams that crashed (their
			// leases, two minutes long, are never renewed nor released).
			carol := s.mint(t, "carol", "*", "*")
			lapse := s.clk.Now().Add(stream.DefaultLeaseTTL)
			for i := 0; i < stream.DefaultMaxPerCaller; i++ {
				l := store.StreamLease{OwnerID: "carol", Holder: fmt.Sprint("crashed-", i), ExpiresAt: lapse}
				if _, err := s.app.Store.AcquireStreamLease(context.Background(), l, stream.DefaultMaxPerCaller); err != nil {
					t.Fatal(err)
				}
			}
			run := s.must(t, http.StatusCreated, "POST", "/fleet/runs", carol, `{"agent":"shell"}`).str("fleetRunId")
			carolPath := "/fleet/runs/" + run + "/stream"
			if retry := refusedFull(t, s.getRaw(t, carolPath, carol), stream.DefaultMaxPerCaller); retry != int(stream.DefaultLeaseTTL.Seconds()) {
				t.Fatalf("Retry-After %d, want %v: when the first crashed slot lapses", retry, stream.DefaultLeaseTTL)
			}
			s.clk.Advance(stream.DefaultLeaseTTL - time.Second)
			refusedFull(t, s.getRaw(t, carolPath, carol), stream.DefaultMaxPerCaller)
			s.clk.Advance(time.Second)
			if resp := s.getRaw(t, carolPath, carol); resp.StatusCode != 200 {
				t.Fatalf("after the crashed leases expired: %d", resp.StatusCode)
			}
		})
	}
}

// eventsUntilSnapshot reads a stream's messages up to its snapshot.
func eventsUntilSnapshot(t *testing.T, resp *http.Response) {
	t.Helper()
	ch := ssetest.Read(resp.Body)
	timeout := time.After(20 * time.Second)
	for {
		select {
		case m, ok := <-ch:
			if !ok {
				t.Fatal("the stream ended before its snapshot")
			}
			if m.Event == "snapshot" {
				return
			}
		case <-timeout:
			t.Fatal("no snapshot in 20 s")
		}
	}
}

// TestStreamEndsIdleWithAResumeHint: a run silent for the idle limit (3
// min on the stack's clock) ends its stream with an idle event whose id is
// the cursor, the resume path and a retry hint; the client reconnects
// with Last-Event-ID and gets what came since, once.
func TestStreamEndsIdleWithAResumeHint(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{})
			host, alice, id, child := s.aliceRun(t)
			host.AppendOutput(child, "before\n")
			s.sweep(t)
			path := "/fleet/runs/" + id + "/stream"
			// The clock stands still until the stream's first poll (which
			// sends the backlog) is done.
			begun := s.clk.Now()
			c := s.openStream(t, path+"?token="+alice)
			seqs, _ := c.until("snapshot")
			cursor := seqs[len(seqs)-1]
			var idle ssetest.Message
			for idle.Event != "idle" {
				idle = c.next()
				if idle.Event == "event" {
					t.Fatalf("an event from a silent run: %+v", idle)
				}
			}
			if quiet := s.clk.Now().Sub(begun); quiet != stream.DefaultIdleTimeout {
				t.Fatalf("idle end after %v of silence, want %v", quiet, stream.DefaultIdleTimeout)
			}
			var data struct {
				Cursor  int64  `json:"cursor"`
				Status  string `json:"status"`
				RetryMs int64  `json:"retryMs"`
				Resume  string `json:"resume"`
			}
			if err := json.Unmarshal([]byte(idle.Data), &data); err != nil || idle.ID != fmt.Sprint(cursor) || data.Cursor != cursor ||
				data.Status == "" || data.Resume != fmt.Sprintf("%s?after=%d", path, cursor) || data.RetryMs != stream.DefaultIdleRetry.Milliseconds() {
				t.Fatalf("idle message %+v (%v)", idle, err)
			}
			hint := c.next()
			if hint.Retry != fmt.Sprint(stream.DefaultIdleRetry.Milliseconds()) || len(hint.Comments) != 1 ||
				!strings.Contains(hint.Comments[0], fmt.Sprintf("Last-Event-ID: %d", cursor)) {
				t.Fatalf("after the idle event: %+v", hint)
			}
			if !c.ended() {
				t.Fatal("the stream went on after its idle end")
			}

			// The run speaks again; EventSource reconnects with the id it
			// last saw, the idle event's.
			host.AppendOutput(child, "after\n")
			again := s.openStream(t, path, "Authorization", "Bearer "+alice, "Last-Event-ID", idle.ID)
			if got, _ := again.until("snapshot"); fmt.Sprint(got) != fmt.Sprint([]int64{cursor + 1}) {
				t.Fatalf("resumed after the idle end: %v, want [%d]", got, cursor+1)
			}
		})
	}
}

// longPoll sends GET path and, while it waits, moves the stack's clock a
// poll at a time, calling onPoll(i) before the i-th move; it returns the
// answer and how far the clock moved.
func (s *stack) longPoll(t *testing.T, path, token string, onPoll func(i int)) (answer, time.Duration) {
	t.Helper()
	begun := s.clk.Now()
	done := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest("GET", s.srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := s.srv.Client().Do(req)
		if err != nil {
			done <- answer{status: -1, raw: err.Error()}
			return
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		a := answer{status: resp.StatusCode, raw: string(raw)}
		json.Unmarshal(raw, &a.body)
		done <- a
	}()
	deadline := time.After(20 * time.Second)
	for i := 0; ; i++ {
		select {
		case a := <-done:
			return a, s.clk.Now().Sub(begun)
		case <-s.parked:
			if onPoll != nil {
				onPoll(i)
			}
			s.clk.Advance(time.Second)
		case <-deadline:
			t.Fatalf("GET %s: no answer in 20 s", path)
		}
	}
}

// TestEventsLongPoll: GET /fleet/runs/{id}/events?after=N&wait=S answers
// as soon as an event after N exists (pulled through from the host, no
// sweep), with an empty page once S seconds pass on the clock, at once
// for a run that is over; a bad wait is 400 naming it.
func TestEventsLongPoll(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{})
			host, alice, id, child := s.aliceRun(t)
			s.sweep(t)
			events := "/fleet/runs/" + id + "/events"
			first := s.must(t, http.StatusOK, "GET", events, alice, "")
			n := int64(first.body["nextCursor"].(float64))

			// An event comes three polls in: the answer follows at once.
			a, waited := s.longPoll(t, fmt.Sprintf("%s?after=%d&wait=20", events, n), alice, func(i int) {
				if i == 3 {
					host.AppendOutput(child, "news\n")
				}
			})
			evs, _ := a.body["events"].([]any)
			if a.status != 200 || len(evs) != 1 || a.body["nextCursor"] != float64(n+1) || a.body["live"] != true || waited != 4*time.Second {
				t.Fatalf("long-poll with an event after 3 s: %d %s after %v; want event %d after 4 s", a.status, a.raw, waited, n+1)
			}
			if ev := evs[0].(map[string]any); ev["sequence"] != float64(n+1) || !strings.Contains(fmt.Sprint(ev["data"]), "news") {
				t.Fatalf("event %v", ev)
			}

			// Nothing comes: the empty page when the wait has passed.
			a, waited = s.longPoll(t, fmt.Sprintf("%s?after=%d&wait=5", events, n+1), alice, nil)
			if evs, _ := a.body["events"].([]any); a.status != 200 || len(evs) != 0 || a.body["nextCursor"] != float64(n+1) || a.body["live"] != true || waited != 5*time.Second {
				t.Fatalf("long-poll without an event: %d %s after %v; want an empty page after 5 s", a.status, a.raw, waited)
			}

			// The run ends: the long-poll brings its last events, then a
			// poll after them answers at once, not live.
			zero := 0
			host.SetRun(child, "succeeded", &zero, "")
			a, _ = s.longPoll(t, fmt.Sprintf("%s?after=%d&wait=20", events, n+1), alice, nil)
			end := int64(a.body["nextCursor"].(float64))
			if a.status != 200 || end <= n+1 {
				t.Fatalf("long-poll at the end: %d %s", a.status, a.raw)
			}
			a, waited = s.longPoll(t, fmt.Sprintf("%s?after=%d&wait=20", events, end), alice, nil)
			if evs, _ := a.body["events"].([]any); a.status != 200 || len(evs) != 0 || a.body["live"] != false || waited != 0 {
				t.Fatalf("long-poll of an ended run: %d %s after %v; want an empty page, live false, at once", a.status, a.raw, waited)
			}

			for _, bad := range []string{"21", "-1", "1.5", "soon", ""} {
				a := s.do(t, "GET", events+"?wait="+bad, alice, "")
				if a.status != 400 || !strings.Contains(a.errorText(), "wait") {
					t.Errorf("wait=%q: %d %s, want 400 naming wait", bad, a.status, a.raw)
				}
			}
		})
	}
}
