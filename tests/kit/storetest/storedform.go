package storetest

import (
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/store"
)

// StoredFormAt is the time the stored-form records are built from, and
// a fake clock's now before which none of them expires.
var StoredFormAt = time.Date(2026, 5, 4, 3, 2, 1, 123456789, time.UTC)

// StoredFormHost is a host with every probe field set. Each store's test
// pins its stored form byte for byte (dynamostore: the attribute map;
// boltstore: the JSON), written in the form items had before the records
// got types of their own, so items already stored read back the same and
// no data migration is needed.
func StoredFormHost() store.Host {
	at := StoredFormAt
	idle := true
	p := probe(at, store.ProbeOK)
	p.At = at.Add(time.Second)
	p.Idle = &idle
	p.Storage.Low = true
	p.Limits.Enforced, p.Limits.Detail = "cgroup2", "per task"
	h := host("h-stored", at)
	h.Probe = &p
	return h
}

// StoredFormEvent is an event, pinned like StoredFormHost.
func StoredFormEvent() store.Event {
	e := event("r-stored", 7, StoredFormAt, "hello")
	e.ExpiresAt = StoredFormAt.Add(30 * 24 * time.Hour).Truncate(time.Second)
	return e
}

// SameJSON fails t unless got and want have the same JSON form (sameJSON),
// for the stored-form tests of each store.
func SameJSON(t *testing.T, what string, got, want any) {
	t.Helper()
	sameJSON(t, what, got, want)
}

// StoredFormEgress is a run's ledger mirror, pinned like StoredFormHost:
// its records (from seq 7) and its head as PutEgressHead stores it from
// Version 0.
func StoredFormEgress() (records []store.EgressRecord, head store.EgressHead) {
	exp := StoredFormEvent().ExpiresAt
	records = rawRecords(7, `{"seq":7,"path":"/a?q=*"}`, `{"seq":8}`)
	head = store.EgressHead{
		FleetRunID: "r-stored", Version: 1, Cursor: 8, Summary: []byte(`{"requests":8}`), Seal: []byte(`{"count":8}`),
		HostID: "h-stored", Alerts: 1, FirstAlertAt: StoredFormAt, UpdatedAt: StoredFormAt, ExpiresAt: exp,
	}
	return records, head
}

// StoredFormRun is a live run with brokered keys (a GitHub token revoked
// and minted again, an OAuth2 value), pinned like StoredFormHost from the
// form runs had when they gained them.
func StoredFormRun() store.Run {
	at := StoredFormAt
	revoked := at.Add(2 * time.Minute)
	return store.Run{
		FleetRunID: "r-stored", OwnerID: "alice", HostID: "h-stored", ChildRunID: "child-stored",
		Status: store.StatusRunning, Attempt: 1, Agent: "shell", Repository: "acme/app", IdempotencyKey: "k-stored",
		CreatedAt: at, UpdatedAt: at.Add(time.Minute), Deadline: at.Add(30 * time.Second), EventCursor: 7,
		EventsExpireAfter: StoredFormEvent().ExpiresAt,
		Brokered: []store.BrokeredKey{
			{ProjectID: "acme", Key: "GITHUB_TOKEN", Kind: "githubApp", ExpiresAt: at.Add(time.Hour), Sealed: []byte{0, 1, 0xfe, 0xff}, RevokedAt: &revoked},
			{ProjectID: "acme", Key: "GOOGLE_TOKEN", Kind: "oauth2", ExpiresAt: at.Add(50 * time.Minute)},
		},
		Version: 1,
	}
}

// StoredFormBrokerState is a credential's state after its first refresh,
// its lease held, pinned like StoredFormHost: a lease taken and a commit
// by another (which leaves the lease as it is), both at StoredFormAt.
func StoredFormBrokerState() store.BrokerState {
	at := StoredFormAt
	return store.BrokerState{
		ID: "acme/GOOGLE_TOKEN", Generation: 1,
		SealedRefreshToken: []byte{0, 1, 2, 0xff}, SealedAccessToken: []byte{0xfe, 0, 3},
		AccessExpiresAt: at.Add(time.Hour), Seed: "seed-fingerprint",
		LeaseHolder: "holder-stored", LeaseExpiresAt: at.Add(5 * time.Minute), UpdatedAt: at,
	}
}

// StoredFormQueuedRun is a run waiting for capacity (bob's, so that it
// stays out of StoredFormRun's owner listing), after one refused offer,
// pinned like StoredFormHost from the form runs had when they could
// first wait.
func StoredFormQueuedRun() store.Run {
	at := StoredFormAt
	return store.Run{
		FleetRunID: "r-queued", OwnerID: "bob", Status: store.StatusQueued, Agent: "claude", IdempotencyKey: "k-queued",
		CreatedAt: at, UpdatedAt: at.Add(time.Minute),
		Queue: &store.QueueInfo{
			Class: "claude?pool=build", Priority: 5, Since: at, Timeout: 30 * time.Minute, Until: at.Add(30 * time.Minute),
			Offers: 1, Request: []byte(`{"agent":"claude","prompt":"hi"}`),
		},
		Version: 1,
	}
}

// StoredFormWaitedRun is a run that waited, then started on a host:
// its wait kept, its request dropped, out of the queue; pinned like
// StoredFormQueuedRun.
func StoredFormWaitedRun() store.Run {
	at := StoredFormAt
	startedAt := at.Add(2 * time.Minute)
	return store.Run{
		FleetRunID: "r-waited", OwnerID: "bob", HostID: "h-stored", ChildRunID: "child-waited", Status: store.StatusRunning,
		Attempt: 1, Agent: "claude", CreatedAt: at, UpdatedAt: startedAt, Deadline: at.Add(150 * time.Second),
		Queue: &store.QueueInfo{
			Class: "claude", Priority: -3, Since: at, Timeout: time.Hour, Until: at.Add(time.Hour),
			StartedAt: &startedAt, StartedOn: "h-stored",
		},
		Version: 1,
	}
}

// PutStoredForm writes StoredFormRun, StoredFormQueuedRun,
// StoredFormWaitedRun and StoredFormBrokerState through s, on a store
// whose clock reads StoredFormAt, for a stored-form test to pin what s
// wrote.
func PutStoredForm(t *testing.T, s interface {
	store.Runs
	store.BrokerStates
}) {
	t.Helper()
	noErr(t, "CreateRun", s.CreateRun(bg, StoredFormRun()))
	noErr(t, "CreateRun queued", s.CreateRun(bg, StoredFormQueuedRun()))
	noErr(t, "CreateRun waited", s.CreateRun(bg, StoredFormWaitedRun()))
	want := StoredFormBrokerState()
	st, err := s.AcquireBrokerLease(bg, want.ID, want.LeaseHolder, want.LeaseExpiresAt)
	noErr(t, "AcquireBrokerLease", err)
	st.SealedRefreshToken, st.SealedAccessToken, st.AccessExpiresAt, st.Seed = want.SealedRefreshToken, want.SealedAccessToken, want.AccessExpiresAt, want.Seed
	st.LeaseHolder = "" // another's commit: the lease stays
	st, err = s.CommitBrokerState(bg, st)
	noErr(t, "CommitBrokerState", err)
	sameJSON(t, "the stored-form broker state committed", st, want)
}
