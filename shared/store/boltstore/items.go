package boltstore

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/runfleet/runfleet/shared/store"
)

// formatVersion is written into every item; an item of another version is
// refused rather than misread.
const formatVersion = 1

// The item types are the stored JSON: field names are a contract with files
// already on disk, so never rename one; add fields, and bump formatVersion
// only with a migration.

type hostItem struct {
	V             int               `json:"v"`
	ID            string            `json:"id"`
	BaseURL       string            `json:"baseUrl"`
	CredentialRef string            `json:"credentialRef"`
	Labels        map[string]string `json:"labels,omitempty"`
	LocalPaths    []string          `json:"localPaths,omitempty"`
	CAPEM         string            `json:"caPem,omitempty"`
	Enabled       bool              `json:"enabled"`
	CreatedAt     time.Time         `json:"createdAt"`
	Probe         *probeItem        `json:"probe,omitempty"`
}

type probeItem struct {
	Status    string       `json:"status"`
	At        time.Time    `json:"at"`
	LatencyMs int64        `json:"latencyMs"`
	Version   string       `json:"version,omitempty"`
	Agents    []string     `json:"agents,omitempty"`
	Features  featuresItem `json:"features"`
	CA        *caItem      `json:"ca,omitempty"`
	Draining  bool         `json:"draining"`
	Idle      *bool        `json:"idle,omitempty"`
	Storage   *storageItem `json:"storage,omitempty"`
	Limits    *limitsItem  `json:"limits,omitempty"`
	Load      *loadItem    `json:"load,omitempty"`
	Detail    string       `json:"detail,omitempty"`
	LedgerKey string       `json:"ledgerKey,omitempty"`
}

type loadItem struct {
	Active        int `json:"active"`
	MaxConcurrent int `json:"maxConcurrent"`
}

type featuresItem struct {
	SecretsProxy bool `json:"secretsProxy"`
	ExecRequire  bool `json:"execRequire"`
}

type caItem struct {
	NotAfter          time.Time  `json:"notAfter"`
	SuccessorNotAfter *time.Time `json:"successorNotAfter,omitempty"`
}

type storageItem struct {
	FreeBytes    int64 `json:"freeBytes"`
	MinFreeBytes int64 `json:"minFreeBytes"`
	Low          bool  `json:"low"`
}

type limitsItem struct {
	Enforced    string  `json:"enforced"`
	MemoryBytes int64   `json:"memoryBytes,omitempty"`
	Pids        int64   `json:"pids,omitempty"`
	CPU         float64 `json:"cpu,omitempty"`
	Detail      string  `json:"detail,omitempty"`
}

type scopeItem struct {
	All bool     `json:"all,omitempty"`
	IDs []string `json:"ids,omitempty"`
}

type callerItem struct {
	V               int       `json:"v"`
	OwnerID         string    `json:"ownerId"`
	TokenHash       string    `json:"tokenHash"`
	Admin           bool      `json:"admin,omitempty"`
	AllowedHosts    scopeItem `json:"allowedHosts"`
	AllowedProjects scopeItem `json:"allowedProjects"`
	CreatedAt       time.Time `json:"createdAt"`
}

type idempotencyItem struct {
	V           int       `json:"v"`
	Key         string    `json:"key"`
	FleetRunID  string    `json:"fleetRunId"`
	RequestHash string    `json:"requestHash"`
	CreatedAt   time.Time `json:"createdAt"`
	// ExpiresAt is epoch seconds, as in DynamoDB.
	ExpiresAt int64 `json:"expiresAt,omitempty"`
}

type runItem struct {
	V                int        `json:"v"`
	FleetRunID       string     `json:"fleetRunId"`
	OwnerID          string     `json:"ownerId"`
	HostID           string     `json:"hostId"`
	ChildRunID       string     `json:"childRunId,omitempty"`
	Status           string     `json:"status"`
	Attempt          int        `json:"attempt,omitempty"`
	ExitCode         *int       `json:"exitCode,omitempty"`
	Reason           string     `json:"reason,omitempty"`
	Detail           string     `json:"detail,omitempty"`
	Agent            string     `json:"agent,omitempty"`
	Repository       string     `json:"repository,omitempty"`
	IdempotencyKey   string     `json:"idempotencyKey,omitempty"`
	RewroteLocalPath bool       `json:"rewroteLocalPath,omitempty"`
	CreatedAt        time.Time  `json:"createdAt"`
	UpdatedAt        time.Time  `json:"updatedAt"`
	Deadline         time.Time  `json:"deadline"`
	EndedAt          *time.Time `json:"endedAt,omitempty"`
	EventCursor      int64      `json:"eventCursor,omitempty"`
	Drained          bool       `json:"drained,omitempty"`
	ExpiresAt        int64      `json:"expiresAt,omitempty"`
	// EventsExpireAfter is in Unix nanoseconds; zero: none.
	EventsExpireAfter int64 `json:"eventsExpireAfter,omitempty"`
	// Brokered is absent in runs stored before it, read as none.
	Brokered []brokeredItem `json:"brokered,omitempty"`
	// Queue is absent for a run that never waited (and every run stored
	// before runs could).
	Queue   *queueItem `json:"queue,omitempty"`
	Version int64      `json:"version"`
}

// queueItem is a run's store.QueueInfo. Timeout is in nanoseconds;
// Request is JSON's base64.
type queueItem struct {
	Class     string     `json:"class"`
	Priority  int        `json:"priority,omitempty"`
	Since     time.Time  `json:"since"`
	Timeout   int64      `json:"timeout"`
	Until     time.Time  `json:"until"`
	Offers    int        `json:"offers,omitempty"`
	Request   []byte     `json:"request,omitempty"`
	StartedAt *time.Time `json:"startedAt,omitempty"`
	StartedOn string     `json:"startedOn,omitempty"`
	Hosts     []string   `json:"hosts,omitempty"`
}

// brokeredItem is one store.BrokeredKey of a run. ValueExpiresAt is the
// value's expiry, not a TTL (hence not epoch seconds); Sealed is JSON's
// base64.
type brokeredItem struct {
	ProjectID      string     `json:"projectId"`
	Key            string     `json:"key"`
	Kind           string     `json:"kind"`
	ValueExpiresAt time.Time  `json:"valueExpiresAt"`
	Sealed         []byte     `json:"sealed,omitempty"`
	RevokedAt      *time.Time `json:"revokedAt,omitempty"`
}

type eventItem struct {
	V          int             `json:"v"`
	FleetRunID string          `json:"fleetRunId"`
	Sequence   int64           `json:"sequence"`
	Type       string          `json:"type"`
	Data       json.RawMessage `json:"data,omitempty"`
	TS         time.Time       `json:"ts"`
	ExpiresAt  int64           `json:"expiresAt,omitempty"`
}

func utc(t time.Time) time.Time { return t.UTC() }

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func cloneStrings(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return append([]string(nil), s...)
}

func cloneLabels(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// expirySeconds stores an ExpiresAt as DynamoDB would: epoch seconds, rounded up.
func expirySeconds(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return store.RoundExpiry(t).Unix()
}

func expiryTime(sec int64) time.Time {
	if sec == 0 {
		return time.Time{}
	}
	return time.Unix(sec, 0).UTC()
}

// clonePtr copies *p, so an item never shares a record's memory.
func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	c := *p
	return &c
}

func toHostItem(h store.Host) hostItem {
	it := hostItem{
		V: formatVersion, ID: h.ID, BaseURL: h.BaseURL, CredentialRef: h.CredentialRef,
		Labels: cloneLabels(h.Labels), LocalPaths: cloneStrings(h.LocalPaths), CAPEM: h.CAPEM,
		Enabled: h.Enabled, CreatedAt: utc(h.CreatedAt),
	}
	if h.Probe != nil {
		p := toProbeItem(*h.Probe)
		it.Probe = &p
	}
	return it
}

func toProbeItem(p store.Probe) probeItem {
	it := probeItem{
		Status: p.Status, At: utc(p.At), LatencyMs: p.LatencyMs, Version: p.Version,
		Agents: cloneStrings(p.Agents), Features: featuresItem(p.Features),
		Draining: p.Draining, Idle: clonePtr(p.Idle), Detail: p.Detail, LedgerKey: p.LedgerKey,
	}
	if p.CA != nil {
		it.CA = &caItem{NotAfter: utc(p.CA.NotAfter), SuccessorNotAfter: utcPtr(p.CA.SuccessorNotAfter)}
	}
	if p.Storage != nil {
		st := storageItem(*p.Storage)
		it.Storage = &st
	}
	if p.Limits != nil {
		l := limitsItem(*p.Limits)
		it.Limits = &l
	}
	if p.Load != nil {
		l := loadItem(*p.Load)
		it.Load = &l
	}
	return it
}

func (it hostItem) record() store.Host {
	h := store.Host{
		ID: it.ID, BaseURL: it.BaseURL, CredentialRef: it.CredentialRef, Labels: it.Labels,
		LocalPaths: it.LocalPaths, CAPEM: it.CAPEM, Enabled: it.Enabled, CreatedAt: utc(it.CreatedAt),
	}
	if it.Probe != nil {
		p := it.Probe.record()
		h.Probe = &p
	}
	return h
}

func (it probeItem) record() store.Probe {
	p := store.Probe{
		Status: it.Status, At: utc(it.At), LatencyMs: it.LatencyMs, Version: it.Version,
		Agents: it.Agents, Features: store.Features(it.Features), Draining: it.Draining, Idle: it.Idle,
		Detail: it.Detail, LedgerKey: it.LedgerKey,
	}
	if it.CA != nil {
		p.CA = &store.CAInfo{NotAfter: utc(it.CA.NotAfter), SuccessorNotAfter: utcPtr(it.CA.SuccessorNotAfter)}
	}
	if it.Storage != nil {
		st := store.Storage(*it.Storage)
		p.Storage = &st
	}
	if it.Limits != nil {
		l := store.Limits(*it.Limits)
		p.Limits = &l
	}
	if it.Load != nil {
		l := store.Load(*it.Load)
		p.Load = &l
	}
	return p
}

func toScopeItem(s store.Scope) scopeItem {
	if s.All {
		return scopeItem{All: true}
	}
	return scopeItem{IDs: cloneStrings(s.IDs)}
}

func (s scopeItem) record() store.Scope { return store.Scope{All: s.All, IDs: s.IDs} }

func toCallerItem(c store.Caller) callerItem {
	return callerItem{
		V: formatVersion, OwnerID: c.OwnerID, TokenHash: c.TokenHash, Admin: c.Admin,
		AllowedHosts: toScopeItem(c.AllowedHosts), AllowedProjects: toScopeItem(c.AllowedProjects),
		CreatedAt: utc(c.CreatedAt),
	}
}

func (it callerItem) record() store.Caller {
	return store.Caller{
		OwnerID: it.OwnerID, TokenHash: it.TokenHash, Admin: it.Admin,
		AllowedHosts: it.AllowedHosts.record(), AllowedProjects: it.AllowedProjects.record(),
		CreatedAt: utc(it.CreatedAt),
	}
}

func toIdempotencyItem(i store.Idempotency) idempotencyItem {
	return idempotencyItem{
		V: formatVersion, Key: i.Key, FleetRunID: i.FleetRunID, RequestHash: i.RequestHash,
		CreatedAt: utc(i.CreatedAt), ExpiresAt: expirySeconds(i.ExpiresAt),
	}
}

func (it idempotencyItem) record() store.Idempotency {
	return store.Idempotency{
		Key: it.Key, FleetRunID: it.FleetRunID, RequestHash: it.RequestHash,
		CreatedAt: utc(it.CreatedAt), ExpiresAt: expiryTime(it.ExpiresAt),
	}
}

func toRunItem(r store.Run) runItem {
	var exit *int
	if r.ExitCode != nil {
		v := *r.ExitCode
		exit = &v
	}
	return runItem{
		V: formatVersion, FleetRunID: r.FleetRunID, OwnerID: r.OwnerID, HostID: r.HostID,
		ChildRunID: r.ChildRunID, Status: r.Status, Attempt: r.Attempt, ExitCode: exit,
		Reason: r.Reason, Detail: r.Detail, Agent: r.Agent, Repository: r.Repository, IdempotencyKey: r.IdempotencyKey,
		RewroteLocalPath: r.RewroteLocalPath, CreatedAt: utc(r.CreatedAt), UpdatedAt: utc(r.UpdatedAt),
		Deadline: utc(r.Deadline), EndedAt: utcPtr(r.EndedAt), EventCursor: r.EventCursor,
		Drained: r.Drained, ExpiresAt: expirySeconds(r.ExpiresAt), EventsExpireAfter: unixNanos(r.EventsExpireAfter),
		Brokered: toBrokeredItems(r.Brokered), Queue: toQueueItem(r.Queue), Version: r.Version,
	}
}

func toQueueItem(q *store.QueueInfo) *queueItem {
	if q == nil {
		return nil
	}
	return &queueItem{
		Class: q.Class, Priority: q.Priority, Since: utc(q.Since), Timeout: int64(q.Timeout), Until: utc(q.Until),
		Offers: q.Offers, Request: cloneBytes(q.Request), StartedAt: utcPtr(q.StartedAt), StartedOn: q.StartedOn,
		Hosts: slices.Clone(q.Hosts),
	}
}

func (it *queueItem) record() *store.QueueInfo {
	if it == nil {
		return nil
	}
	return &store.QueueInfo{
		Class: it.Class, Priority: it.Priority, Since: utc(it.Since), Timeout: time.Duration(it.Timeout), Until: utc(it.Until),
		Offers: it.Offers, Request: cloneBytes(it.Request), StartedAt: utcPtr(it.StartedAt), StartedOn: it.StartedOn,
		Hosts: slices.Clone(it.Hosts),
	}
}

func toBrokeredItems(keys []store.BrokeredKey) []brokeredItem {
	if len(keys) == 0 {
		return nil
	}
	out := make([]brokeredItem, len(keys))
	for i, k := range keys {
		out[i] = brokeredItem{
			ProjectID: k.ProjectID, Key: k.Key, Kind: k.Kind, ValueExpiresAt: utc(k.ExpiresAt),
			Sealed: cloneBytes(k.Sealed), RevokedAt: utcPtr(k.RevokedAt),
		}
	}
	return out
}

func brokeredRecords(items []brokeredItem) []store.BrokeredKey {
	if len(items) == 0 {
		return nil
	}
	out := make([]store.BrokeredKey, len(items))
	for i, it := range items {
		out[i] = store.BrokeredKey{
			ProjectID: it.ProjectID, Key: it.Key, Kind: it.Kind, ExpiresAt: utc(it.ValueExpiresAt),
			Sealed: cloneBytes(it.Sealed), RevokedAt: utcPtr(it.RevokedAt),
		}
	}
	return out
}

func (it runItem) record() store.Run {
	return store.Run{
		FleetRunID: it.FleetRunID, OwnerID: it.OwnerID, HostID: it.HostID, ChildRunID: it.ChildRunID,
		Status: it.Status, Attempt: it.Attempt, ExitCode: it.ExitCode, Reason: it.Reason, Detail: it.Detail,
		Agent: it.Agent, Repository: it.Repository, IdempotencyKey: it.IdempotencyKey, RewroteLocalPath: it.RewroteLocalPath,
		CreatedAt: utc(it.CreatedAt), UpdatedAt: utc(it.UpdatedAt), Deadline: utc(it.Deadline),
		EndedAt: utcPtr(it.EndedAt), EventCursor: it.EventCursor, Drained: it.Drained,
		ExpiresAt: expiryTime(it.ExpiresAt), EventsExpireAfter: fromUnixNanos(it.EventsExpireAfter),
		Brokered: brokeredRecords(it.Brokered), Queue: it.Queue.record(), Version: it.Version,
	}
}

func unixNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func toEventItem(e store.Event) eventItem {
	return eventItem{
		V: formatVersion, FleetRunID: e.FleetRunID, Sequence: e.Sequence, Type: e.Type,
		Data: append(json.RawMessage(nil), e.Data...), TS: utc(e.TS), ExpiresAt: expirySeconds(e.ExpiresAt),
	}
}

func (it eventItem) record() store.Event {
	return store.Event{
		FleetRunID: it.FleetRunID, Sequence: it.Sequence, Type: it.Type, Data: it.Data, TS: utc(it.TS),
		ExpiresAt: expiryTime(it.ExpiresAt),
	}
}

// versioned is every item: its format version is checked on decode.
type versioned interface {
	version() int
}

func (it hostItem) version() int        { return it.V }
func (it callerItem) version() int      { return it.V }
func (it idempotencyItem) version() int { return it.V }
func (it runItem) version() int         { return it.V }
func (it eventItem) version() int       { return it.V }

func encode(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding item: %w", err)
	}
	return b, nil
}

func decode[T versioned](b []byte) (T, error) {
	var it T
	if err := json.Unmarshal(b, &it); err != nil {
		return it, fmt.Errorf("decoding item: %w", err)
	}
	if it.version() != formatVersion {
		return it, fmt.Errorf("decoding item: format version %d, want %d", it.version(), formatVersion)
	}
	return it, nil
}

// orderKey sorts by CreatedAt then run id in byte order. Flipping the sign
// bit makes the two's-complement nanoseconds sort as unsigned bytes.
func orderKey(createdAt time.Time, fleetRunID string) []byte {
	k := make([]byte, 8, 8+len(fleetRunID))
	binary.BigEndian.PutUint64(k, uint64(createdAt.UnixNano())^(1<<63))
	return append(k, fleetRunID...)
}

func sequenceKey(seq int64) []byte {
	k := make([]byte, 8)
	binary.BigEndian.PutUint64(k, uint64(seq))
	return k
}
