package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/credentials"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/boltstore"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

type testEnv struct {
	f         *Fleet
	st        *boltstore.Store
	clk       *clock.Fake
	credsPath string
	creds     map[string]string
}

func newTestEnv(t *testing.T, hostTimeout time.Duration) *testEnv {
	t.Helper()
	dir := t.TempDir()
	clk := clock.NewFake(t0)
	st, err := boltstore.Open(filepath.Join(dir, "fleet.db"), boltstore.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &testEnv{st: st, clk: clk, credsPath: filepath.Join(dir, "creds.json"), creds: map[string]string{}}
	e.writeCreds(t)
	src, err := credentials.NewFile(e.credsPath)
	if err != nil {
		t.Fatal(err)
	}
	e.f, err = New(Config{
		Store: st, Credentials: src, Clock: clk, HostTimeout: hostTimeout,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		RepoURLs: map[string]string{"acme/web": "https://git.example/acme/web.git"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// fleetOver is another Fleet like e.f (credentials, logger, clock) over st,
// typically a wrapper of e.st that injects a fault or a stale read.
func (e *testEnv) fleetOver(t *testing.T, st store.Store) *Fleet {
	t.Helper()
	f, err := New(Config{Store: st, Credentials: e.f.cfg.Credentials, Logger: e.f.log, Clock: e.clk})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (e *testEnv) writeCreds(t *testing.T) {
	t.Helper()
	b, _ := json.Marshal(e.creds)
	if err := os.WriteFile(e.credsPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	// The file source re-reads on a changed mtime or size; make the mtime move.
	mt := time.Unix(int64(len(e.creds))*10+1, 0)
	os.Chtimes(e.credsPath, mt, mt)
}

// addHost registers a fake host under id with a matching credential, and probes it.
func (e *testEnv) addHost(t *testing.T, id string, cfg fakehost.Config) *fakehost.Host {
	t.Helper()
	if cfg.Clock == nil {
		cfg.Clock = e.clk
	}
	h := fakehost.New(cfg)
	t.Cleanup(h.Close)
	e.creds[id] = h.Token()
	e.writeCreds(t)
	if _, err := e.f.RegisterHost(context.Background(), HostSpec{ID: id, BaseURL: h.URL, CredentialRef: id, CAPEM: h.CAPEM()}); err != nil {
		t.Fatal(err)
	}
	if p, err := e.f.ProbeHost(context.Background(), id); err != nil || p.Status != store.ProbeOK {
		t.Fatalf("probe %s: %+v %v", id, p, err)
	}
	return h
}

func caller(owner string, hosts ...string) store.Caller {
	c := store.Caller{OwnerID: owner, AllowedProjects: store.Scope{All: true}}
	if len(hosts) == 0 {
		c.AllowedHosts = store.Scope{All: true}
	} else {
		c.AllowedHosts = store.Scope{IDs: hosts}
	}
	return c
}

func kindOf(err error) (Kind, string) {
	var fe *Error
	if errors.As(err, &fe) {
		return fe.Kind, fe.Code
	}
	return 0, ""
}

func TestDispatchStartsOnceAndReusesPerOwnerAndKey(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	alice := caller("alice")
	req := DispatchRequest{Run: runspec.Request{Agent: "shell", Prompt: "echo hi", Env: map[string]string{"FOO": "bar"}}}

	first, err := e.f.Dispatch(ctx, alice, req, "key-1")
	if err != nil {
		t.Fatal(err)
	}
	r := first.Run
	if first.Reused || r.Status != hostproto.StatusPending || r.ChildRunID != "run-1" || r.HostID != "h1" || r.OwnerID != "alice" {
		t.Fatalf("first = %+v", first)
	}
	starts := host.Starts()
	if len(starts) != 1 || starts[0].ClientToken != r.FleetRunID || starts[0].Deadline == nil ||
		!starts[0].Deadline.Equal(t0.Add(10*time.Second)) || starts[0].Env["FOO"] != "bar" {
		t.Fatalf("host saw %+v", starts)
	}

	again, err := e.f.Dispatch(ctx, alice, req, "key-1")
	if err != nil || !again.Reused || again.Run.FleetRunID != r.FleetRunID {
		t.Fatalf("again = %+v, %v", again, err)
	}
	if host.Created() != 1 || host.StartCalls() != 1 {
		t.Fatalf("host created %d from %d calls; a reuse must not call the host", host.Created(), host.StartCalls())
	}

	other := req
	other.Run.Prompt = "echo bye"
	_, err = e.f.Dispatch(ctx, alice, other, "key-1")
	if k, code := kindOf(err); k != KindConflict || code != CodeIdempotencyMismatch {
		t.Fatalf("other payload: %v, want 409 %s", err, CodeIdempotencyMismatch)
	}

	// Keys are per owner: bob's key-1 is another run.
	bobs, err := e.f.Dispatch(ctx, caller("bob"), req, "key-1")
	if err != nil || bobs.Reused || bobs.Run.FleetRunID == r.FleetRunID {
		t.Fatalf("bob = %+v, %v", bobs, err)
	}
	// Without a key every request is a new run.
	n1, _ := e.f.Dispatch(ctx, alice, req, "")
	n2, _ := e.f.Dispatch(ctx, alice, req, "")
	if n1.Run.FleetRunID == n2.Run.FleetRunID || host.Created() != 4 {
		t.Fatalf("keyless dispatches: %s %s, host created %d", n1.Run.FleetRunID, n2.Run.FleetRunID, host.Created())
	}
}

func TestDispatchInFlightIs409WithTheRunID(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	host.FaultStarts(fakehost.HangBeforeAccept, 1)
	ctx := context.Background()
	req := DispatchRequest{Run: runspec.Request{Agent: "shell"}}

	var wg sync.WaitGroup
	var first DispatchResult
	var firstErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		first, firstErr = e.f.Dispatch(ctx, caller("alice"), req, "k")
	}()
	await.Cond(t, 10*time.Second, "the host to be asked to start the run", func() bool { return host.StartCalls() == 1 })

	_, err := e.f.Dispatch(ctx, caller("alice"), req, "k")
	var fe *Error
	if !errors.As(err, &fe) || fe.Kind != KindConflict || fe.Code != CodeInFlight {
		t.Fatalf("while in flight: %v", err)
	}
	host.Release()
	await.Group(t, "the first dispatch to return once the host answered", &wg)
	if firstErr != nil || first.Run.Status != hostproto.StatusPending {
		t.Fatalf("first = %+v, %v", first, firstErr)
	}
	if fe.Details.(map[string]string)["fleetRunId"] != first.Run.FleetRunID {
		t.Fatalf("409 details %v, want fleetRunId %s", fe.Details, first.Run.FleetRunID)
	}
	if host.Created() != 1 {
		t.Fatalf("host created %d runs", host.Created())
	}
}

func TestHostDyingAfterAcceptIsRecoveredWithoutASecondStart(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	host.FaultStarts(fakehost.DieAfterAccept, 1)
	ctx := context.Background()
	req := DispatchRequest{Run: runspec.Request{Agent: "shell", Prompt: "build"}}

	res, err := e.f.Dispatch(ctx, caller("alice"), req, "k")
	if err != nil {
		t.Fatal(err)
	}
	if res.Run.Status != store.StatusDispatching || res.Run.ChildRunID != "" || !strings.Contains(res.Note, "unknown") {
		t.Fatalf("after the host died: %+v", res)
	}
	if host.Created() != 1 {
		t.Fatalf("host created %d", host.Created())
	}

	// Before the deadline a retry of the request is still in flight.
	if _, err := e.f.Dispatch(ctx, caller("alice"), req, "k"); !isCode(err, CodeInFlight) {
		t.Fatalf("retry before the deadline: %v", err)
	}

	// Recovery asks the host by clientToken and records the same child run.
	rec, err := e.f.RecoverDispatching(ctx, res.Run.FleetRunID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != hostproto.StatusPending || rec.ChildRunID != "run-1" {
		t.Fatalf("recovered = %+v", rec)
	}
	// A retry after the deadline reuses it; nothing reaches the host again.
	e.clk.Advance(11 * time.Second)
	again, err := e.f.Dispatch(ctx, caller("alice"), req, "k")
	if err != nil || !again.Reused || again.Run.ChildRunID != "run-1" {
		t.Fatalf("retry = %+v, %v", again, err)
	}
	if host.Created() != 1 || host.StartCalls() != 1 {
		t.Fatalf("host created %d runs from %d start calls, want 1 from 1", host.Created(), host.StartCalls())
	}
}

func isCode(err error, code string) bool {
	_, c := kindOf(err)
	return c == code
}

func TestUnansweredDispatchIsLostOnlyAMinutePastItsDeadline(t *testing.T) {
	e := newTestEnv(t, 100*time.Millisecond)
	host := e.addHost(t, "h1", fakehost.Config{})
	host.FaultStarts(fakehost.HangBeforeAccept, 1)
	ctx := context.Background()

	res, err := e.f.Dispatch(ctx, caller("alice"), DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "")
	if err != nil || res.Run.Status != store.StatusDispatching {
		t.Fatalf("dispatch = %+v, %v", res, err)
	}
	id := res.Run.FleetRunID
	if host.Created() != 0 {
		t.Fatal("the hung start created a run")
	}

	for _, step := range []time.Duration{0, 100 * time.Millisecond, LostGrace} {
		e.clk.Advance(step)
		r, err := e.f.RecoverDispatching(ctx, id)
		if err != nil || r.Status != store.StatusDispatching {
			t.Fatalf("at +%v: %+v, %v; want still dispatching", step, r, err)
		}
	}
	// The start cannot arrive any more: the host refuses it after the deadline.
	c := hostClientFor(t, e, "h1")
	deadline := res.Run.Deadline
	if _, err := c.Start(ctx, hostproto.StartRequest{ClientToken: id, Request: runspec.Request{Agent: "shell", Deadline: &deadline}}); !isHostCode(err, hostproto.CodeDeadlinePassed) {
		t.Fatalf("late start: %v, want deadline_passed", err)
	}
	e.clk.Advance(time.Millisecond)
	r, err := e.f.RecoverDispatching(ctx, id)
	if err != nil || r.Status != hostproto.StatusFailed || r.Reason != store.ReasonDispatchLost || !r.Drained || r.Live() {
		t.Fatalf("a minute past the deadline: %+v, %v", r, err)
	}
	// Recovery of a settled run changes nothing.
	if again, err := e.f.RecoverDispatching(ctx, id); err != nil || again.Version != r.Version {
		t.Fatalf("second recovery: %+v %v", again, err)
	}
}

func hostClientFor(t *testing.T, e *testEnv, id string) *hostproto.Client {
	t.Helper()
	h, err := e.f.Host(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	c, err := e.f.HostClient(context.Background(), h, 0)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func isHostCode(err error, code string) bool {
	var he *hostproto.Error
	return errors.As(err, &he) && he.Code == code
}

func TestDispatchRecordsRefusalsAndUnreachableHosts(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{NoKeepAlive: true})
	ctx := context.Background()

	host.RefuseStarts(http.StatusConflict, hostproto.CodeDraining)
	res, err := e.f.Dispatch(ctx, caller("alice"), DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "")
	if err != nil || res.Run.Status != hostproto.StatusFailed || res.Run.Reason != hostproto.CodeDraining || !strings.Contains(res.Note, "refused") {
		t.Fatalf("refused: %+v, %v", res, err)
	}
	host.RefuseStarts(0, "")

	host.Close() // probed ok a moment ago, gone now
	res, err = e.f.Dispatch(ctx, caller("alice"), DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "")
	if err != nil || res.Run.Status != hostproto.StatusFailed || res.Run.Reason != hostproto.ReasonHostUnavailable {
		t.Fatalf("unreachable: %+v, %v", res, err)
	}
}

func TestDispatchNamedHostAndScope(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	e.addHost(t, "h1", fakehost.Config{})
	e.addHost(t, "h2", fakehost.Config{})
	ctx := context.Background()
	onlyH1 := caller("alice", "h1")

	_, err := e.f.Dispatch(ctx, onlyH1, DispatchRequest{Host: "nope", Run: runspec.Request{Agent: "shell"}}, "")
	if k, _ := kindOf(err); k != KindNotFound {
		t.Fatalf("unknown host: %v", err)
	}
	_, err = e.f.Dispatch(ctx, onlyH1, DispatchRequest{Host: "h2", Run: runspec.Request{Agent: "shell"}}, "")
	if k, _ := kindOf(err); k != KindForbidden || !strings.Contains(err.Error(), `"h2"`) {
		t.Fatalf("out of scope: %v", err)
	}
	// Unnamed: routing only ever sees h1, even though h2 is lower in id order... and both healthy.
	for i := 0; i < 3; i++ {
		res, err := e.f.Dispatch(ctx, onlyH1, DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "")
		if err != nil || res.Run.HostID != "h1" {
			t.Fatalf("routed = %+v, %v", res, err)
		}
	}
	// A project outside allowedProjects is 403 naming it.
	limited := caller("carol")
	limited.AllowedProjects = store.Scope{IDs: []string{"acme"}}
	_, err = e.f.Dispatch(ctx, limited, DispatchRequest{
		Run: runspec.Request{
			Agent:   "shell",
			Secrets: []runspec.Secret{{ProjectID: "globex", Key: "API_KEY", Domains: []string{"api.example.com"}}},
		},
	}, "")
	if k, _ := kindOf(err); k != KindForbidden || !strings.Contains(err.Error(), "globex") {
		t.Fatalf("project out of scope: %v", err)
	}
}

func TestDispatchRefusalListsExcludedHosts(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	e.addHost(t, "h1", fakehost.Config{})
	h2 := e.addHost(t, "h2", fakehost.Config{})
	h2.SetDraining(true)
	if _, err := e.f.ProbeHost(context.Background(), "h2"); err != nil {
		t.Fatal(err)
	}
	_, err := e.f.Dispatch(context.Background(), caller("alice"), DispatchRequest{Run: runspec.Request{Agent: "claude"}}, "")
	var fe *Error
	if !errors.As(err, &fe) || fe.Kind != KindConflict || fe.Code != CodeNoEligibleHost {
		t.Fatalf("refusal: %v", err)
	}
	b, _ := json.Marshal(fe.Details)
	want := `{"excluded":[{"hostId":"h1","reasons":["agent_unsupported"],"agents":["shell"]},` +
		`{"hostId":"h2","reasons":["draining","agent_unsupported"],"agents":["shell"]}]}`
	if string(b) != want {
		t.Fatalf("details = %s\nwant      %s", b, want)
	}
	if !strings.HasSuffix(fe.Message, `; agent "claude" is not offered: those hosts offer shell`) {
		t.Fatalf("the refusal does not name the agents offered: %s", fe.Message)
	}
}

func TestDispatchTakesOverAKeyWhoseRunWasNeverWritten(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	req := DispatchRequest{Run: runspec.Request{Agent: "shell"}}
	// A dispatcher wrote the key, then died before writing the run.
	if _, err := e.st.PutIdempotency(ctx, store.Idempotency{Key: "alice#k", FleetRunID: "fr-orphan", RequestHash: req.Hash(),
		CreatedAt: t0, ExpiresAt: t0.Add(IdempotencyTTL)}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.f.Dispatch(ctx, caller("alice"), req, "k"); !isCode(err, CodeInFlight) {
		t.Fatalf("soon after: %v, want in flight", err)
	}
	e.clk.Advance(10*time.Second + LostGrace)
	res, err := e.f.Dispatch(ctx, caller("alice"), req, "k")
	if err != nil || res.Run.FleetRunID != "fr-orphan" || res.Run.Status != hostproto.StatusPending || host.Created() != 1 {
		t.Fatalf("takeover = %+v, %v (host created %d)", res, err, host.Created())
	}
	again, err := e.f.Dispatch(ctx, caller("alice"), req, "k")
	if err != nil || !again.Reused || again.Run.FleetRunID != "fr-orphan" || host.Created() != 1 {
		t.Fatalf("after takeover = %+v, %v", again, err)
	}
}

func TestRunIsRefreshedFromTheHost(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	alice := caller("alice")
	res, err := e.f.Dispatch(ctx, alice, DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	id := res.Run.FleetRunID

	host.SetRun("run-1", hostproto.StatusRunning, nil, "")
	st, err := e.f.Run(ctx, alice, id)
	if err != nil || !st.Refreshed || st.Run.Status != hostproto.StatusRunning {
		t.Fatalf("running: %+v, %v", st, err)
	}
	zero := 0
	host.SetRun("run-1", hostproto.StatusSucceeded, &zero, "")
	st, _ = e.f.Run(ctx, alice, id)
	if st.Run.Status != hostproto.StatusSucceeded || st.Run.EndedAt == nil || st.Run.ExpiresAt.IsZero() || *st.Run.ExitCode != 0 {
		t.Fatalf("succeeded: %+v", st.Run)
	}
	if _, err := e.f.Run(ctx, caller("bob"), id); !isKind(err, KindNotFound) {
		t.Fatalf("bob reading alice's run: %v, want 404", err)
	}
	admin := store.Caller{OwnerID: "admin", Admin: true}
	if _, err := e.f.Run(ctx, admin, id); err != nil {
		t.Fatalf("admin: %v", err)
	}

	// A run the host denies is lost.
	res2, _ := e.f.Dispatch(ctx, alice, DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "")
	host.Forget(res2.Run.ChildRunID)
	st, err = e.f.Run(ctx, alice, res2.Run.FleetRunID)
	if err != nil || st.Run.Status != store.StatusLost || st.Run.Live() {
		t.Fatalf("denied: %+v, %v", st, err)
	}

	// An unreachable host leaves the last known state, with a note.
	res3, _ := e.f.Dispatch(ctx, alice, DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "")
	host.Close()
	st, err = e.f.Run(ctx, alice, res3.Run.FleetRunID)
	if err != nil || st.Refreshed || st.Run.Status != hostproto.StatusPending || st.Note == "" {
		t.Fatalf("host down: %+v, %v", st, err)
	}
}

func isKind(err error, k Kind) bool {
	got, _ := kindOf(err)
	return got == k
}

func TestRunsListsOwnRunsAndAllForAdmin(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	for _, owner := range []string{"alice", "bob", "alice"} {
		if _, err := e.f.Dispatch(ctx, caller(owner), DispatchRequest{Run: runspec.Request{Agent: "shell"}}, ""); err != nil {
			t.Fatal(err)
		}
		e.clk.Advance(time.Second)
	}
	page, err := e.f.Runs(ctx, caller("alice"), RunsQuery{Limit: 1})
	if err != nil || len(page.Runs) != 1 || page.NextCursor == "" {
		t.Fatalf("alice page 1: %+v %v", page, err)
	}
	page2, err := e.f.Runs(ctx, caller("alice"), RunsQuery{Cursor: page.NextCursor, Limit: 10})
	if err != nil || len(page2.Runs) != 1 || page2.Runs[0].OwnerID != "alice" || page2.NextCursor != "" {
		t.Fatalf("alice page 2: %+v %v", page2, err)
	}
	all, _ := e.f.Runs(ctx, store.Caller{OwnerID: "admin", Admin: true}, RunsQuery{Limit: 10})
	if len(all.Runs) != 3 {
		t.Fatalf("admin sees %d runs", len(all.Runs))
	}
	if _, err := e.f.Runs(ctx, caller("bob"), RunsQuery{Cursor: page.NextCursor, Limit: 10}); !isKind(err, KindInvalid) {
		t.Fatalf("alice's cursor used by bob: %v, want 400", err)
	}
}

// TestRunsLeavesOutRunsOnHostsOutOfScope: a caller that owns runs on a
// host no longer in its allowedHosts (re-minted with a smaller scope) is
// 403 on reading one, and does not see it listed; pages fill past them.
func TestRunsLeavesOutRunsOnHostsOutOfScope(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	e.addHost(t, "h1", fakehost.Config{})
	e.addHost(t, "h2", fakehost.Config{})
	ctx := context.Background()
	both := caller("alice", "h1", "h2")
	var ids []string
	for _, h := range []string{"h1", "h2", "h2", "h1", "h2"} {
		res, err := e.f.Dispatch(ctx, both, DispatchRequest{Host: h, Run: runspec.Request{Agent: "shell"}}, "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Run.FleetRunID)
		e.clk.Advance(time.Second)
	}
	reminted := caller("alice", "h1")
	if _, err := e.f.RunFor(ctx, reminted, ids[1]); !isKind(err, KindForbidden) || !strings.Contains(err.Error(), `"h2"`) {
		t.Fatalf("reading a run on h2: %v, want 403 naming h2", err)
	}
	// Newest first: h2, h1, h2, h2, h1. One per page: each page skips the
	// h2 runs before the next h1 run.
	var seen []string
	cursor := ""
	for i := 0; i < 3; i++ {
		page, err := e.f.Runs(ctx, reminted, RunsQuery{Cursor: cursor, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Runs {
			seen = append(seen, r.FleetRunID)
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if fmt.Sprint(seen) != fmt.Sprint([]string{ids[3], ids[0]}) {
		t.Fatalf("listed %v, want the h1 runs %v", seen, []string{ids[3], ids[0]})
	}
	if page, _ := e.f.Runs(ctx, both, RunsQuery{Limit: 10}); len(page.Runs) != 5 {
		t.Fatalf("with both hosts in scope: %d runs", len(page.Runs))
	}
}

func TestRegisterHostValidates(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	e.creds["ok"] = "secret-value"
	e.writeCreds(t)
	ctx := context.Background()
	for _, tc := range []struct {
		spec HostSpec
		code string
		want string
	}{
		{HostSpec{ID: "bad id", BaseURL: "https://h", CredentialRef: "ok"}, CodeInvalid, "id"},
		{HostSpec{ID: "h", BaseURL: "http://10.0.0.5:7070", CredentialRef: "ok"}, CodeInvalid, "loopback"},
		{HostSpec{ID: "h", BaseURL: "http://runner.example:7070", CredentialRef: "ok"}, CodeInvalid, "loopback"},
		{HostSpec{ID: "h", BaseURL: "ftp://h", CredentialRef: "ok"}, CodeInvalid, "baseUrl"},
		{HostSpec{ID: "h", BaseURL: "https://u:p@h", CredentialRef: "ok"}, CodeInvalid, "credentials"},
		{HostSpec{ID: "h", BaseURL: "https://h", CredentialRef: "missing"}, CodeUnknownCredential, "missing"},
		{HostSpec{ID: "h", BaseURL: "https://h", CredentialRef: "ok", CAPEM: "junk"}, CodeInvalid, "caPem"},
		{HostSpec{ID: "h", BaseURL: "http://127.0.0.1:1", CredentialRef: "ok", CAPEM: "junk"}, CodeInvalid, "caPem"},
		{HostSpec{ID: "h", BaseURL: "https://h", CredentialRef: "ok", LocalPaths: []string{"rel"}}, CodeInvalid, "localPaths[0]"},
		{HostSpec{ID: "h", BaseURL: "https://h", CredentialRef: "ok", Labels: map[string]string{"k": ""}}, CodeInvalid, "labels"},
	} {
		_, err := e.f.RegisterHost(ctx, tc.spec)
		if !isCode(err, tc.code) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "secret-value") {
			t.Errorf("%+v: %v, want %s naming %q", tc.spec, err, tc.code, tc.want)
		}
	}
	for i, ok := range []string{"http://127.0.0.1:7070", "http://[::1]:7070", "http://localhost:7070", "https://runner.example:7070/base/"} {
		id := fmt.Sprintf("ok%d", i)
		h, err := e.f.RegisterHost(ctx, HostSpec{ID: id, BaseURL: ok, CredentialRef: "ok"})
		if err != nil || !h.Enabled || strings.HasSuffix(h.BaseURL, "/") {
			t.Errorf("%s: %+v %v", ok, h, err)
		}
	}
	disabled := false
	if _, err := e.f.RegisterHost(ctx, HostSpec{ID: "dup", BaseURL: "https://h", CredentialRef: "ok", Enabled: &disabled}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.f.RegisterHost(ctx, HostSpec{ID: "dup", BaseURL: "https://h", CredentialRef: "ok"}); !isCode(err, CodeHostExists) {
		t.Fatalf("duplicate: %v", err)
	}
}

func TestProbeClassifiesHosts(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	ctx := context.Background()
	ok := e.addHost(t, "ok", fakehost.Config{TLS: true, Agents: []string{"shell", "claude"}, Version: "edge-9",
		Features: hostproto.Features{SecretsProxy: true, ExecRequire: true}})
	ok.SetDraining(true)
	ok.SetStorage(&hostproto.Storage{FreeBytes: 1 << 20, MinFreeBytes: 64 << 20, Low: true})
	ok.SetLimits(&hostproto.Limits{Enforced: hostproto.LimitsCgroup2, MemoryBytes: 2 << 30, Pids: 1024, CPU: 2})
	badAuth := e.addHost(t, "auth", fakehost.Config{})
	e.creds["auth"] = "wrong-token"
	e.writeCreds(t)
	_ = badAuth
	gone := e.addHost(t, "gone", fakehost.Config{})
	gone.Close()
	sick := e.addHost(t, "sick", fakehost.Config{})
	sick.FailHealth(http.StatusInternalServerError)
	notOK := e.addHost(t, "notok", fakehost.Config{})
	notOK.SetHealthy(false)
	disabled := e.addHost(t, "off", fakehost.Config{})
	disabled.FailHealth(http.StatusInternalServerError)
	if _, err := e.f.SetHostEnabled(ctx, "off", false); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(time.Minute)

	results, err := e.f.ProbeAll(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]store.Probe{}
	for _, r := range results {
		got[r.HostID] = r.Probe
	}
	want := map[string]string{"ok": store.ProbeOK, "auth": store.ProbeAuthFail, "gone": store.ProbeUnreachable,
		"sick": store.ProbeBadResponse, "notok": store.ProbeBadResponse}
	if len(got) != len(want) {
		t.Fatalf("probed %v, want %v (disabled host skipped)", got, want)
	}
	for id, status := range want {
		if got[id].Status != status || !got[id].At.Equal(t0.Add(time.Minute)) {
			t.Errorf("%s: %+v, want %s at t0+1m", id, got[id], status)
		}
		if status != store.ProbeOK && got[id].Detail == "" {
			t.Errorf("%s: no detail", id)
		}
	}
	p := got["ok"]
	if p.Version != "edge-9" || len(p.Agents) != 2 || !p.Features.SecretsProxy || !p.Draining {
		t.Fatalf("ok probe = %+v", p)
	}
	if p.Storage == nil || *p.Storage != (store.Storage{FreeBytes: 1 << 20, MinFreeBytes: 64 << 20, Low: true}) ||
		p.Limits == nil || *p.Limits != (store.Limits{Enforced: hostproto.LimitsCgroup2, MemoryBytes: 2 << 30, Pids: 1024, CPU: 2}) {
		t.Fatalf("ok probe storage %+v, limits %+v", p.Storage, p.Limits)
	}
	// A host older than the fields reports neither; nothing is made up.
	if n := got["notok"]; n.Storage != nil || n.Limits != nil {
		t.Fatalf("probe of a host without storage or limits = %+v", n)
	}
	stored, _ := e.f.Host(ctx, "ok")
	if stored.Probe == nil || stored.Probe.Version != "edge-9" || !stored.Probe.At.Equal(t0.Add(time.Minute)) ||
		stored.Probe.Storage == nil || !stored.Probe.Storage.Low || stored.Probe.Limits == nil {
		t.Fatalf("recorded probe = %+v", stored.Probe)
	}
	all, err := e.f.ProbeAll(ctx, false)
	if err != nil || len(all) != 6 {
		t.Fatalf("probe every host: %d results, %v", len(all), err)
	}
	if _, err := e.f.ProbeHost(ctx, "nope"); !isKind(err, KindNotFound) {
		t.Fatalf("unknown host: %v", err)
	}
}

func TestDeleteHostRefusesWhileReferenced(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	res, err := e.f.Dispatch(ctx, caller("alice"), DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.f.DeleteHost(ctx, "h1", false); !isCode(err, CodeHostInUse) {
		t.Fatalf("delete referenced: %v", err)
	}
	if res, err := e.f.DeleteHost(ctx, "h1", true); err != nil || !res.Done {
		t.Fatalf("forced delete of a host with one run: %+v, %v; want done in one step", res, err)
	}
	if _, err := e.st.GetRun(ctx, res.Run.FleetRunID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("forced delete kept the run: %v", err)
	}
	if _, err := e.f.DeleteHost(ctx, "h1", false); !isKind(err, KindNotFound) {
		t.Fatalf("delete again: %v", err)
	}
}

func TestCheckDispatchRefusesForbiddenEnv(t *testing.T) {
	c := caller("alice")
	secret := []runspec.Secret{{ProjectID: "acme", Key: "OPENAI_API_KEY", Domains: []string{"api.openai.com"}}}
	for name, req := range map[string]DispatchRequest{
		"granted key":     {Run: runspec.Request{Agent: "shell", Secrets: secret, Env: map[string]string{"OPENAI_API_KEY": "x"}}},
		"granted key lc":  {Run: runspec.Request{Agent: "shell", Secrets: secret, Env: map[string]string{"openai_api_key": "x"}}},
		"proxy":           {Run: runspec.Request{Agent: "shell", Env: map[string]string{"HTTPS_PROXY": "http://evil"}}},
		"proxy lowercase": {Run: runspec.Request{Agent: "shell", Env: map[string]string{"https_proxy": "http://evil"}}},
		"no proxy":        {Run: runspec.Request{Agent: "shell", Env: map[string]string{"NO_PROXY": "*"}}},
		"trust":           {Run: runspec.Request{Agent: "shell", Env: map[string]string{"SSL_CERT_FILE": "/tmp/ca"}}},
		"node trust":      {Run: runspec.Request{Agent: "shell", Env: map[string]string{"NODE_EXTRA_CA_CERTS": "/tmp/ca"}}},
		"runfleet":        {Run: runspec.Request{Agent: "shell", Env: map[string]string{"RUNFLEET_PROXIED_KEYS": "{}"}}},
		"bad name":        {Run: runspec.Request{Agent: "shell", Env: map[string]string{"1X": "y"}}},
		"nul value":       {Run: runspec.Request{Agent: "shell", Env: map[string]string{"X": "a\x00b"}}},
	} {
		err := CheckDispatch(c, req)
		if !isKind(err, KindInvalid) || !strings.Contains(err.Error(), "env") {
			t.Errorf("%s: %v, want 400 naming env", name, err)
		}
	}
	if err := CheckDispatch(c, DispatchRequest{Run: runspec.Request{Agent: "shell", Secrets: secret, Env: map[string]string{"FOO": "1"}}}); err != nil {
		t.Fatalf("a fine request: %v", err)
	}
}

func TestDispatchHashIsCanonical(t *testing.T) {
	a := DispatchRequest{Labels: map[string]string{"x": "y"}, Run: runspec.Request{Agent: "shell", Env: map[string]string{"A": "1", "B": "2"}}}
	b := DispatchRequest{Labels: map[string]string{"x": "y"}, Run: runspec.Request{Agent: "shell", Env: map[string]string{"B": "2", "A": "1"}, Argv: []string{}}}
	if a.Hash() != b.Hash() || !strings.HasPrefix(a.Hash(), "v1:") {
		t.Fatalf("equal requests hash differently: %s %s", a.Hash(), b.Hash())
	}
	c := a
	c.Host = "h1"
	if c.Hash() == a.Hash() {
		t.Fatal("naming a host must change the hash")
	}
}

// The hash is a contract with stored idempotency items: these values were
// taken from the code before the run request had a type of its own, so a
// retried dispatch of a request stored then is still the same payload.
func TestDispatchHashIsStable(t *testing.T) {
	full := DispatchRequest{Host: "h-1", Labels: map[string]string{"pool": "a", "gpu": "1"}, Run: runspec.Request{
		Agent: "shell", Prompt: "make test", Argv: []string{"-x", "é"}, Repository: "acme/app", LocalPath: "/srv/work/app",
		Env: map[string]string{"B": "2", "A": "1"},
		Secrets: []runspec.Secret{{ProjectID: "acme", Key: "API_KEY", Domains: []string{"api.example.com", "b.example:8443"}},
			{ProjectID: "acme", Key: "OTHER", Domains: []string{"c.example"}}},
	}}
	for name, c := range map[string]struct {
		req  DispatchRequest
		want string
	}{
		"full": {full, "v1:6b53267b6f99fe35ca8564a36c5d42a76f1f52bfef6e410667abc41bf3dbcd33"},
		"bare": {DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "v1:05350565aa251a39418aa0ec77b1a52c48ac36919e0df1bcb4d8530ce1749ecd"},
	} {
		if got := c.req.Hash(); got != c.want {
			t.Errorf("%s: hash %s, want %s (canonical %s)", name, got, c.want, c.req.canonicalJSON())
		}
	}
}

func TestCallers(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	ctx := context.Background()
	c, token, err := e.f.MintCaller(ctx, CallerSpec{OwnerID: "alice", AllowedHosts: &store.Scope{IDs: []string{"h1"}}, AllowedProjects: &store.Scope{All: true}})
	if err != nil || !strings.HasPrefix(token, "rft_") || c.TokenHash == "" || strings.Contains(c.TokenHash, token) {
		t.Fatalf("mint = %+v %q %v", c, token, err)
	}
	if _, _, err := e.f.MintCaller(ctx, CallerSpec{OwnerID: "alice", AllowedHosts: &store.Scope{All: true}, AllowedProjects: &store.Scope{All: true}}); !isCode(err, CodeOwnerExists) {
		t.Fatalf("existing owner: %v", err)
	}
	if _, _, err := e.f.MintCaller(ctx, CallerSpec{OwnerID: "admin", Admin: true}); !isCode(err, CodeOwnerReserved) {
		t.Fatalf("admin: %v", err)
	}
	if _, _, err := e.f.MintCaller(ctx, CallerSpec{OwnerID: "bob", AllowedProjects: &store.Scope{All: true}}); !isKind(err, KindInvalid) || !strings.Contains(err.Error(), "allowedHosts") {
		t.Fatalf("no allowedHosts: %v", err)
	}
	if _, _, err := e.f.MintCaller(ctx, CallerSpec{OwnerID: "bob", AllowedHosts: &store.Scope{IDs: []string{""}}, AllowedProjects: &store.Scope{All: true}}); !isKind(err, KindInvalid) || !strings.Contains(err.Error(), "allowedHosts[0]") {
		t.Fatalf("empty host id: %v", err)
	}
	root, _, err := e.f.MintCaller(ctx, CallerSpec{OwnerID: "ops", Admin: true})
	if err != nil || !root.AllowedHosts.All || !root.AllowedProjects.All {
		t.Fatalf("admin mint = %+v %v", root, err)
	}
	list, _ := e.f.Callers(ctx)
	if len(list) != 2 {
		t.Fatalf("callers = %+v", list)
	}
	if err := e.f.RevokeCaller(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	if err := e.f.RevokeCaller(ctx, "alice"); !isKind(err, KindNotFound) {
		t.Fatalf("revoke twice: %v", err)
	}
	if err := e.f.RevokeCaller(ctx, "admin"); !isCode(err, CodeOwnerReserved) {
		t.Fatalf("revoke admin: %v", err)
	}
}
