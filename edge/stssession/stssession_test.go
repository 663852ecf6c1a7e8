package stssession

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// fakeSTS stands in for STS (the e2e tests call moto's): it records every
// AssumeRole call and answers each with fresh credentials that end
// lifetime after the fake clock's now, or with what answer says.
type fakeSTS struct {
	clock    *clock.Fake
	lifetime time.Duration

	mu    sync.Mutex
	calls []Request
	// answer, when set, answers call n (0-based) instead.
	answer func(n int, req Request) (Credentials, error)
	// entered and release, when set, hold every call: it reports itself
	// on entered, then waits for release.
	entered chan Request
	release chan struct{}
}

func newFakeSTS(clk *clock.Fake) *fakeSTS { return &fakeSTS{clock: clk, lifetime: time.Hour} }

func (f *fakeSTS) AssumeRole(ctx context.Context, req Request) (Credentials, error) {
	f.mu.Lock()
	n := len(f.calls)
	f.calls = append(f.calls, req)
	answer, entered, release := f.answer, f.entered, f.release
	f.mu.Unlock()
	if entered != nil {
		entered <- req
	}
	if release != nil {
		<-release
	}
	if answer != nil {
		return answer(n, req)
	}
	return f.creds(n), nil
}

// creds are call n's credentials: every field names the call, so a test
// tells which call's it got.
func (f *fakeSTS) creds(n int) Credentials {
	return Credentials{
		AccessKeyID:     secrets.NewValue(fmt.Sprintf("ASIAFAKE%012d", n)),
		SecretAccessKey: secrets.NewValue(fmt.Sprintf("secret-of-call-%d", n)),
		SessionToken:    secrets.NewValue(fmt.Sprintf("token-of-call-%d", n)),
		Expires:         f.clock.Now().Add(f.lifetime),
	}
}

func (f *fakeSTS) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func (f *fakeSTS) call(i int) Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[i]
}

var (
	t0   = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ref  = policy.KeyRef{Project: "acme", Key: "DEPLOY"}
	role = policy.AssumeRole{
		RoleARN:       "arn:aws:iam::123456789012:role/runfleet-deploy",
		ExternalID:    "fleet-7f3a",
		SessionPolicy: `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"arn:aws:s3:::reports/*"}]}`,
		Duration:      time.Hour,
	}
)

func newSessions(t *testing.T) (*Sessions, *fakeSTS, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(t0)
	f := newFakeSTS(clk)
	return New(f, clk), f, clk
}

func mustGet(t *testing.T, s *Sessions, runID string) Credentials {
	t.Helper()
	c, err := s.Get(context.Background(), runID, ref, role)
	if err != nil {
		t.Fatalf("Get(%s): %v", runID, err)
	}
	return c
}

// The first Get of a run mints its session with one AssumeRole call, named
// after the run and carrying the role as the policy compiled it; Gets
// before the refresh point reuse it without calling STS.
func TestFirstGetMintsOneSessionNamedAfterTheRun(t *testing.T) {
	s, f, clk := newSessions(t)
	first := mustGet(t, s, "run-42")
	if f.callCount() != 1 {
		t.Fatalf("%d AssumeRole calls for a first Get, want 1", f.callCount())
	}
	req := f.call(0)
	if req.SessionName != "runfleet-run-42" {
		t.Errorf("RoleSessionName %q, want runfleet-run-42 (CloudTrail attributes the calls by it)", req.SessionName)
	}
	if req.Role != role {
		t.Errorf("AssumeRole got role %+v, want %+v (ARN, external id, session policy and duration as compiled)", req.Role, role)
	}
	if first.AccessKeyID.Reveal() != f.creds(0).AccessKeyID.Reveal() || first.SecretAccessKey.Reveal() != "secret-of-call-0" || first.SessionToken.Reveal() != "token-of-call-0" || !first.Expires.Equal(t0.Add(time.Hour)) {
		t.Error("Get did not return the credentials STS answered")
	}
	if s.Len() != 1 {
		t.Errorf("Len %d after one session, want 1", s.Len())
	}

	// Up to the last instant before Expires-RefreshBefore, the session is
	// reused.
	for _, at := range []time.Duration{0, time.Minute, time.Hour - RefreshBefore - time.Nanosecond} {
		clk.Set(t0.Add(at))
		if again := mustGet(t, s, "run-42"); again.SecretAccessKey.Reveal() != first.SecretAccessKey.Reveal() {
			t.Fatalf("at +%s: Get returned other credentials than the live session's", at)
		}
		if f.callCount() != 1 {
			t.Fatalf("at +%s (refresh point +%s): Get called STS again (%d calls)", at, time.Hour-RefreshBefore, f.callCount())
		}
	}
}

// Once the clock reaches Expires-RefreshBefore, Get renews the session
// with a new call and returns the new credentials, which are then reused
// until their own refresh point.
func TestGetRenewsAtTheRefreshPoint(t *testing.T) {
	s, f, clk := newSessions(t)
	mustGet(t, s, "run-1")
	clk.Set(t0.Add(time.Hour - RefreshBefore))
	renewed := mustGet(t, s, "run-1")
	if f.callCount() != 2 {
		t.Fatalf("%d AssumeRole calls at the refresh point, want 2 (a renewal)", f.callCount())
	}
	if renewed.SecretAccessKey.Reveal() != "secret-of-call-1" || renewed.SessionToken.Reveal() != "token-of-call-1" {
		t.Fatal("the renewal's Get returned the old session's credentials")
	}
	if req := f.call(1); req.SessionName != "runfleet-run-1" || req.Role != role {
		t.Errorf("the renewal called AssumeRole with %+v", req)
	}
	if !renewed.Expires.Equal(t0.Add(2*time.Hour - RefreshBefore)) {
		t.Errorf("renewed session ends %s", renewed.Expires)
	}
	if again := mustGet(t, s, "run-1"); again.SecretAccessKey.Reveal() != renewed.SecretAccessKey.Reveal() || f.callCount() != 2 {
		t.Fatal("the renewed session is not reused")
	}
	// Past the session's end too (edge idle for hours): renewed, never
	// handed out expired.
	clk.Advance(3 * time.Hour)
	if late := mustGet(t, s, "run-1"); late.SecretAccessKey.Reveal() != "secret-of-call-2" || f.callCount() != 3 {
		t.Fatalf("a Get after the session ended: %d calls", f.callCount())
	}
	if s.Len() != 1 {
		t.Errorf("Len %d: renewals must replace the run's session, not add one", s.Len())
	}
}

// Many requests of a run finding its session due at once make one
// AssumeRole call between them, and all get the renewed credentials. Run
// with -race.
func TestConcurrentGetsAtTheRefreshPointMakeOneCall(t *testing.T) {
	for _, phase := range []string{"first use", "renewal"} {
		t.Run(phase, func(t *testing.T) {
			s, f, clk := newSessions(t)
			want := 1
			if phase == "renewal" {
				mustGet(t, s, "run-c")
				clk.Set(t0.Add(time.Hour - RefreshBefore))
				want = 2
			}
			const n = 32
			start := make(chan struct{})
			got := make(chan Credentials, n)
			errs := make(chan error, n)
			// The due call is held until every Get has been made, so the
			// Gets overlap it.
			var made sync.WaitGroup
			made.Add(n)
			f.answer = func(i int, _ Request) (Credentials, error) {
				if i == want-1 {
					made.Wait()
				}
				return f.creds(i), nil
			}
			var wg sync.WaitGroup
			for range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					made.Done()
					c, err := s.Get(context.Background(), "run-c", ref, role)
					if err != nil {
						errs <- err
						return
					}
					got <- c
				}()
			}
			close(start)
			await.Group(t, "the concurrent Gets", &wg)
			close(got)
			close(errs)
			for err := range errs {
				t.Errorf("Get: %v", err)
			}
			if f.callCount() != want {
				t.Fatalf("%d concurrent Gets made %d AssumeRole calls, want %d in all", n, f.callCount(), want)
			}
			wantSecret := fmt.Sprintf("secret-of-call-%d", want-1)
			for c := range got {
				if c.SecretAccessKey.Reveal() != wantSecret {
					t.Fatal("a concurrent Get returned other credentials than the one call's")
				}
			}
		})
	}
}

// Every run has a session of its own, named after it; so has every key of
// a run.
func TestEachRunAndKeyHasItsOwnSession(t *testing.T) {
	s, f, _ := newSessions(t)
	a := mustGet(t, s, "run-a")
	b := mustGet(t, s, "run-b")
	if f.callCount() != 2 || a.SecretAccessKey.Reveal() == b.SecretAccessKey.Reveal() {
		t.Fatalf("two runs: %d calls, shared credentials %v", f.callCount(), a.SecretAccessKey.Reveal() == b.SecretAccessKey.Reveal())
	}
	if f.call(0).SessionName != "runfleet-run-a" || f.call(1).SessionName != "runfleet-run-b" {
		t.Errorf("session names %q, %q", f.call(0).SessionName, f.call(1).SessionName)
	}
	other := policy.KeyRef{Project: "acme", Key: "BACKUP"}
	if _, err := s.Get(context.Background(), "run-a", other, role); err != nil {
		t.Fatal(err)
	}
	if f.callCount() != 3 || s.Len() != 3 {
		t.Fatalf("a second key of run-a: %d calls, %d sessions; want 3 and 3", f.callCount(), s.Len())
	}
	// Each is still reused as its own.
	if mustGet(t, s, "run-a").SecretAccessKey.Reveal() != a.SecretAccessKey.Reveal() || mustGet(t, s, "run-b").SecretAccessKey.Reveal() != b.SecretAccessKey.Reveal() || f.callCount() != 3 {
		t.Fatal("the runs' sessions are not kept apart")
	}
}

// Drop forgets every session of the run and only the run's: a later Get
// for it does not get the dropped session's credentials back (it mints a
// new session, as a retry's registration does), while other runs keep
// theirs.
func TestDropForgetsTheRunsSessions(t *testing.T) {
	s, f, _ := newSessions(t)
	dropped := mustGet(t, s, "run-d")
	if _, err := s.Get(context.Background(), "run-d", policy.KeyRef{Project: "acme", Key: "BACKUP"}, role); err != nil {
		t.Fatal(err)
	}
	kept := mustGet(t, s, "run-k")
	// A run whose id has run-d as a prefix is another run.
	prefixed := mustGet(t, s, "run-d2")
	s.Drop("run-d")
	if s.Len() != 2 {
		t.Fatalf("Len %d after dropping run-d's two sessions of four, want 2", s.Len())
	}
	if mustGet(t, s, "run-k").SecretAccessKey.Reveal() != kept.SecretAccessKey.Reveal() || mustGet(t, s, "run-d2").SecretAccessKey.Reveal() != prefixed.SecretAccessKey.Reveal() {
		t.Fatal("Drop of run-d touched another run's session")
	}
	calls := f.callCount()
	after := mustGet(t, s, "run-d")
	if after.SecretAccessKey.Reveal() == dropped.SecretAccessKey.Reveal() || after.AccessKeyID.Reveal() == dropped.AccessKeyID.Reveal() {
		t.Fatal("a Get after Drop returned the dropped session's credentials")
	}
	if f.callCount() != calls+1 || f.call(calls).SessionName != "runfleet-run-d" {
		t.Fatalf("a Get after Drop made %d calls, want 1 fresh AssumeRole", f.callCount()-calls)
	}
	s.Drop("never-seen") // dropping a run without sessions is fine
	s.Drop("run-d")
	s.Drop("run-d")
	if s.Len() != 2 {
		t.Fatalf("Len %d", s.Len())
	}
}

// A Drop that comes while a Get of the run is minting its session: the
// mint in flight must not hand the dropped run a session (ErrDropped,
// whose doc is exactly this case: "the run's sessions were dropped while
// a call was minting one"), and the Drop is not lost: the next Get mints
// anew.
func TestDropDuringAMintHandsOutNoSession(t *testing.T) {
	s, f, _ := newSessions(t)
	release := make(chan struct{})
	f.entered = make(chan Request, 1)
	f.release = release
	type result struct {
		c   Credentials
		err error
	}
	minting := make(chan result, 1)
	go func() {
		c, err := s.Get(context.Background(), "run-x", ref, role)
		minting <- result{c, err}
	}()
	await.Recv(t, "the Get's AssumeRole call", f.entered)
	// Later calls go straight through; the held one waits for release.
	f.mu.Lock()
	f.entered, f.release = nil, nil
	f.mu.Unlock()
	dropDone := make(chan struct{})
	go func() {
		s.Drop("run-x")
		close(dropDone)
	}()
	// Drop has taken the run's sessions out of the set (and now waits for
	// the mint to end).
	await.Cond(t, 10*time.Second, "Drop to take the session out", func() bool { return s.Len() == 0 })
	close(release)
	r := await.Recv(t, "the minting Get", minting)
	await.Recv(t, "Drop", dropDone)
	if got := !r.c.SecretAccessKey.IsZero(); !errors.Is(r.err, ErrDropped) || got {
		t.Errorf("a Get minting while its run was dropped returned credentials %v, err %v; want none and ErrDropped", got, r.err)
	}
	// The dropped run's next Get is a fresh registration's: a new session.
	calls := f.callCount()
	if c := mustGet(t, s, "run-x"); c.SecretAccessKey.Reveal() != fmt.Sprintf("secret-of-call-%d", calls) {
		t.Fatal("a Get after the Drop did not mint a fresh session")
	}
}

// An AssumeRole error is the Get's, naming the role as the client's does;
// nothing is cached: the next Get calls STS again, and a session that
// fails to renew is refused rather than used to its end.
func TestAssumeRoleErrorIsReturnedAndNothingCached(t *testing.T) {
	s, f, clk := newSessions(t)
	denied := errors.New("sts:AssumeRole of " + role.RoleARN + ": AccessDenied")
	fail := true
	f.answer = func(n int, req Request) (Credentials, error) {
		if fail {
			return Credentials{}, denied
		}
		return f.creds(n), nil
	}
	c, err := s.Get(context.Background(), "run-e", ref, role)
	if !errors.Is(err, denied) {
		t.Fatalf("Get err = %v, want the AssumeRole error", err)
	}
	if !c.SecretAccessKey.IsZero() {
		t.Fatal("a failed Get returned credentials")
	}
	if _, err := s.Get(context.Background(), "run-e", ref, role); !errors.Is(err, denied) || f.callCount() != 2 {
		t.Fatalf("the second Get after a failure: err %v, %d calls; want the error again from a second call", err, f.callCount())
	}
	fail = false
	if c := mustGet(t, s, "run-e"); c.SecretAccessKey.Reveal() != "secret-of-call-2" {
		t.Fatal("a Get after STS recovered did not mint")
	}
	// A failed renewal is an error even though the old session still has
	// RefreshBefore left.
	fail = true
	clk.Set(t0.Add(time.Hour - RefreshBefore))
	if c, err := s.Get(context.Background(), "run-e", ref, role); !errors.Is(err, denied) || !c.SecretAccessKey.IsZero() {
		t.Fatalf("a failed renewal: err %v, credentials returned %v", err, !c.SecretAccessKey.IsZero())
	}
	fail = false
	if c := mustGet(t, s, "run-e"); c.SecretAccessKey.Reveal() != "secret-of-call-4" {
		t.Fatal("a Get after a failed renewal did not renew")
	}
}

// An answer missing the id, the secret or the token is refused with an
// error naming the role and never any credential; it is not cached.
func TestIncompleteCredentialsAreRefused(t *testing.T) {
	full := Credentials{AccessKeyID: secrets.NewValue("ASIAREALREALREAL1234"), SecretAccessKey: secrets.NewValue("realsecretrealsecret"), SessionToken: secrets.NewValue("realtokenrealtoken"), Expires: t0.Add(time.Hour)}
	for name, edit := range map[string]func(*Credentials){
		"no access key id": func(c *Credentials) { c.AccessKeyID = secrets.Value{} },
		"no secret":        func(c *Credentials) { c.SecretAccessKey = secrets.Value{} },
		"no session token": func(c *Credentials) { c.SessionToken = secrets.Value{} },
		"nothing":          func(c *Credentials) { *c = Credentials{} },
	} {
		t.Run(name, func(t *testing.T) {
			s, f, _ := newSessions(t)
			c := full
			edit(&c)
			f.answer = func(n int, _ Request) (Credentials, error) {
				if n == 0 {
					return c, nil
				}
				return full, nil
			}
			got, err := s.Get(context.Background(), "run-i", ref, role)
			if err == nil || !got.SecretAccessKey.IsZero() {
				t.Fatalf("incomplete credentials accepted: err %v", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, role.RoleARN) {
				t.Errorf("error %q does not name the role", msg)
			}
			for _, v := range []string{full.AccessKeyID.Reveal(), full.SecretAccessKey.Reveal(), full.SessionToken.Reveal()} {
				if strings.Contains(msg, v) {
					t.Errorf("error %q holds a credential", msg)
				}
			}
			if got := mustGet(t, s, "run-i"); got.SecretAccessKey.Reveal() != full.SecretAccessKey.Reveal() || f.callCount() != 2 {
				t.Fatalf("the refused answer was cached: %d calls", f.callCount())
			}
		})
	}
}

// SessionName is "runfleet-<run id>" within STS's 64 characters; a longer
// one keeps the id's start and a hash of the whole, so two long ids that
// share a start still name two sessions in CloudTrail.
func TestSessionNameIsCutTo64(t *testing.T) {
	long := strings.Repeat("r", 128) // the longest run id the proxy takes
	hashOf := func(id string) string {
		sum := sha256.Sum256([]byte(id))
		return hex.EncodeToString(sum[:4])
	}
	for _, tc := range []struct{ runID, want string }{
		{"run-1", "runfleet-run-1"},
		{"a.b_c-D", "runfleet-a.b_c-D"},
		{strings.Repeat("x", 55), "runfleet-" + strings.Repeat("x", 55)},
		{strings.Repeat("x", 56), "runfleet-" + strings.Repeat("x", 46) + "-" + hashOf(strings.Repeat("x", 56))},
		{long, "runfleet-" + long[:46] + "-" + hashOf(long)},
	} {
		got := SessionName(tc.runID)
		if got != tc.want || len(got) > 64 {
			t.Errorf("SessionName(%d chars) = %q (%d chars), want %q", len(tc.runID), got, len(got), tc.want)
		}
	}
	if a, b := SessionName(long+"-a"), SessionName(long+"-b"); a == b {
		t.Errorf("two long run ids sharing a start name one session: %q", a)
	}
	s, f, _ := newSessions(t)
	mustGet(t, s, long)
	if n := f.call(0).SessionName; n != SessionName(long) {
		t.Errorf("Get sent RoleSessionName %q (%d chars)", n, len(n))
	}
}

// Credentials never print a field, with any verb, bare or inside another
// value.
func TestCredentialsPrintRedacted(t *testing.T) {
	c := Credentials{AccessKeyID: secrets.NewValue("ASIAPRINTPRINTPRINT1"), SecretAccessKey: secrets.NewValue("printed-secret-value"), SessionToken: secrets.NewValue("printed-token-value"), Expires: t0}
	type holder struct {
		Creds Credentials
		Ptr   *Credentials
	}
	for _, format := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T %v"} {
		for _, v := range []any{c, &c, holder{c, &c}, []Credentials{c}, map[string]Credentials{"k": c}} {
			out := fmt.Sprintf(format, v)
			for _, field := range []string{c.AccessKeyID.Reveal(), c.SecretAccessKey.Reveal(), c.SessionToken.Reveal(), "PRINT", "printed", "2026"} {
				if strings.Contains(out, field) {
					t.Errorf("Sprintf(%q, %T) = %q shows a field", format, v, out)
				}
			}
		}
	}
	if got := fmt.Sprint(c); got != "stssession.Credentials(REDACTED)" {
		t.Errorf("Sprint = %q", got)
	}
	if got := fmt.Sprintf("%v", fmt.Errorf("wrapped: %v", c)); strings.Contains(got, "secret") {
		t.Errorf("in an error: %q", got)
	}
}

// Credentials logged through edge's own logger (slog's JSON handler, as
// edge serve wires it), encoded as JSON, or held in an unexported field of
// something printed, still show no field: "a value never reaches a log by
// accident".
func TestCredentialsNeverReachALog(t *testing.T) {
	c := Credentials{AccessKeyID: secrets.NewValue("ASIALOGGEDLOGGED1234"), SecretAccessKey: secrets.NewValue("logged-secret-value"), SessionToken: secrets.NewValue("logged-token-value"), Expires: t0}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("minted", "creds", c)
	slog.New(slog.NewTextHandler(&buf, nil)).Info("minted", "creds", c)
	b, _ := json.Marshal(c)
	buf.Write(b)
	buf.WriteString(fmt.Sprintf("%+v", struct{ creds Credentials }{c}))
	for _, field := range []string{c.AccessKeyID.Reveal(), c.SecretAccessKey.Reveal(), c.SessionToken.Reveal()} {
		if strings.Contains(buf.String(), field) {
			t.Fatalf("a field reached the output: %s", buf.String())
		}
	}
}
