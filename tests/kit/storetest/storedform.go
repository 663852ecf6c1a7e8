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
