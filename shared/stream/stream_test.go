package stream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/runfleet/runfleet/shared/auth"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/credentials"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/boltstore"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/ssetest"
)

const adminToken = "stream-admin-token-0123456789"

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// env is a stream handler on bbolt with a fake clock, one fake host (h1)
// and an HTTP server serving the handler.
type env struct {
	f    *fleet.Fleet
	st   *boltstore.Store
	clk  *clock.Fake
	host *fakehost.Host
	h    *Handler
	srv  *httptest.Server
	logs *logSink
	// parked receives when a session waits on its timer (with ticks).
	parked chan struct{}
}

type envOptions struct {
	cfg Config
	// listener, when set, wraps the server's listener (small socket buffers).
	listener func(net.Listener) net.Listener
	// ticks: the test moves the stream's clock with tick (one stream at a time).
	ticks bool
	// onHostRequest is the fake host's OnRequest.
	onHostRequest func(r *http.Request)
	// wrapStore, when set, stands between Fleet and the bolt store.
	wrapStore func(store.Store) store.Store
	// leases: the per-caller cap counts on the bolt store (Config.Leases).
	leases bool
}

func newEnv(t *testing.T, opts envOptions) *env {
	t.Helper()
	dir := t.TempDir()
	clk := clock.NewFake(t0)
	st, err := boltstore.Open(filepath.Join(dir, "fleet.db"), boltstore.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	host := fakehost.New(fakehost.Config{Clock: clk, OnRequest: opts.onHostRequest})
	t.Cleanup(host.Close)
	credsPath := filepath.Join(dir, "creds.json")
	os.WriteFile(credsPath, []byte(`{"h1":"`+host.Token()+`"}`), 0o600)
	creds, err := credentials.NewFile(credsPath)
	if err != nil {
		t.Fatal(err)
	}
	logs := &logSink{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var fleetStore store.Store = st
	if opts.wrapStore != nil {
		fleetStore = opts.wrapStore(st)
	}
	f, err := fleet.New(fleet.Config{Store: fleetStore, Credentials: creds, Logger: log, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := f.RegisterHost(ctx, fleet.HostSpec{ID: "h1", BaseURL: host.URL, CredentialRef: "h1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ProbeHost(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	cfg := opts.cfg
	cfg.Fleet, cfg.Auth, cfg.Logger, cfg.Clock = f, auth.NewAuthenticator(st, adminToken), log, clk
	if opts.leases {
		cfg.Leases = st
	}
	parked := make(chan struct{})
	if opts.ticks {
		cfg.Parked = func(ctx context.Context) {
			select {
			case parked <- struct{}{}:
			case <-ctx.Done():
			}
		}
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	if opts.listener != nil {
		srv.Listener = opts.listener(srv.Listener)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return &env{f: f, st: st, clk: clk, host: host, h: h, srv: srv, logs: logs, parked: parked}
}

// dispatch starts a run owned by owner.
func (e *env) dispatch(t *testing.T, owner string) store.Run {
	t.Helper()
	c := store.Caller{OwnerID: owner, AllowedHosts: store.Scope{All: true}, AllowedProjects: store.Scope{All: true}}
	res, err := e.f.Dispatch(context.Background(), c, fleet.DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "")
	if err != nil || res.Run.ChildRunID == "" {
		t.Fatalf("dispatch = %+v, %v", res, err)
	}
	return res.Run
}

func (e *env) sweep(t *testing.T) {
	t.Helper()
	if _, err := e.f.Sweep(context.Background(), fleet.SweepOptions{}); err != nil {
		t.Fatal(err)
	}
}

// open connects to the stream of run id with the token in the header (or
// as the token parameter when the query has one) and extra headers.
func (e *env) open(t *testing.T, id, query string, headers ...string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", e.srv.URL+"/fleet/runs/"+id+"/stream"+query, nil)
	if !strings.Contains(query, "token=") {
		req.Header.Set("Authorization", "Bearer "+adminToken)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// tick lets the stream's next poll happen once it waits for it. It
// returns with that poll under way: a test that changes what a poll reads
// (the host's run, the store) and needs a given poll to see it waits for
// the stream to park (waitParked), changes it, then moves the clock.
func (e *env) tick(t *testing.T) {
	t.Helper()
	e.waitParked(t)
	e.clk.Advance(e.h.cfg.PollInterval)
}

// waitParked waits for the stream to park on its timer, failing after a
// while: the stream is driven by the fake clock, so one that never parks
// ended or is stuck (a bug, not a slow machine), and the test must say so
// rather than hang until the package's timeout.
func (e *env) waitParked(t *testing.T) {
	t.Helper()
	select {
	case <-e.parked:
	case <-time.After(10 * time.Second):
		t.Fatalf("the stream did not park on its timer in 10s (it ended or is stuck); logs:\n%s", e.logs)
	}
}

// next returns the next message, failing after a while without one (the
// stream under test is driven by the fake clock, so a missing message is a
// bug, not a slow machine).
func next(t *testing.T, ch <-chan ssetest.Message) ssetest.Message {
	t.Helper()
	select {
	case m, ok := <-ch:
		if !ok {
			t.Fatal("the stream ended")
		}
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message in 10s")
	}
	return ssetest.Message{}
}

// events reads messages until one with event name stop, returning the
// sequences of the "event" messages seen (each checked against its data).
func eventsUntil(t *testing.T, ch <-chan ssetest.Message, stop string) ([]int64, ssetest.Message) {
	t.Helper()
	var seqs []int64
	for {
		m := next(t, ch)
		switch m.Event {
		case "event":
			var ev hostproto.Event
			if err := json.Unmarshal([]byte(m.Data), &ev); err != nil {
				t.Fatalf("event data %q: %v", m.Data, err)
			}
			if m.ID != fmt.Sprint(ev.Sequence) {
				t.Fatalf("id %q for sequence %d", m.ID, ev.Sequence)
			}
			seqs = append(seqs, ev.Sequence)
		case stop:
			return seqs, m
		case "", "snapshot":
		default:
			t.Fatalf("unexpected message %+v", m)
		}
	}
}

func seqRange(from, to int64) []int64 {
	var out []int64
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// TestAHangingHostNeverHoldsTheStreamSilent: a poll's pull-through is
// bounded by half a keep-alive on the stream's clock: a host that does not
// answer is given up on when that clock says so (an hour's keep-alive
// here, no real time), the mirror is served as it is, and the keep-alive
// still goes out on time.
func TestAHangingHostNeverHoldsTheStreamSilent(t *testing.T) {
	var hang atomic.Bool
	hung := make(chan struct{}, 16)
	e := newEnv(t, envOptions{ticks: true, cfg: Config{PollInterval: time.Second, KeepAlive: time.Hour, MaxDuration: 3 * time.Hour, IdleTimeout: 3 * time.Hour},
		onHostRequest: func(r *http.Request) {
			if hang.Load() && r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/runs/") {
				hung <- struct{}{}
				<-r.Context().Done()
			}
		}})
	run := e.dispatch(t, "alice")
	e.sweep(t)
	ch := ssetest.Read(e.open(t, run.FleetRunID, "").Body)
	eventsUntil(t, ch, "snapshot")

	hang.Store(true)
	e.tick(t)
	for i := 0; i < 2; i++ {
		await.Recv(t, "the poll's pull-through to reach the hanging host", hung)
		e.clk.Advance(30 * time.Minute) // half the keep-alive: given up on
		if i == 0 {
			e.waitParked(t)
			e.clk.Advance(time.Second)
		}
	}
	m := next(t, ch)
	if len(m.Comments) != 1 || m.Comments[0] != "keep-alive" {
		t.Fatalf("after an hour of a hanging host: %+v, want the keep-alive", m)
	}
	e.logs.wait(t, `"msg":"stream: pull-through failed"`, run.FleetRunID)
}

// The run's host is deleted with force while a stream's first poll is
// between its pull-through and its read of the mirror: the run and its
// events go. The stream sends its snapshot (nothing to replay) instead of
// re-reading an empty mirror forever, and ends at the next poll, saying
// why, with no retry hint.
func TestStreamEndsWhenItsRunIsDeletedUnderIt(t *testing.T) {
	var e *env
	var armed atomic.Bool
	e = newEnv(t, envOptions{ticks: true, onHostRequest: func(r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/events") && armed.CompareAndSwap(true, false) {
			if res, err := e.f.DeleteHost(context.Background(), "h1", true); err != nil || !res.Done {
				t.Errorf("DeleteHost: %+v, %v", res, err)
			}
		}
	}})
	run := e.dispatch(t, "alice")
	e.host.SetRun(run.ChildRunID, hostproto.StatusRunning, nil, "")
	e.host.AppendOutput(run.ChildRunID, "a\n")
	e.sweep(t)

	armed.Store(true)
	ch := ssetest.Read(e.open(t, run.FleetRunID, "").Body)
	if seqs, snap := eventsUntil(t, ch, "snapshot"); len(seqs) != 0 || !strings.Contains(snap.Data, `"cursor":0`) {
		t.Fatalf("events %v, then snapshot %s; want no events and cursor 0", seqs, snap.Data)
	}
	e.tick(t)
	m := next(t, ch)
	if len(m.Comments) != 1 || m.Comments[0] != "the run no longer exists" || m.Retry != "" {
		t.Fatalf("after the run was deleted: %+v, want its goodbye without a retry hint", m)
	}
	if m, ok := await.RecvOK(t, "the stream to end", ch); ok {
		t.Fatalf("a message after the goodbye: %+v", m)
	}
	e.logs.wait(t, `"msg":"stream"`, `"end":"run_deleted"`)
}

// expiredEvents is a store whose mirror has lost run's events (DynamoDB's
// TTL took them before the run, or a forced delete stopped half way).
type expiredEvents struct {
	store.Store
	run atomic.Value // string: the run whose events are gone
}

func (s *expiredEvents) ListEvents(ctx context.Context, id string, after int64, limit int) (store.EventPage, error) {
	if id == s.run.Load() {
		return store.EventPage{}, nil
	}
	return s.Store.ListEvents(ctx, id, after, limit)
}

// A stream of a run that is over, whose events are gone from the mirror,
// still ends with done (at the run's cursor) instead of polling forever
// for events that will never come back.
func TestStreamOfAnEndedRunWhoseEventsExpiredEndsWithDone(t *testing.T) {
	expired := &expiredEvents{}
	e := newEnv(t, envOptions{ticks: true, wrapStore: func(st store.Store) store.Store { expired.Store = st; return expired }})
	run := e.dispatch(t, "alice")
	e.host.AppendOutput(run.ChildRunID, "gone\n")
	code := 0
	e.host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, &code, "")
	e.sweep(t)
	stored, _ := e.st.GetRun(context.Background(), run.FleetRunID)
	if !stored.Drained || stored.EventCursor == 0 {
		t.Fatalf("not drained with events: %+v", stored)
	}
	expired.run.Store(run.FleetRunID)

	ch := ssetest.Read(e.open(t, run.FleetRunID, "").Body)
	seqs, snap := eventsUntil(t, ch, "snapshot")
	if len(seqs) != 0 || !strings.Contains(snap.Data, `"live":false`) {
		t.Fatalf("events %v, then snapshot %s; want none and not live", seqs, snap.Data)
	}
	done := next(t, ch)
	want := fmt.Sprintf(`{"cursor":%d,"status":"succeeded","attempt":1,"exitCode":0}`, stored.EventCursor)
	if done.Event != "done" || done.Data != want {
		t.Fatalf("after the snapshot: %+v, want done %s", done, want)
	}
	e.logs.wait(t, `"msg":"stream: events gone from the mirror"`, run.FleetRunID)
}

func TestStreamSendsBacklogSnapshotLiveEventsAndDone(t *testing.T) {
	e := newEnv(t, envOptions{ticks: true})
	run := e.dispatch(t, "alice")
	for i := 0; i < 3; i++ {
		e.host.AppendOutput(run.ChildRunID, fmt.Sprintf("backlog %d\n", i))
	}
	e.sweep(t)

	resp := e.open(t, run.FleetRunID, "")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("Cache-Control") != "no-cache" {
		t.Fatalf("answer %d %v", resp.StatusCode, resp.Header)
	}
	ch := ssetest.Read(resp.Body)
	seqs, snap := eventsUntil(t, ch, "snapshot")
	if fmt.Sprint(seqs) != fmt.Sprint(seqRange(1, 4)) || snap.Data != `{"cursor":4,"status":"pending","attempt":1,"live":true}` {
		t.Fatalf("backlog %v, snapshot %s", seqs, snap.Data)
	}

	// Live: pull-through mirrors the host's new events on the next poll,
	// without a sweep.
	e.host.AppendOutput(run.ChildRunID, "live\n")
	e.tick(t)
	if seqs, _ := eventsUntilN(t, ch, 1); seqs[0] != 5 {
		t.Fatalf("live event %v", seqs)
	}
	code := 0
	e.host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, &code, "")
	e.tick(t)
	seqs, done := eventsUntil(t, ch, "done")
	if fmt.Sprint(seqs) != "[6]" || done.Data != `{"cursor":6,"status":"succeeded","attempt":1,"exitCode":0}` {
		t.Fatalf("end: %v then done %s", seqs, done.Data)
	}
	if m, ok := await.RecvOK(t, "the stream to end", ch); ok {
		t.Fatalf("a message after done: %+v", m)
	}
	stored, _ := e.st.GetRun(context.Background(), run.FleetRunID)
	if !stored.Drained || stored.EventCursor != 6 {
		t.Fatalf("the stream's pull-through did not record the run: %+v", stored)
	}
	if !e.logs.has(`"msg":"stream"`, `"end":"done"`, `"events":6`) {
		t.Fatalf("no stream log line: %s", e.logs)
	}
}

// eventsUntilN reads n event messages.
func eventsUntilN(t *testing.T, ch <-chan ssetest.Message, n int) ([]int64, ssetest.Message) {
	t.Helper()
	var seqs []int64
	for len(seqs) < n {
		m := next(t, ch)
		if m.Event != "event" {
			continue
		}
		var ev hostproto.Event
		json.Unmarshal([]byte(m.Data), &ev)
		seqs = append(seqs, ev.Sequence)
	}
	return seqs, ssetest.Message{}
}

func TestStreamResumesWithAfterAndLastEventIDWithoutLossOrRepeat(t *testing.T) {
	e := newEnv(t, envOptions{})
	run := e.dispatch(t, "alice")
	for i := 0; i < 20; i++ {
		e.host.AppendOutput(run.ChildRunID, fmt.Sprintf("line %d\n", i))
	}
	e.sweep(t) // 21 events mirrored, the run live

	// A client reads up to event 8 and drops; it resumes with Last-Event-ID
	// (as EventSource does), the URL still carrying its first ?after=.
	first := ssetest.Read(e.open(t, run.FleetRunID, "?after=2").Body)
	seen, _ := eventsUntilN(t, first, 6)
	if fmt.Sprint(seen) != fmt.Sprint(seqRange(3, 8)) {
		t.Fatalf("from after=2: %v", seen)
	}
	second := ssetest.Read(e.open(t, run.FleetRunID, "?after=2", "Last-Event-ID", "8").Body)
	more, snap := eventsUntil(t, second, "snapshot")
	if fmt.Sprint(more) != fmt.Sprint(seqRange(9, 21)) || !strings.Contains(snap.Data, `"cursor":21`) {
		t.Fatalf("resumed from Last-Event-ID 8: %v, snapshot %s", more, snap.Data)
	}
	// The run ends while the client is away; it resumes with ?after= alone.
	code := 1
	e.host.SetRun(run.ChildRunID, hostproto.StatusFailed, &code, "")
	third := ssetest.Read(e.open(t, run.FleetRunID, "?after=21").Body)
	last, snap := eventsUntil(t, third, "snapshot")
	if fmt.Sprint(last) != "[22]" || !strings.Contains(snap.Data, `"live":false`) {
		t.Fatalf("after=21: %v, snapshot %s", last, snap.Data)
	}
	if _, done := eventsUntil(t, third, "done"); !strings.Contains(done.Data, `"status":"failed"`) {
		t.Fatalf("done %s", done.Data)
	}
	all := append(append(seen, more...), last...)
	if fmt.Sprint(all) != fmt.Sprint(seqRange(3, 22)) {
		t.Fatalf("across the resumes: %v", all)
	}
}

func TestStreamKeepsAliveAndEndsWithARetryHint(t *testing.T) {
	e := newEnv(t, envOptions{ticks: true, cfg: Config{PollInterval: time.Second, KeepAlive: 3 * time.Second, MaxDuration: 5 * time.Second}})
	run := e.dispatch(t, "alice")
	e.sweep(t)
	ch := ssetest.Read(e.open(t, run.FleetRunID, "").Body)
	eventsUntil(t, ch, "snapshot")
	for i := 0; i < 3; i++ {
		e.tick(t)
	}
	if m := next(t, ch); len(m.Comments) != 1 || m.Comments[0] != "keep-alive" || m.Event != "" {
		t.Fatalf("after 3s of silence: %+v", m)
	}
	e.tick(t)
	e.tick(t)
	m := next(t, ch)
	if m.Retry != "2000" || len(m.Comments) != 1 || !strings.Contains(m.Comments[0], "maximum duration") {
		t.Fatalf("at the maximum duration: %+v", m)
	}
	if m, ok := await.RecvOK(t, "the stream to end", ch); ok {
		t.Fatalf("a message after the planned end: %+v", m)
	}
	if !e.logs.has(`"end":"planned"`) {
		t.Fatalf("logs: %s", e.logs)
	}
}

func TestStreamTakesTheTokenParameterAndNeverLogsIt(t *testing.T) {
	e := newEnv(t, envOptions{})
	run := e.dispatch(t, "alice")
	code := 0
	e.host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, &code, "")
	e.sweep(t)
	resp := e.open(t, run.FleetRunID, "?token="+adminToken+"&after=1")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	seqs, _ := eventsUntil(t, ssetest.Read(resp.Body), "done")
	if fmt.Sprint(seqs) != "[2]" {
		t.Fatalf("events %v", seqs)
	}
	for _, bad := range []string{"?token=rft_never-minted-token-000000000", "?token=" + adminToken + "x"} {
		if resp := e.open(t, run.FleetRunID, bad); resp.StatusCode != 401 {
			t.Fatalf("%s: %d", bad, resp.StatusCode)
		}
	}
	// A stream's line is written once it ended, after the client read done.
	e.logs.wait(t, `"query":"after=1&token=REDACTED"`, `"status":200`)
	e.logs.wait(t, `"msg":"stream refused"`, `"status":401`)
	if got := strings.Count(e.logs.String(), `"query":"token=REDACTED"`); got != 2 {
		t.Fatalf("%d refusals logged with a redacted query, want 2: %s", got, e.logs)
	}
	if strings.Contains(e.logs.String(), adminToken) || strings.Contains(e.logs.String(), "never-minted") {
		t.Fatalf("a token reached the log: %s", e.logs)
	}
}

func TestStreamRefusals(t *testing.T) {
	e := newEnv(t, envOptions{})
	run := e.dispatch(t, "alice")
	bob, _, _ := mint(t, e, "bob")
	cases := []struct {
		name, method, path string
		headers            []string
		status             int
		mention            string
	}{
		{"unknown run", "GET", "/fleet/runs/fr-nope/stream", nil, 404, "fr-nope"},
		{"another owner's run", "GET", "/fleet/runs/" + run.FleetRunID + "/stream", []string{"Authorization", "Bearer " + bob}, 404, run.FleetRunID},
		{"no token", "GET", "/fleet/runs/" + run.FleetRunID + "/stream", []string{"Authorization", ""}, 401, "token"},
		{"POST", "POST", "/fleet/runs/" + run.FleetRunID + "/stream", nil, 405, "POST"},
		{"after negative", "GET", "/fleet/runs/" + run.FleetRunID + "/stream?after=-1", nil, 400, "after"},
		{"after twice", "GET", "/fleet/runs/" + run.FleetRunID + "/stream?after=1&after=2", nil, 400, "after"},
		{"unknown parameter", "GET", "/fleet/runs/" + run.FleetRunID + "/stream?from=1", nil, 400, `"from"`},
		{"bad Last-Event-ID", "GET", "/fleet/runs/" + run.FleetRunID + "/stream", []string{"Last-Event-ID", "x7"}, 400, "Last-Event-ID"},
		{"token twice", "GET", "/fleet/runs/" + run.FleetRunID + "/stream?token=" + adminToken, []string{"Authorization", "Bearer " + adminToken}, 400, "not both"},
		{"other path", "GET", "/fleet/runs/" + run.FleetRunID + "/streams", nil, 404, "stream"},
	}
	for _, c := range cases {
		req, _ := http.NewRequest(c.method, e.srv.URL+c.path, nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		for i := 0; i+1 < len(c.headers); i += 2 {
			req.Header.Set(c.headers[i], c.headers[i+1])
		}
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body hostproto.ErrorBody
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != c.status || !strings.Contains(body.Error, c.mention) {
			t.Errorf("%s: %d %+v, want %d naming %q", c.name, resp.StatusCode, body, c.status, c.mention)
		}
	}
}

func mint(t *testing.T, e *env, owner string) (string, store.Caller, error) {
	t.Helper()
	c, token, err := e.f.MintCaller(context.Background(), fleet.CallerSpec{OwnerID: owner,
		AllowedHosts: &store.Scope{All: true}, AllowedProjects: &store.Scope{All: true}})
	if err != nil {
		t.Fatal(err)
	}
	return token, c, nil
}

// smallBuffers makes every accepted connection's send buffer small, so a
// client that stops reading blocks the server's writes soon.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(4096)
	}
	return c, err
}

func TestStreamCutsOffAClientThatStopsReading(t *testing.T) {
	e := newEnv(t, envOptions{
		cfg:      Config{WriteTimeout: 5 * time.Second, KeepAlive: time.Hour},
		listener: func(l net.Listener) net.Listener { return smallBuffers{l} },
	})
	run := e.dispatch(t, "alice")
	// About 6 MB of backlog: far more than the sockets hold.
	big := strings.Repeat("x", hostproto.MaxEventData-64)
	var evs []store.Event
	for i := int64(2); i <= 200; i++ {
		data, _ := json.Marshal(big)
		evs = append(evs, store.Event{FleetRunID: run.FleetRunID, Sequence: i, Type: hostproto.EventOutput, Data: data, TS: t0})
	}
	if err := e.st.PutEvents(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
	stored, _ := e.st.GetRun(context.Background(), run.FleetRunID)
	stored.EventCursor = 200
	if _, err := e.st.UpdateRun(context.Background(), stored); err != nil {
		t.Fatal(err)
	}

	// A client with a small receive buffer reads the headers and stops.
	dialer := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	client := &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}}
	req, _ := http.NewRequest("GET", e.srv.URL+"/fleet/runs/"+run.FleetRunID+"/stream", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// The backlog's write blocks; its watchdog fires.
	e.advanceUntilLogged(t, 5*time.Second, `"end":"client_stopped_reading"`)
	// The connection is gone: what the client reads ends without done.
	body, err := io.ReadAll(resp.Body)
	if err == nil || bytes.Contains(body, []byte("event: done")) || bytes.Contains(body, []byte("event: snapshot")) {
		t.Fatalf("read %d bytes, err %v: the stream was not cut off", len(body), err)
	}
}

func TestLambdaAnswersTheStreamingWireFormat(t *testing.T) {
	e := newEnv(t, envOptions{})
	run := e.dispatch(t, "alice")
	e.host.AppendOutput(run.ChildRunID, "hello\n")
	code := 0
	e.host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, &code, "")
	e.sweep(t)

	resp, err := e.h.HandleLambda(context.Background(), functionURLEvent(run.FleetRunID, "after=1", map[string]string{"Authorization": "Bearer " + adminToken}))
	if err != nil {
		t.Fatal(err)
	}
	if resp.ContentType() != "application/vnd.awslambda.http-integration-response" {
		t.Fatalf("content type %q", resp.ContentType())
	}
	// What the runtime sends is the response read as an io.Reader.
	wire, err := io.ReadAll(resp)
	if err != nil {
		t.Fatal(err)
	}
	prelude, body, ok := bytes.Cut(wire, make([]byte, 8))
	if !ok {
		t.Fatalf("no 8 NUL bytes in %q", wire)
	}
	var head struct {
		StatusCode int               `json:"statusCode"`
		Headers    map[string]string `json:"headers"`
	}
	if err := json.Unmarshal(prelude, &head); err != nil || head.StatusCode != 200 || head.Headers["content-type"] != "text/event-stream" {
		t.Fatalf("prelude %s: %+v %v", prelude, head, err)
	}
	seqs, done := eventsUntil(t, ssetest.Read(bytes.NewReader(body)), "done")
	if fmt.Sprint(seqs) != "[2 3]" || !strings.Contains(done.Data, `"succeeded"`) {
		t.Fatalf("body %s", body)
	}

	// A refusal is an ordinary JSON answer in the same format.
	resp, _ = e.h.HandleLambda(context.Background(), functionURLEvent(run.FleetRunID, "", nil))
	wire, _ = io.ReadAll(resp)
	prelude, body, _ = bytes.Cut(wire, make([]byte, 8))
	if !strings.Contains(string(prelude), `"statusCode":401`) || !strings.Contains(string(body), "unauthenticated") {
		t.Fatalf("refusal %q", wire)
	}
}

func TestLambdaCutsOffAReaderThatStops(t *testing.T) {
	e := newEnv(t, envOptions{cfg: Config{WriteTimeout: 5 * time.Second, KeepAlive: time.Hour}})
	run := e.dispatch(t, "alice")
	e.sweep(t)
	resp, err := e.h.HandleLambda(context.Background(), functionURLEvent(run.FleetRunID, "", map[string]string{"authorization": "Bearer " + adminToken}))
	if err != nil {
		t.Fatal(err)
	}
	// Nobody reads the pipe: the first write blocks; its watchdog fires.
	e.advanceUntilLogged(t, 5*time.Second, `"end":"client_stopped_reading"`)
	if _, err := io.ReadAll(resp); err == nil || !strings.Contains(err.Error(), "stopped reading") {
		t.Fatalf("reading after the cut: %v", err)
	}
}

func functionURLEvent(id, query string, headers map[string]string) events.LambdaFunctionURLRequest {
	return events.LambdaFunctionURLRequest{
		Version: "2.0", RawPath: "/fleet/runs/" + id + "/stream", RawQueryString: query, Headers: headers,
		RequestContext: events.LambdaFunctionURLRequestContext{
			RequestID: "req-1", DomainName: "abc.lambda-url.us-east-1.on.aws",
			HTTP: events.LambdaFunctionURLRequestContextHTTPDescription{Method: "GET", Path: "/fleet/runs/" + id + "/stream"},
		},
	}
}

func TestPath(t *testing.T) {
	for path, want := range map[string]string{
		"/fleet/runs/fr-1/stream":        "fr-1",
		"/fleet/runs/fr%2D1/stream":      "fr-1",
		"/fleet/runs//stream":            "",
		"/fleet/runs/a/b/stream":         "",
		"/fleet/runs/fr-1/stream/":       "",
		"/fleet/runs/fr-1/events":        "",
		"/fleet/runs/fr-1":               "",
		"/x/fleet/runs/fr-1/stream":      "",
		"/fleet/runs/fr-1%ZZ/stream":     "",
		"/fleet/runs/fr-1/stream?x=1":    "",
		"/fleet/runs/%2Fslash%2F/stream": "/slash/",
	} {
		got, ok := Path(path)
		if got != want || ok != (want != "") {
			t.Errorf("Path(%q) = %q, %v; want %q", path, got, ok, want)
		}
	}
}

// logSink collects JSON log lines and lets a test wait for one.
type logSink struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// has reports whether one line holds every part.
func (l *logSink) has(parts ...string) bool {
	for _, line := range strings.Split(l.String(), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

// advanceUntilLogged moves the clock by step whenever a timer falls due
// within step, until a log line has every part. That timer is the blocked
// write's watchdog (WriteTimeout = step); the poll's pull-through deadline
// (half the test's hour-long keep-alive) is never stepped toward, so a
// pull-through that is slow in real time cannot be timed out by the test.
func (e *env) advanceUntilLogged(t *testing.T, step time.Duration, parts ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !e.logs.has(parts...) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q in 10s: %s", parts, e.logs.String())
		}
		if next, ok := e.clk.Next(); ok && !next.After(e.clk.Now().Add(step)) {
			e.clk.Advance(step)
			continue
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// wait polls for a line with every part: the stream under test ends on
// its own goroutine, after the clock moved.
func (l *logSink) wait(t *testing.T, parts ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !l.has(parts...) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q in 10s: %s", parts, l.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStreamRenewsItsSlotAndFreesItAtTheEnd: with a cap of one, a stream
// that runs for longer than a lease's life still holds its slot (it renews
// every LeaseTTL/3), and frees it when it ends (done), so the next opens.
func TestStreamRenewsItsSlotAndFreesItAtTheEnd(t *testing.T) {
	e := newEnv(t, envOptions{ticks: true, leases: true, cfg: Config{MaxPerCaller: 1, LeaseTTL: 9 * time.Second, KeepAlive: time.Hour}})
	run := e.dispatch(t, "alice")
	e.sweep(t)
	ch := ssetest.Read(e.open(t, run.FleetRunID, "").Body)
	eventsUntil(t, ch, "snapshot")
	for i := 0; i < 30; i++ { // 30 s: more than three lease lives
		e.tick(t)
	}
	// tick returns once the clock moved, with the stream's poll at 30 s
	// still under way; the run ends only once the stream parked again after
	// it. Ended before, that poll could see it end, and the stream would
	// send done and never park for the next move of the clock.
	e.waitParked(t)
	second := e.open(t, run.FleetRunID, "")
	if second.StatusCode != http.StatusTooManyRequests || second.Header.Get("Retry-After") == "" {
		t.Fatalf("a second stream while the first runs 30 s on a 9 s lease: %d", second.StatusCode)
	}
	zero := 0
	e.host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, &zero, "")
	e.clk.Advance(e.h.cfg.PollInterval)
	eventsUntil(t, ch, "done")
	e.logs.wait(t, `"end":"done"`)
	if third := e.open(t, run.FleetRunID, ""); third.StatusCode != http.StatusOK {
		t.Fatalf("after the first ended: %d", third.StatusCode)
	}
}

// TestStreamThatLostItsSlotEnds: a stream whose lease lapsed (renewals
// could not reach the store for a whole lease life, here: the clock jumped)
// and was taken by another stream ends with a retry hint rather than
// exceed the cap.
func TestStreamThatLostItsSlotEnds(t *testing.T) {
	// Another stream takes the slot while this one's poll at 10 s asks its
	// host: after the lease lapsed (the clock is at 10 s once moved is
	// closed), before this stream's renewal, which follows the poll.
	var e *env
	var armed atomic.Bool
	moved := make(chan struct{})
	took := make(chan error, 1)
	e = newEnv(t, envOptions{ticks: true, leases: true, cfg: Config{MaxPerCaller: 1, LeaseTTL: 9 * time.Second, KeepAlive: time.Hour},
		onHostRequest: func(r *http.Request) {
			if !armed.CompareAndSwap(true, false) {
				return
			}
			select {
			case <-moved:
			case <-r.Context().Done():
				took <- r.Context().Err()
				return
			}
			_, err := e.st.AcquireStreamLease(context.Background(), store.StreamLease{OwnerID: "admin", Holder: "another", ExpiresAt: e.clk.Now().Add(time.Minute)}, 1)
			took <- err
		}})
	run := e.dispatch(t, "alice")
	e.sweep(t)
	ch := ssetest.Read(e.open(t, run.FleetRunID, "").Body)
	eventsUntil(t, ch, "snapshot")
	e.waitParked(t)
	armed.Store(true)
	e.clk.Advance(10 * time.Second) // past the lease
	close(moved)
	select {
	case err := <-took:
		if err != nil {
			t.Fatalf("another stream taking the lapsed slot: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream's poll at 10 s did not ask its host in 10s")
	}
	m := next(t, ch)
	if m.Retry != "2000" || len(m.Comments) != 1 || !strings.Contains(m.Comments[0], "lost its slot") {
		t.Fatalf("after its slot was taken: %+v", m)
	}
	e.logs.wait(t, `"end":"lease_lost"`)
}

// TestStreamEndsItsMarginBeforeTheInvocationDeadline: a Lambda invocation's
// context carries its deadline (on the wall clock); the stream ends 15 s
// before it (the README's "in Lambda also 15 s before the invocation's
// deadline"; DefaultEndMargin) with the planned end's retry hint, so the
// goodbye is written while the invocation can still send it, not when
// Lambda kills it. Polls, keep-alives, the idle end and the
// maximum duration are an hour or more away, so the one timer the parked
// stream holds is its end: when it falls due says when the stream ends.
func TestStreamEndsItsMarginBeforeTheInvocationDeadline(t *testing.T) {
	e := newEnv(t, envOptions{ticks: true, cfg: Config{PollInterval: time.Hour, KeepAlive: time.Hour, MaxDuration: 3 * time.Hour, IdleTimeout: 3 * time.Hour}})
	run := e.dispatch(t, "alice")
	e.sweep(t)
	const left = time.Minute // the invocation's time left when it starts
	const margin = 15 * time.Second
	opened := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), opened.Add(left))
	defer cancel()
	resp, err := e.h.HandleLambda(ctx, functionURLEvent(run.FleetRunID, "", map[string]string{"authorization": "Bearer " + adminToken}))
	if err != nil {
		t.Fatal(err)
	}
	ch := ssetest.Read(lambdaBody(t, resp))
	eventsUntil(t, ch, "snapshot")
	e.waitParked(t)
	// The stream read the deadline's distance on the wall clock once, at
	// its start, somewhere within elapsed of opened.
	elapsed := time.Since(opened)
	at, ok := e.clk.Next()
	if !ok {
		t.Fatal("the parked stream holds no timer")
	}
	endsIn := at.Sub(e.clk.Now())
	if latest, earliest := left-margin, left-margin-elapsed; endsIn > latest || endsIn < earliest {
		t.Fatalf("the stream ends %s after its start, %s before the deadline; want %s before it (within the %s the test took to open it)",
			endsIn, left-endsIn, margin, elapsed)
	}
	e.clk.Set(at)
	m := next(t, ch)
	if m.Retry != "2000" || len(m.Comments) != 1 || !strings.Contains(m.Comments[0], "maximum duration") {
		t.Fatalf("%s before the invocation's deadline: %+v, want the retry hint", left-endsIn, m)
	}
	if m, ok := await.RecvOK(t, "the stream to end", ch); ok {
		t.Fatalf("a message after the planned end: %+v", m)
	}
	e.logs.wait(t, `"end":"planned"`)
	if ctx.Err() != nil {
		t.Fatalf("the invocation's deadline passed before the stream ended (%s after it began)", time.Since(opened))
	}
}

// lambdaBody returns the SSE body of a streaming Lambda response as the
// runtime sends it: what follows the JSON prelude and its 8 NUL bytes,
// read as the session writes it.
func lambdaBody(t *testing.T, resp *events.LambdaFunctionURLStreamingResponse) io.Reader {
	t.Helper()
	r := bufio.NewReader(resp)
	var prelude []byte
	for nul := 0; nul < 8; {
		b, err := r.ReadByte()
		if err != nil {
			t.Fatalf("the prelude %q ended: %v", prelude, err)
		}
		prelude = append(prelude, b)
		if b == 0 {
			nul++
		} else {
			nul = 0
		}
	}
	if !bytes.Contains(prelude, []byte(`"statusCode":200`)) {
		t.Fatalf("prelude %q", prelude)
	}
	return r
}
