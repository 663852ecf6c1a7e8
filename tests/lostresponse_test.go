package tests

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// Issue 15, item 4: a conditional write whose response is lost. The SDK
// retries it, and the retry meets the item its own first attempt wrote.
// These tests lose answers on the way back from moto_server after moto has
// applied the request, and let the SDK's own retry run.

// writeOps are the DynamoDB operations that write.
var writeOps = map[string]bool{"PutItem": true, "UpdateItem": true, "TransactWriteItems": true, "DeleteItem": true}

// lossyTransport is an http.RoundTripper around the SDK's HTTP transport
// for a network that loses answers: it forwards every request to moto, and
// when lose picks the request it reads moto's real answer whole (so moto has
// applied the request) and returns a connection reset instead, as a dropped
// connection would; the SDK takes that as retryable. lose decides by
// counters (the operation, the call's number, the attempt), never by
// chance, so a run is repeatable.
type lossyTransport struct {
	next http.RoundTripper

	mu sync.Mutex
	// lose says whether to lose the answer to attempt (from 1) of the
	// call-th call (from 1, per operation) of op; nil loses nothing.
	lose func(op string, call, attempt int) bool
	// calls numbers each call (the SDK's invocation id, the same in every
	// attempt) per operation; seen counts calls per operation.
	calls map[string]int
	seen  map[string]int
	// lost counts lost answers per operation.
	lost map[string]int
}

func newLossyTransport() *lossyTransport {
	return &lossyTransport{
		next:  awshttp.NewBuildableClient().GetTransport(),
		calls: map[string]int{}, seen: map[string]int{}, lost: map[string]int{},
	}
}

// setLose replaces the rule; nil loses nothing.
func (l *lossyTransport) setLose(lose func(op string, call, attempt int) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lose = lose
}

// loseWrites loses the answers to the first n attempts of every write.
func loseWrites(n int) func(op string, call, attempt int) bool {
	return func(op string, _, attempt int) bool { return writeOps[op] && attempt <= n }
}

// lostCounts returns the answers lost so far, per operation and in all.
func (l *lossyTransport) lostCounts() (map[string]int, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out, total := map[string]int{}, 0
	for op, n := range l.lost {
		out[op] = n
		total += n
	}
	return out, total
}

func (l *lossyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	_, op, _ := strings.Cut(req.Header.Get("X-Amz-Target"), ".")
	attempt, err := sdkAttempt(req.Header.Get("Amz-Sdk-Request"))
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	inv := op + " " + req.Header.Get("Amz-Sdk-Invocation-Id")
	call, ok := l.calls[inv]
	if !ok {
		l.seen[op]++
		call = l.seen[op]
		l.calls[inv] = call
	}
	lose := l.lose != nil && l.lose(op, call, attempt)
	l.mu.Unlock()

	resp, err := l.next.RoundTrip(req)
	if err != nil || !lose {
		return resp, err
	}
	_, rerr := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if rerr != nil {
		return nil, rerr
	}
	l.mu.Lock()
	l.lost[op]++
	l.mu.Unlock()
	return nil, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
}

// sdkAttempt reads the attempt number from the SDK's amz-sdk-request
// header ("attempt=1; max=3").
func sdkAttempt(h string) (int, error) {
	for _, part := range strings.Split(h, ";") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(part), "attempt="); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("lossy transport: no attempt in amz-sdk-request %q", h)
}

// config returns c with answers going through l and the SDK's standard
// retryer (three attempts, as Fleet's clients use it) without its backoff,
// so the retries cost no real time, and without its retry quota: the
// quota (500 tokens, 14 a retry) stops a client retrying once a sick
// network has cost it ~36 retries more than its successes paid back, and
// these tests lose an answer on every write by design.
func (l *lossyTransport) config(c aws.Config) aws.Config {
	c.HTTPClient = &http.Client{Transport: l}
	c.RetryMaxAttempts = 0
	c.Retryer = func() aws.Retryer {
		return retry.NewStandard(func(o *retry.StandardOptions) {
			o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
			o.RateLimiter = ratelimit.None
		})
	}
	return c
}

// withoutHolder is a DynamoDB client that, like an emulator without
// ReturnValuesOnConditionCheckFailure, never returns the item that failed
// a put's condition.
type withoutHolder struct{ *dynamodb.Client }

func (w withoutHolder) PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	out, err := w.Client.PutItem(ctx, in, opts...)
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		ccf.Item = nil
	}
	return out, err
}

func (w withoutHolder) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	out, err := w.Client.TransactWriteItems(ctx, in, opts...)
	var tce *types.TransactionCanceledException
	if errors.As(err, &tce) {
		for i := range tce.CancellationReasons {
			tce.CancellationReasons[i].Item = nil
		}
	}
	return out, err
}

// lossyStores returns a store whose answers go through a lossy transport
// (through withoutHolder if noHolder) and a plain one on the same tables
// (for someone else's writes).
func lossyStores(t *testing.T, clk clock.Clock, noHolder bool) (*dynamostore.Store, *dynamostore.Store, *lossyTransport) {
	t.Helper()
	names := dynamostore.Prefixed(motoserver.Unique("lost") + "-")
	lt := newLossyTransport()
	var api dynamostore.API = dynamodb.NewFromConfig(lt.config(moto.AWSConfig()))
	if noHolder {
		api = withoutHolder{api.(*dynamodb.Client)}
	}
	lossy, err := dynamostore.New(api, dynamostore.Config{Tables: names, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := dynamostore.New(moto.DynamoDB(), dynamostore.Config{Tables: names, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.CreateTables(context.Background()); err != nil {
		t.Fatal(err)
	}
	return lossy, plain, lt
}

// TestStoreWritesKnowTheirOwnLostAnswer checks every conditional write of
// dynamostore when moto applied it but the answer was lost once or twice:
// the SDK's retry answers as the first attempt would have, and someone
// else's item is still refused; also when the failed condition brings no
// item back and the store must read it.
func TestStoreWritesKnowTheirOwnLostAnswer(t *testing.T) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	clk := clock.NewFake(now)
	for _, c := range []struct {
		lostAttempts int
		noHolder     bool
	}{{1, false}, {2, false}, {1, true}} {
		lostAttempts := c.lostAttempts
		name := fmt.Sprintf("%d-lost", lostAttempts)
		if c.noHolder {
			name += "/no-holder-returned"
		}
		t.Run(name, func(t *testing.T) {
			st, plain, lt := lossyStores(t, clk, c.noHolder)
			lt.setLose(loseWrites(lostAttempts))
			// expectLost fails unless op lost want more answers since the last call.
			last := map[string]int{}
			expectLost := func(op string) {
				t.Helper()
				got, _ := lt.lostCounts()
				if got[op]-last[op] != lostAttempts {
					t.Fatalf("%s: %d answers lost, want %d (the test would prove nothing)", op, got[op]-last[op], lostAttempts)
				}
				last = got
			}

			host := store.Host{ID: "h1", BaseURL: "http://127.0.0.1:1", CredentialRef: "ref", Enabled: true, CreatedAt: now}
			if err := st.CreateHost(ctx, host); err != nil {
				t.Fatalf("CreateHost after a lost answer: %v, want success", err)
			}
			expectLost("PutItem")
			if got, err := plain.GetHost(ctx, "h1"); err != nil || got.BaseURL != host.BaseURL {
				t.Fatalf("the host as stored: %+v, %v", got, err)
			}
			if err := st.CreateHost(ctx, host); !errors.Is(err, store.ErrExists) {
				t.Fatalf("CreateHost of an id another call took: %v, want ErrExists", err)
			}
			expectLost("PutItem")

			caller := store.Caller{OwnerID: "alice", TokenHash: strings.Repeat("ab", 32), AllowedHosts: store.Scope{All: true}, CreatedAt: now}
			if err := st.CreateCaller(ctx, caller); err != nil {
				t.Fatalf("CreateCaller after a lost answer: %v, want success", err)
			}
			expectLost("TransactWriteItems")
			if got, err := plain.CallerByTokenHash(ctx, caller.TokenHash); err != nil || got.OwnerID != "alice" {
				t.Fatalf("the caller as stored: %+v, %v", got, err)
			}
			other := caller
			other.TokenHash = strings.Repeat("cd", 32)
			if err := st.CreateCaller(ctx, other); !errors.Is(err, store.ErrExists) {
				t.Fatalf("CreateCaller of an ownerId another call took: %v, want ErrExists", err)
			}
			expectLost("TransactWriteItems")

			idem := store.Idempotency{Key: "alice#k1", FleetRunID: "fr-1", RequestHash: "h", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
			got, err := st.PutIdempotency(ctx, idem)
			if err != nil || got.FleetRunID != "fr-1" {
				t.Fatalf("PutIdempotency after a lost answer: %+v, %v; want its own item and success", got, err)
			}
			expectLost("PutItem")
			theirs := store.Idempotency{Key: "alice#k2", FleetRunID: "fr-theirs", RequestHash: "h", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
			if _, err := plain.PutIdempotency(ctx, theirs); err != nil {
				t.Fatal(err)
			}
			mine := theirs
			mine.FleetRunID = "fr-mine"
			if got, err := st.PutIdempotency(ctx, mine); !errors.Is(err, store.ErrExists) || got.FleetRunID != "fr-theirs" {
				t.Fatalf("PutIdempotency of a key another call holds: %+v, %v; want their item with ErrExists", got, err)
			}
			expectLost("PutItem")

			run := store.Run{FleetRunID: "fr-1", OwnerID: "alice", HostID: "h1", Status: store.StatusDispatching, CreatedAt: now, UpdatedAt: now, Deadline: now.Add(time.Minute)}
			if err := st.CreateRun(ctx, run); err != nil {
				t.Fatalf("CreateRun after a lost answer: %v, want success", err)
			}
			expectLost("PutItem")
			if err := st.CreateRun(ctx, run); !errors.Is(err, store.ErrExists) {
				t.Fatalf("CreateRun of an id another call took: %v, want ErrExists", err)
			}
			expectLost("PutItem")

			stored, err := plain.GetRun(ctx, "fr-1")
			if err != nil || stored.Version != 1 {
				t.Fatalf("the run as created: %+v, %v", stored, err)
			}
			next := stored
			next.Status, next.ChildRunID, next.Attempt = hostproto.StatusRunning, "r-1", 1
			updated, err := st.UpdateRun(ctx, next)
			if err != nil || updated.Version != 2 || updated.Status != hostproto.StatusRunning || updated.ChildRunID != "r-1" {
				t.Fatalf("UpdateRun after a lost answer: %+v, %v; want version 2, running, and success", updated, err)
			}
			expectLost("UpdateItem")
			if _, err := st.UpdateRun(ctx, next); !errors.Is(err, store.ErrConflict) {
				t.Fatalf("UpdateRun from a version another call moved on: %v, want ErrConflict", err)
			}
			expectLost("UpdateItem")

			events := []store.Event{
				{FleetRunID: "fr-1", Sequence: 1, Type: "output", Data: []byte(`"a"`), TS: now},
				{FleetRunID: "fr-1", Sequence: 2, Type: "output", Data: []byte(`"b"`), TS: now},
			}
			if err := st.PutEvents(ctx, events); err != nil {
				t.Fatalf("PutEvents after lost answers: %v, want success", err)
			}
			if lost, _ := lt.lostCounts(); lost["PutItem"]-last["PutItem"] != 2*lostAttempts {
				t.Fatalf("PutEvents: %d answers lost, want %d", lost["PutItem"]-last["PutItem"], 2*lostAttempts)
			}
			page, err := plain.ListEvents(ctx, "fr-1", 0, 10)
			if err != nil || len(page.Events) != 2 {
				t.Fatalf("the mirror after PutEvents: %+v, %v; want the two events once", page, err)
			}

			// The broker's refresher: its commit must not read its own
			// write as a generation moved on by another refresher.
			lease, err := st.AcquireBrokerLease(ctx, "acme/GOOGLE", "a", now.Add(time.Minute))
			if err != nil || lease.LeaseHolder != "a" {
				t.Fatalf("AcquireBrokerLease after a lost answer: %+v, %v; want the lease", lease, err)
			}
			expectLost("UpdateItem")
			lease.SealedRefreshToken = []byte{1, 2, 3}
			committed, err := st.CommitBrokerState(ctx, lease)
			if err != nil || committed.Generation != 1 || committed.LeaseHolder != "" {
				t.Fatalf("CommitBrokerState after a lost answer: %+v, %v; want generation 1, released, and success", committed, err)
			}
			expectLost("UpdateItem")
			if _, err := st.CommitBrokerState(ctx, lease); !errors.Is(err, store.ErrConflict) {
				t.Fatalf("CommitBrokerState from a generation another commit moved on: %v, want ErrConflict", err)
			}
			expectLost("UpdateItem")
			if _, err := st.AcquireBrokerLease(ctx, "acme/GOOGLE", "a", now.Add(time.Minute)); err != nil {
				t.Fatal(err)
			}
			expectLost("UpdateItem")
			if err := st.ReleaseBrokerLease(ctx, "acme/GOOGLE", "a"); err != nil {
				t.Fatalf("ReleaseBrokerLease after a lost answer: %v, want success", err)
			}
			expectLost("UpdateItem")
			if got, err := plain.GetBrokerState(ctx, "acme/GOOGLE"); err != nil || got.Generation != 1 || got.LeaseHolder != "" {
				t.Fatalf("the broker state as stored: %+v, %v; want generation 1, no lease", got, err)
			}
		})
	}
}

// TestCreatesSurviveLostResponses is the measure at the API, on a
// smaller scale for the suite: BenchmarkCreatesSurviveLostResponses runs
// the 1,000 lost answers (about a minute on moto_server).
func TestCreatesSurviveLostResponses(t *testing.T) {
	r := loseAnswersAtTheAPI(t, 150)
	t.Log(r)
}

// BenchmarkCreatesSurviveLostResponses loses at least 1,000 answers per
// iteration (the benchmark: 0 spurious 409/500; any refusal fails
// it) and reports the answers lost and the creating API requests (host
// registrations, mints, dispatches) per iteration.
func BenchmarkCreatesSurviveLostResponses(b *testing.B) {
	var lost, requests int
	for i := 0; i < b.N; i++ {
		r := loseAnswersAtTheAPI(b, 1000)
		b.Log(r)
		lost += r.lost
		requests += r.registered + r.minted + r.dispatches
	}
	b.ReportMetric(float64(lost)/float64(b.N), "lost-answers/op")
	b.ReportMetric(float64(requests)/float64(b.N), "api-creates/op")
}

// lostAnswersReport is what loseAnswersAtTheAPI did.
type lostAnswersReport struct {
	lost                           int
	byOp                           map[string]int
	registered, minted, dispatches int
	elapsed                        time.Duration
}

func (r lostAnswersReport) String() string {
	return fmt.Sprintf("%d answers lost %v over %d host registrations (and their probes), %d callers minted, %d routed dispatches (half with a key): 0 refused, in %s",
		r.lost, r.byOp, r.registered, r.minted, r.dispatches, r.elapsed.Round(time.Millisecond))
}

// loseAnswersAtTheAPI loses at least wantLost answers across host
// registration, caller minting and routed dispatch (with and without an
// idempotency key), on a DynamoDB stack where every write loses its first
// answer and every fifth call of an operation its second too. Each request
// must answer as the first attempt would have (201 with what it created),
// and each dispatch must start its run on the host exactly once; then
// someone else's id is still refused.
func loseAnswersAtTheAPI(tb testing.TB, wantLost int) lostAnswersReport {
	tb.Helper()
	lt := newLossyTransport()
	var logs syncbuf.Buffer
	s := newStack(tb, "dynamodb", stackOptions{aws: lt.config, log: &logs})
	lt.setLose(func(op string, call, attempt int) bool {
		return writeOps[op] && (attempt == 1 || attempt == 2 && call%5 == 0)
	})
	fail := func(format string, args ...any) {
		tb.Helper()
		lost, _ := lt.lostCounts()
		tb.Fatalf("%s\nanswers lost so far %v; Fleet's errors:\n%s", fmt.Sprintf(format, args...), lost, errorLines(logs.String()))
	}
	start := time.Now()
	hosts := map[string]*fakehost.Host{}
	var r lostAnswersReport
	body := `{"agent":"shell","prompt":"make test"}`
	for round := 0; ; round++ {
		if _, lost := lt.lostCounts(); lost >= wantLost {
			break
		}
		id := fmt.Sprintf("h%03d", round)
		h := fakehost.New(fakehost.Config{Clock: s.clk})
		tb.Cleanup(h.Close)
		a := s.do(tb, "POST", "/fleet/hosts", adminToken, jsonBody(map[string]any{"id": id, "baseUrl": h.URL, "credentialRef": hostCredRef}))
		if host, _ := a.body["host"].(map[string]any); a.status != http.StatusCreated || host["id"] != id {
			fail("registering %s: %d %s, want 201 with the host", id, a.status, a.raw)
		}
		hosts[id] = h
		r.registered++
		s.probe(tb, id)

		owner := fmt.Sprintf("caller-%03d", round)
		a = s.do(tb, "POST", "/fleet/callers", adminToken, jsonBody(map[string]any{"ownerId": owner, "allowedHosts": "*", "allowedProjects": "*"}))
		token := a.str("token")
		if a.status != http.StatusCreated || a.str("ownerId") != owner || !strings.HasPrefix(token, "rft_") {
			fail("minting %s: %d, want 201 with the caller and its token", owner, a.status)
		}
		r.minted++

		for i, key := range []string{fmt.Sprintf("k-%d-a", round), "", fmt.Sprintf("k-%d-b", round), ""} {
			var headers []string
			if key != "" {
				headers = []string{"Idempotency-Key", key}
			}
			// The minted token works: its caller dispatches.
			a := s.do(tb, "POST", "/fleet/runs", token, body, headers...)
			if a.status != http.StatusCreated {
				fail("dispatch %d of round %d (key %q): %d %s, want 201", i, round, key, a.status, a.raw)
			}
			r.dispatches++
			fleetRunID, child := a.str("fleetRunId"), a.str("childRunId")
			h := hosts[a.str("hostId")]
			if h == nil || a.body["reused"] != false || child == "" {
				fail("dispatch %d of round %d: %s, want a new run on a registered host", i, round, a.raw)
			}
			if hr, ok := h.Run(child); !ok || hr.ClientToken != fleetRunID {
				fail("dispatch %d of round %d: the host has run %q as %+v (found %v), want clientToken %s", i, round, child, hr, ok, fleetRunID)
			}
			if key != "" {
				again := s.do(tb, "POST", "/fleet/runs", token, body, headers...)
				if again.status != http.StatusOK || again.str("fleetRunId") != fleetRunID || again.body["reused"] != true {
					fail("the same key again: %d %s, want 200 with run %s reused", again.status, again.raw, fleetRunID)
				}
			}
		}
	}
	r.elapsed = time.Since(start)

	var created, startCalls int
	for _, h := range hosts {
		created += h.Created()
		startCalls += h.StartCalls()
	}
	if created != r.dispatches || startCalls != r.dispatches {
		fail("hosts created %d runs from %d start calls for %d dispatches; want one each", created, startCalls, r.dispatches)
	}
	// Someone else's id is still refused, answers lost or not.
	if a := s.do(tb, "POST", "/fleet/hosts", adminToken, jsonBody(map[string]any{"id": "h000", "baseUrl": hosts["h000"].URL, "credentialRef": hostCredRef})); a.status != http.StatusConflict {
		fail("registering h000 again: %d %s, want 409", a.status, a.raw)
	}
	if a := s.do(tb, "POST", "/fleet/callers", adminToken, `{"ownerId":"caller-000","allowedHosts":"*","allowedProjects":"*"}`); a.status != http.StatusConflict {
		fail("minting caller-000 again: %d %s, want 409", a.status, a.raw)
	}
	r.byOp, r.lost = lt.lostCounts()
	return r
}

// errorLines keeps the lines of a JSON log at level ERROR or WARN.
func errorLines(log string) string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `"level":"ERROR"`) || strings.Contains(line, `"level":"WARN"`) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestRefusedDispatchAfterLostAnswer: the update that records a host's
// refusal loses its answer. Before the fix, UpdateRun's retry met its own
// write as ErrConflict, Dispatch re-read the run, found it settled and
// answered 201 without the refusal; now the answer is the first attempt's:
// 409 with the host's reason.
func TestRefusedDispatchAfterLostAnswer(t *testing.T) {
	lt := newLossyTransport()
	s := newStack(t, "dynamodb", stackOptions{aws: lt.config})
	h := s.addHost(t, "h1", fakehost.Config{}, nil)
	s.probe(t, "h1")
	token := s.mint(t, "alice", "*", "*")
	h.RefuseStarts(http.StatusTooManyRequests, "host_busy")
	lt.setLose(func(op string, _, attempt int) bool { return op == "UpdateItem" && attempt == 1 })
	for _, key := range []string{"", "k1"} {
		var headers []string
		if key != "" {
			headers = []string{"Idempotency-Key", key}
		}
		a := s.do(t, "POST", "/fleet/runs", token, `{"agent":"shell"}`, headers...)
		if a.status != http.StatusConflict || a.str("code") != "host_busy" || a.str("status") != hostproto.StatusFailed {
			t.Errorf("a refused dispatch (key %q) whose record lost its answer: %d %s, want 409 host_busy with the failed run", key, a.status, a.raw)
		}
	}
	if lost, _ := lt.lostCounts(); lost["UpdateItem"] != 2 {
		t.Fatalf("%d UpdateItem answers lost, want 2", lost["UpdateItem"])
	}
}
