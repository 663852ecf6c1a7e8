package fleet

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
)

// TestHostStatusesAreRecordedAsReported: a run records its host's status
// as the host reports it, so the store's names and its idea of terminal
// must be the protocol's.
func TestHostStatusesAreRecordedAsReported(t *testing.T) {
	for wire, record := range map[string]string{
		hostproto.StatusPending: store.StatusPending, hostproto.StatusAdmitted: store.StatusAdmitted,
		hostproto.StatusRunning: store.StatusRunning, hostproto.StatusSucceeded: store.StatusSucceeded,
		hostproto.StatusFailed: store.StatusFailed, hostproto.StatusCanceled: store.StatusCanceled,
	} {
		if wire != record || store.Terminal(record) != hostproto.TerminalStatus(wire) {
			t.Errorf("host status %q: recorded as %q, terminal %v (the host says %v)",
				wire, record, store.Terminal(record), hostproto.TerminalStatus(wire))
		}
	}
}

// TestWireAndRecordsRoundTrip: what a probe keeps of a health answer, and
// a mirrored event, come back from their records as the host sent them.
func TestWireAndRecordsRoundTrip(t *testing.T) {
	at := time.Date(2026, 5, 4, 3, 2, 1, 123456789, time.UTC)
	succ, idle := at.Add(time.Hour), true
	health := hostproto.Health{
		Version: "1.2.3", Agents: []string{"claude", "shell"}, Draining: true, Idle: &idle,
		Features: hostproto.Features{SecretsProxy: true, ExecRequire: true},
		CA:       &hostproto.CAInfo{NotAfter: at, SuccessorNotAfter: &succ},
		Storage:  &hostproto.Storage{FreeBytes: 3 << 30, MinFreeBytes: 1 << 30, Low: true},
		Limits:   &hostproto.Limits{Enforced: hostproto.LimitsCgroup2, MemoryBytes: 2 << 30, Pids: 512, CPU: 1.5, Detail: "d"},
		Load:     &hostproto.Load{Active: 3, MaxConcurrent: 8},
	}
	var p store.Probe
	probeFromWire(&p, health)
	if got := HealthOf(p); !reflect.DeepEqual(got, health) {
		t.Errorf("health through its probe record:\n got  %+v\n want %+v", got, health)
	}

	// An empty limits says nothing: recorded as none, shown as none.
	health.Limits = &hostproto.Limits{}
	p = store.Probe{}
	probeFromWire(&p, health)
	if p.Limits != nil || HealthOf(p).Limits != nil {
		t.Errorf("empty limits recorded as %+v", p.Limits)
	}

	ev := hostproto.Event{Sequence: 7, Type: hostproto.EventOutput, Data: json.RawMessage(`"hello"`), TS: at}
	rec := eventFromWire("r1", ev, at.Add(time.Hour))
	if rec.FleetRunID != "r1" || !rec.ExpiresAt.Equal(at.Add(time.Hour)) || !reflect.DeepEqual(eventToWire(rec), ev) {
		t.Errorf("event through its record: %+v, back %+v", rec, eventToWire(rec))
	}
}
