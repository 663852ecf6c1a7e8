package fleet

import (
	"encoding/json"
	"time"

	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
)

// The host protocol's types are the wire's and the store keeps records of
// its own, so a protocol change is never a data migration. This
// file is the one place a wire type becomes a record and back; a run's
// state is applyHostRun's (dispatch.go).

// eventFromWire is the record of a host's event, mirrored for the run
// fleetRunID to expire at expires.
func eventFromWire(fleetRunID string, e hostproto.Event, expires time.Time) store.Event {
	return store.Event{FleetRunID: fleetRunID, Sequence: e.Sequence, Type: e.Type, Data: e.Data, TS: e.TS, ExpiresAt: expires}
}

// eventToWire is a mirrored event as its host sent it: the shape the
// events answer and the stream send (DESIGN.md).
func eventToWire(e store.Event) hostproto.Event {
	return hostproto.Event{Sequence: e.Sequence, Type: e.Type, Data: e.Data, TS: e.TS}
}

// egressRecordFromWire is the record of a host's ledger record: its JSON
// as egress.Record writes it, hash included. The canonical form the chain
// hashes is that JSON without the hash, so the record reads back as the
// very record the host hashed (egressRecordToWire).
func egressRecordFromWire(r egress.Record) (store.EgressRecord, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return store.EgressRecord{}, err
	}
	return store.EgressRecord{Seq: r.Seq, Data: data}, nil
}

// egressRecordToWire is a mirrored ledger record as its host sent it: the
// shape the egress answer and the stream show, and Verify rehashes. A
// record whose stored Seq differs from its own was moved in the store:
// the record's own is kept, for verification to find out of place.
func egressRecordToWire(r store.EgressRecord) (egress.Record, error) {
	var out egress.Record
	if err := json.Unmarshal(r.Data, &out); err != nil {
		return egress.Record{}, err
	}
	return out, nil
}

// probeFromWire records on p what a probe keeps of a host's health answer.
func probeFromWire(p *store.Probe, h hostproto.Health) {
	p.Version = h.Version
	p.Agents = h.Agents
	p.Features = store.Features{SecretsProxy: h.Features.SecretsProxy, ExecRequire: h.Features.ExecRequire}
	if ca := h.CA; ca != nil {
		p.CA = &store.CAInfo{NotAfter: ca.NotAfter, SuccessorNotAfter: ca.SuccessorNotAfter}
	}
	p.Draining = h.Draining
	p.Idle = h.Idle
	p.LedgerKey = h.LedgerKey
	if l := h.Load; l != nil {
		p.Load = &store.Load{Active: l.Active, MaxConcurrent: l.MaxConcurrent}
	}
	if st := h.Storage; st != nil {
		p.Storage = &store.Storage{FreeBytes: st.FreeBytes, MinFreeBytes: st.MinFreeBytes, Low: st.Low}
	}
	// An empty limits says nothing; nil is how both stores keep that.
	if l := h.Limits; l != nil && *l != (hostproto.Limits{}) {
		p.Limits = &store.Limits{Enforced: l.Enforced, MemoryBytes: l.MemoryBytes, Pids: l.Pids, CPU: l.CPU, Detail: l.Detail}
	}
}

// HealthOf is what a probe recorded of the host's health answer, in the
// protocol's shapes: the Fleet API shows a probe's features, CA, storage,
// limits and ledger key as the host reported them. OK and what a probe does not keep
// (InsecureSameUser, EgressConfined) are left zero.
func HealthOf(p store.Probe) hostproto.Health {
	h := hostproto.Health{
		Version: p.Version, Agents: p.Agents, Draining: p.Draining, Idle: p.Idle, LedgerKey: p.LedgerKey,
		Features: hostproto.Features{SecretsProxy: p.Features.SecretsProxy, ExecRequire: p.Features.ExecRequire},
	}
	if ca := p.CA; ca != nil {
		h.CA = &hostproto.CAInfo{NotAfter: ca.NotAfter, SuccessorNotAfter: ca.SuccessorNotAfter}
	}
	if st := p.Storage; st != nil {
		h.Storage = &hostproto.Storage{FreeBytes: st.FreeBytes, MinFreeBytes: st.MinFreeBytes, Low: st.Low}
	}
	if l := p.Limits; l != nil {
		h.Limits = &hostproto.Limits{Enforced: l.Enforced, MemoryBytes: l.MemoryBytes, Pids: l.Pids, CPU: l.CPU, Detail: l.Detail}
	}
	if l := p.Load; l != nil {
		h.Load = &hostproto.Load{Active: l.Active, MaxConcurrent: l.MaxConcurrent}
	}
	return h
}

// brokeredValues are minted values as the host's start and credentials
// requests carry them.
func brokeredValues(values []mintedValue) []hostproto.BrokeredValue {
	if len(values) == 0 {
		return nil
	}
	out := make([]hostproto.BrokeredValue, len(values))
	for i, v := range values {
		out[i] = hostproto.BrokeredValue{ProjectID: v.projectID, Key: v.key, Value: v.minted.Value, ExpiresAt: v.minted.ExpiresAt.UTC()}
	}
	return out
}

// brokeredKeyOf is what a run records of a value minted for it: never the
// value, only its expiry and, for the run's own token, its sealed form.
func brokeredKeyOf(v mintedValue) store.BrokeredKey {
	return store.BrokeredKey{ProjectID: v.projectID, Key: v.key, Kind: v.kind, ExpiresAt: v.minted.ExpiresAt.UTC(), Sealed: v.minted.Sealed}
}

// brokeredKeysOf are the records of values minted at dispatch; nil when
// none.
func brokeredKeysOf(values []mintedValue) []store.BrokeredKey {
	if len(values) == 0 {
		return nil
	}
	out := make([]store.BrokeredKey, len(values))
	for i, v := range values {
		out[i] = brokeredKeyOf(v)
	}
	return out
}
