package fleet

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/shared/store"
)

// TestQueueHashTakesTheQueueOnlyWhenGiven: a request without queue hashes
// as it always did (TestDispatchHashIsStable pins those); with one, the
// timeout and priority are part of it, a timeout by its value whatever its
// spelling, and "0s" (do not wait) is not the same request as none.
func TestQueueHashTakesTheQueueOnlyWhenGiven(t *testing.T) {
	bare := DispatchRequest{Run: runspec.Request{Agent: "shell"}}
	const bareHash = "v1:05350565aa251a39418aa0ec77b1a52c48ac36919e0df1bcb4d8530ce1749ecd"
	if got := bare.Hash(); got != bareHash {
		t.Fatalf("a request without queue hashes %s, want %s as before", got, bareHash)
	}
	with := func(q *QueueRequest) DispatchRequest { r := bare; r.Queue = q; return r }
	thirty := with(&QueueRequest{Timeout: 30 * time.Minute})
	if thirty.Hash() == bareHash {
		t.Fatal("asking to wait must change the hash")
	}
	if got := string(thirty.canonicalJSON()); got != `{"agent":"shell","queue":{"timeout":"30m0s"}}` {
		t.Errorf("canonical form %s", got)
	}
	if with(&QueueRequest{Timeout: 1800 * time.Second}).Hash() != thirty.Hash() {
		t.Error(`"1800s" and "30m" are one timeout`)
	}
	for name, other := range map[string]DispatchRequest{
		"another timeout":  with(&QueueRequest{Timeout: time.Hour}),
		"a priority":       with(&QueueRequest{Timeout: 30 * time.Minute, Priority: 5}),
		"0s, do not wait":  with(&QueueRequest{}),
		"without a queue ": bare,
	} {
		if other.Hash() == thirty.Hash() {
			t.Errorf("%s hashes as a 30m wait", name)
		}
	}
}

// TestQueueWaitRefusesWhatCannotWait: each ask that cannot be honoured is
// a 400 naming its field; Fleet's default never makes a request wait
// that could not (a named host, a repository URL with credentials), and
// "0s" opts out of it.
func TestQueueWaitRefusesWhatCannotWait(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	alice := caller("alice")
	run := runspec.Request{Agent: "shell"}
	credRepo := "https://x-access-token:ghs_secret@github.example/acme/web.git"
	for name, c := range map[string]struct {
		req  DispatchRequest
		want string
	}{
		"negative":     {DispatchRequest{Run: run, Queue: &QueueRequest{Timeout: -time.Second}}, "queue.timeout"},
		"over the max": {DispatchRequest{Run: run, Queue: &QueueRequest{Timeout: 25 * time.Hour}}, "queue.timeout: 25h0m0s is over Fleet's longest wait, 24h0m0s"},
		"priority":     {DispatchRequest{Run: run, Queue: &QueueRequest{Timeout: time.Minute, Priority: 101}}, "queue.priority: 101"},
		"low priority": {DispatchRequest{Run: run, Queue: &QueueRequest{Timeout: time.Minute, Priority: -101}}, "queue.priority"},
		"named host":   {DispatchRequest{Host: "h1", Run: run, Queue: &QueueRequest{Timeout: time.Minute}}, "a run that names its host does not wait"},
		"credentials": {DispatchRequest{Run: runspec.Request{Agent: "shell", Repository: credRepo}, Queue: &QueueRequest{Timeout: time.Minute}},
			"repository is a URL with credentials"},
	} {
		_, err := e.f.queueWait(alice, c.req)
		if !isKind(err, KindInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want 400 with %q", name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "ghs_secret") {
			t.Errorf("%s: the refusal quotes the credential: %v", name, err)
		}
	}
	if q, err := e.f.queueWait(alice, DispatchRequest{Host: "h1", Run: run, Queue: &QueueRequest{}}); q != nil || err != nil {
		t.Errorf(`"0s" with a named host: %+v, %v; want no wait and no refusal`, q, err)
	}

	cfg := e.f.cfg
	cfg.QueueDefault = 10 * time.Minute
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	q, err := f.queueWait(alice, DispatchRequest{Labels: map[string]string{"pool": "a"}, Run: run})
	if err != nil || q == nil || q.Timeout != 10*time.Minute || q.Class != "shell?pool=a" || q.Priority != 0 {
		t.Fatalf("the default: %+v, %v", q, err)
	}
	for name, req := range map[string]DispatchRequest{
		"named host":  {Host: "h1", Run: run},
		"credentials": {Run: runspec.Request{Agent: "shell", Repository: credRepo}},
		"0s":          {Run: run, Queue: &QueueRequest{}},
	} {
		if q, err := f.queueWait(alice, req); q != nil || err != nil {
			t.Errorf("%s under a default: %+v, %v; want no wait and no refusal", name, q, err)
		}
	}
	cfg.QueueDefault = 25 * time.Hour
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "QueueDefault") {
		t.Errorf("a default over the longest wait: %v", err)
	}
}

// TestQueuedRequestKeepsTheDispatchAndScope: what a waiting run keeps is
// the request it is started with and its caller's host scope, in a
// versioned form a later Fleet refuses to misread; a request too large to
// keep is refused before anything is written.
func TestQueuedRequestKeepsTheDispatchAndScope(t *testing.T) {
	req := DispatchRequest{Labels: map[string]string{"pool": "a"}, Run: runspec.Request{Agent: "shell", Prompt: strings.Repeat("make test ", 1000),
		Env: map[string]string{"CI": "1"}, Secrets: []runspec.Secret{{ProjectID: "acme", Key: "K", Domains: []string{"api.example.com"}}}}}
	wr, err := decodeQueued(encodeQueued(caller("alice", "h1", "h2"), req))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(wr.req, req) || wr.admin || !wr.allows("h2") || wr.allows("h3") {
		t.Fatalf("decoded %+v", wr)
	}
	admin, _ := decodeQueued(encodeQueued(store.Caller{OwnerID: "ops", Admin: true}, req))
	if !admin.allows("any") {
		t.Error("an admin's waiting run may use any host")
	}

	if _, err := decodeQueued([]byte(`{"v":2,"run":{"agent":"shell"}}`)); err == nil || !strings.Contains(err.Error(), "version 2") {
		t.Errorf("a later version: %v", err)
	}

	e := newTestEnv(t, 10*time.Second)
	big := DispatchRequest{Run: runspec.Request{Agent: "shell", Prompt: strings.Repeat("x", runspec.MaxPromptBytes),
		Argv: []string{strings.Repeat("y", 100<<10)}}, Queue: &QueueRequest{Timeout: time.Minute}}
	if _, err := e.f.queueWait(caller("alice"), big); !isKind(err, KindInvalid) || !strings.Contains(err.Error(), "leave out queue") {
		t.Errorf("a request too large to keep: %v", err)
	}
}

// TestClassOfRoundTrips: a class names an agent and labels in one string
// without the store's separator, and reads back.
func TestClassOfRoundTrips(t *testing.T) {
	for _, c := range []struct {
		agent  string
		labels map[string]string
		want   string
	}{
		{"shell", nil, "shell"},
		{"claude", map[string]string{"pool": "build", "gpu": "a100"}, "claude?gpu=a100&pool=build"},
		{"odd.agent", map[string]string{"k": "a#b&c=d"}, "odd.agent?k=a%23b%26c%3Dd"},
	} {
		got := ClassOf(c.agent, c.labels)
		if got != c.want || strings.Contains(got, "#") {
			t.Errorf("ClassOf(%s, %v) = %s, want %s", c.agent, c.labels, got, c.want)
		}
		agent, labels, err := ParseClass(got)
		if err != nil || agent != c.agent || (len(c.labels) > 0 || len(labels) > 0) && !reflect.DeepEqual(labels, c.labels) {
			t.Errorf("ParseClass(%s) = %s %v %v", got, agent, labels, err)
		}
	}
}

// TestStartRequestOfAWaitingRun: a waiting run's start carries its token
// for this offer and its wait; a run that never waited carries neither.
func TestStartRequestOfAWaitingRun(t *testing.T) {
	since := t0.Add(-90 * time.Second)
	run := store.Run{FleetRunID: "fr-x", HostID: "h2", Status: store.StatusDispatching, UpdatedAt: t0, Deadline: t0.Add(10 * time.Second),
		Queue: &store.QueueInfo{Class: "shell", Since: since, Until: since.Add(time.Hour), Timeout: time.Hour, Offers: 2}}
	st := startRequest(run, shellRun, Decision{}, nil)
	if st.ClientToken != "fr-x.q2" || st.Queued == nil || !st.Queued.Since.Equal(since) || !st.Queued.StartedAt.Equal(t0) ||
		st.Queued.WaitedMs != 90_000 || st.Queued.HostID != "h2" || st.Queued.Offers != 2 || !st.Deadline.Equal(run.Deadline) {
		t.Fatalf("start of a waiting run: %+v queued %+v", st, st.Queued)
	}
	plain := startRequest(store.Run{FleetRunID: "fr-y", HostID: "h1", Status: store.StatusDispatching}, shellRun, Decision{}, nil)
	if plain.ClientToken != "fr-y" || plain.Queued != nil {
		t.Fatalf("start of a run that never waited: %+v", plain)
	}
}
