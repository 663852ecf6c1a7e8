package dynamostore

import (
	"bytes"
	"compress/flate"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/store"
)

// formatVersion is written into every item as "v". An item of another
// version is refused rather than misread; bump it only with a migration.
const formatVersion = 1

// Attribute names beyond the keys (tables.go). They are a contract with
// items already stored: never rename one.
const (
	attrVersionFormat = "v"

	attrBaseURL       = "baseUrl"
	attrCredentialRef = "credentialRef"
	attrLabels        = "labels"
	attrLocalPaths    = "localPaths"
	attrCAPEM         = "caPem"
	attrEnabled       = "enabled"
	attrProbe         = "probe"

	attrStatus            = "status"
	attrAt                = "at"
	attrLatencyMs         = "latencyMs"
	attrHostVersion       = "version"
	attrAgents            = "agents"
	attrFeatures          = "features"
	attrSecretsProxy      = "secretsProxy"
	attrExecRequire       = "execRequire"
	attrCA                = "ca"
	attrNotAfter          = "notAfter"
	attrSuccessorNotAfter = "successorNotAfter"
	attrDraining          = "draining"
	attrIdle              = "idle"
	attrDetail            = "detail"
	attrStorage           = "storage"
	attrFreeBytes         = "freeBytes"
	attrMinFreeBytes      = "minFreeBytes"
	attrLow               = "low"
	attrLimits            = "limits"
	attrEnforced          = "enforced"
	attrMemoryBytes       = "memoryBytes"
	attrPids              = "pids"
	attrCPU               = "cpu"
	attrLoad              = "load"
	attrActive            = "active"
	attrMaxConcurrent     = "maxConcurrent"
	attrLedgerKey         = "ledgerKey"

	attrTokenHash       = "tokenHash"
	attrAdmin           = "admin"
	attrAllowedHosts    = "allowedHosts"
	attrAllowedProjects = "allowedProjects"

	attrRequestHash = "requestHash"

	attrChildRunID        = "childRunId"
	attrAttempt           = "attempt"
	attrExitCode          = "exitCode"
	attrReason            = "reason"
	attrAgent             = "agent"
	attrRepository        = "repository"
	attrIdempotencyKey    = "idempotencyKey"
	attrRewroteLocalPath  = "rewroteLocalPath"
	attrUpdatedAt         = "updatedAt"
	attrDeadline          = "deadline"
	attrEndedAt           = "endedAt"
	attrEventCursor       = "eventCursor"
	attrEventsExpireAfter = "eventsExpireAfter"
	attrDrained           = "drained"
	attrRunVersion        = "version"
	// attrBrokered is a run's brokered keys (L of M, attrBrokered*
	// inside); absent: none, and every run stored before it.
	attrBrokered = "brokered"

	// A brokered key's, inside attrBrokered. Its expiry is
	// "valueExpiresAt", in nanoseconds: not the TTL's expiresAt.
	attrBrokeredProjectID = "projectId"
	attrBrokeredKey       = "key"
	attrBrokeredKind      = "kind"
	attrBrokeredExpiresAt = "valueExpiresAt"
	attrBrokeredSealed    = "sealed"
	attrBrokeredRevokedAt = "revokedAt"

	// attrQueue is a run's store.QueueInfo (M, attrQueue* inside);
	// absent: it never waited, and every run stored before runs could.
	// Times are nanoseconds, the timeout too; the request B, raw DEFLATE
	// of the bytes (a dispatch's JSON shrinks by a fifth to a third, what
	// keeps a waiting run with a brokered key under 1 KB: 1 WCU a write).
	attrQueue          = "queue"
	attrQueueClass     = "class"
	attrQueuePriority  = "priority"
	attrQueueSince     = "since"
	attrQueueTimeout   = "timeout"
	attrQueueUntil     = "until"
	attrQueueOffers    = "offers"
	attrQueueRequest   = "request"
	attrQueueStartedAt = "startedAt"
	attrQueueStartedOn = "startedOn"
	attrQueueHostIDs   = "hosts" // comma-separated

	attrType = "type"
	attrData = "data"
	attrTS   = "ts"

	// The egress table's: a chunk's first seq (its key is its last), and
	// a head's.
	attrFirst        = "first"
	attrHeadVersion  = "version"
	attrCursor       = "cursor"
	attrSummary      = "summary"
	attrSeal         = "seal"
	attrAlerts       = "alerts"
	attrFirstAlertAt = "firstAlertAt"

	// attrWriteToken is the token of the call that last wrote the item
	// (ownwrites.go): hosts, callers, idempotency items, runs, egress
	// heads and broker states.
	attrWriteToken = "writeToken"
)

// Caller item key prefixes, and the scope value that means "every id".
const (
	ownerPrefix = "owner#"
	tokenPrefix = "token#"
	scopeAll    = "*"
)

// Times are epoch nanoseconds (N), except expiresAt (epoch seconds, the TTL
// attribute) and the runs' createdAt index key (createdKey).
func (it item) putTime(name string, t time.Time) {
	if !t.IsZero() {
		it.putNAlways(name, t.UnixNano())
	}
}

func (r *reader) time(name string) time.Time {
	if !r.has(name) {
		return time.Time{}
	}
	return time.Unix(0, r.n(name)).UTC()
}

func (r *reader) timePtr(name string) *time.Time {
	if !r.has(name) {
		return nil
	}
	t := r.time(name)
	return &t
}

func (it item) putExpiry(t time.Time) {
	if !t.IsZero() {
		it.putNAlways(attrExpiresAt, store.RoundExpiry(t).Unix())
	}
}

func (r *reader) expiry() time.Time {
	if !r.has(attrExpiresAt) {
		return time.Time{}
	}
	return time.Unix(r.n(attrExpiresAt), 0).UTC()
}

// createdLayout is fixed-width, so the strings sort as the times do.
const createdLayout = "2006-01-02T15:04:05.000000000Z"

// createdKey is the runs' index sort key: creation time, then run id.
func createdKey(t time.Time, fleetRunID string) string {
	return t.UTC().Format(createdLayout) + "#" + fleetRunID
}

func parseCreatedKey(k string) (time.Time, string, error) {
	ts, id, ok := strings.Cut(k, "#")
	if !ok {
		return time.Time{}, "", fmt.Errorf("createdAt %q: no run id", k)
	}
	t, err := time.Parse(createdLayout, ts)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("createdAt %q: %w", k, err)
	}
	return t.UTC(), id, nil
}

// --- hosts -----------------------------------------------------------------

func hostItem(h store.Host) item {
	it := item{}
	it.putS(attrID, h.ID)
	it.putNAlways(attrVersionFormat, formatVersion)
	it.putS(attrBaseURL, h.BaseURL)
	it.putS(attrCredentialRef, h.CredentialRef)
	it.putStringMap(attrLabels, h.Labels)
	it.putStrings(attrLocalPaths, h.LocalPaths)
	it.putS(attrCAPEM, h.CAPEM)
	it.putBoolAlways(attrEnabled, h.Enabled)
	it.putTime(attrCreatedAt, h.CreatedAt)
	if h.Probe != nil {
		it.putMap(attrProbe, probeItem(*h.Probe))
	}
	return it
}

func probeItem(p store.Probe) item {
	it := item{}
	it.putS(attrStatus, p.Status)
	it.putTime(attrAt, p.At)
	it.putNAlways(attrLatencyMs, p.LatencyMs)
	it.putS(attrHostVersion, p.Version)
	it.putStrings(attrAgents, p.Agents)
	f := item{}
	f.putBoolAlways(attrSecretsProxy, p.Features.SecretsProxy)
	f.putBoolAlways(attrExecRequire, p.Features.ExecRequire)
	it.putMap(attrFeatures, f)
	if p.CA != nil {
		ca := item{}
		ca.putTime(attrNotAfter, p.CA.NotAfter)
		if p.CA.SuccessorNotAfter != nil {
			ca.putTime(attrSuccessorNotAfter, *p.CA.SuccessorNotAfter)
		}
		it[attrCA] = &types.AttributeValueMemberM{Value: ca}
	}
	it.putBoolAlways(attrDraining, p.Draining)
	if p.Idle != nil {
		it.putBoolAlways(attrIdle, *p.Idle)
	}
	if p.Storage != nil {
		// low always: a Storage of zeros is kept, not dropped as an empty map.
		st := item{}
		st.putN(attrFreeBytes, p.Storage.FreeBytes)
		st.putN(attrMinFreeBytes, p.Storage.MinFreeBytes)
		st.putBoolAlways(attrLow, p.Storage.Low)
		it.putMap(attrStorage, st)
	}
	if p.Limits != nil {
		l := item{}
		l.putS(attrEnforced, p.Limits.Enforced)
		l.putN(attrMemoryBytes, p.Limits.MemoryBytes)
		l.putN(attrPids, p.Limits.Pids)
		l.putFloat(attrCPU, p.Limits.CPU)
		l.putS(attrDetail, p.Limits.Detail)
		it.putMap(attrLimits, l)
	}
	if p.Load != nil {
		// Both always: a Load of zeros (an idle host that admits nothing)
		// is kept, not dropped as an empty map.
		l := item{}
		l.putNAlways(attrActive, int64(p.Load.Active))
		l.putNAlways(attrMaxConcurrent, int64(p.Load.MaxConcurrent))
		it.putMap(attrLoad, l)
	}
	it.putS(attrDetail, p.Detail)
	it.putS(attrLedgerKey, p.LedgerKey)
	return it
}

func hostFromItem(it item) (store.Host, error) {
	r := &reader{it: it}
	r.checkVersion()
	h := store.Host{
		ID: r.s(attrID), BaseURL: r.s(attrBaseURL), CredentialRef: r.s(attrCredentialRef),
		Labels: r.stringMap(attrLabels), LocalPaths: r.strings(attrLocalPaths), CAPEM: r.s(attrCAPEM),
		Enabled: r.bool(attrEnabled), CreatedAt: r.time(attrCreatedAt),
	}
	p := r.sub(attrProbe)
	var f, ca, st, l, ld *reader
	if p != nil {
		probe := store.Probe{
			Status: p.s(attrStatus), At: p.time(attrAt), LatencyMs: p.n(attrLatencyMs),
			Version: p.s(attrHostVersion), Agents: p.strings(attrAgents),
			Draining: p.bool(attrDraining), Detail: p.s(attrDetail), LedgerKey: p.s(attrLedgerKey),
		}
		if p.has(attrIdle) {
			idle := p.bool(attrIdle)
			probe.Idle = &idle
		}
		if f = p.sub(attrFeatures); f != nil {
			probe.Features = store.Features{SecretsProxy: f.bool(attrSecretsProxy), ExecRequire: f.bool(attrExecRequire)}
		}
		if ca = p.sub(attrCA); ca != nil {
			probe.CA = &store.CAInfo{NotAfter: ca.time(attrNotAfter), SuccessorNotAfter: ca.timePtr(attrSuccessorNotAfter)}
		}
		if st = p.sub(attrStorage); st != nil {
			probe.Storage = &store.Storage{FreeBytes: st.n(attrFreeBytes), MinFreeBytes: st.n(attrMinFreeBytes), Low: st.bool(attrLow)}
		}
		if l = p.sub(attrLimits); l != nil {
			probe.Limits = &store.Limits{
				Enforced: l.s(attrEnforced), MemoryBytes: l.n(attrMemoryBytes), Pids: l.n(attrPids),
				CPU: l.float(attrCPU), Detail: l.s(attrDetail),
			}
		}
		if ld = p.sub(attrLoad); ld != nil {
			probe.Load = &store.Load{Active: int(ld.n(attrActive)), MaxConcurrent: int(ld.n(attrMaxConcurrent))}
		}
		h.Probe = &probe
	}
	if err := r.done(p, f, ca, st, l, ld); err != nil {
		return store.Host{}, fmt.Errorf("host item: %w", err)
	}
	return h, nil
}

// --- callers ---------------------------------------------------------------

func putScope(it item, name string, s store.Scope) {
	if s.All {
		it.putS(name, scopeAll)
		return
	}
	it.putStrings(name, s.IDs)
}

// scope reads "*" (every id) or a list of ids; absent is no id at all.
func (r *reader) scope(name string) store.Scope {
	if s, ok := r.it[name].(*types.AttributeValueMemberS); ok {
		if s.Value != scopeAll {
			r.fail(name, `"*" or L`, s)
		}
		return store.Scope{All: true}
	}
	return store.Scope{IDs: r.strings(name)}
}

// callerItem is the body of both caller items; id says which one it is.
func callerItem(id string, c store.Caller) item {
	it := item{}
	it.putS(attrID, id)
	it.putNAlways(attrVersionFormat, formatVersion)
	it.putS(attrOwnerID, c.OwnerID)
	it.putS(attrTokenHash, c.TokenHash)
	it.putBool(attrAdmin, c.Admin)
	putScope(it, attrAllowedHosts, c.AllowedHosts)
	putScope(it, attrAllowedProjects, c.AllowedProjects)
	it.putTime(attrCreatedAt, c.CreatedAt)
	return it
}

func callerFromItem(it item) (store.Caller, error) {
	r := &reader{it: it}
	r.checkVersion()
	c := store.Caller{
		OwnerID: r.s(attrOwnerID), TokenHash: r.s(attrTokenHash), Admin: r.bool(attrAdmin),
		AllowedHosts: r.scope(attrAllowedHosts), AllowedProjects: r.scope(attrAllowedProjects),
		CreatedAt: r.time(attrCreatedAt),
	}
	if err := r.done(); err != nil {
		return store.Caller{}, fmt.Errorf("caller item: %w", err)
	}
	return c, nil
}

// --- idempotency -----------------------------------------------------------

func idempotencyItem(i store.Idempotency) item {
	it := item{}
	it.putS(attrID, i.Key)
	it.putNAlways(attrVersionFormat, formatVersion)
	it.putS(attrFleetRunID, i.FleetRunID)
	it.putS(attrRequestHash, i.RequestHash)
	it.putTime(attrCreatedAt, i.CreatedAt)
	it.putExpiry(i.ExpiresAt)
	return it
}

func idempotencyFromItem(it item) (store.Idempotency, error) {
	r := &reader{it: it}
	r.checkVersion()
	i := store.Idempotency{
		Key: r.s(attrID), FleetRunID: r.s(attrFleetRunID), RequestHash: r.s(attrRequestHash),
		CreatedAt: r.time(attrCreatedAt), ExpiresAt: r.expiry(),
	}
	if err := r.done(); err != nil {
		return store.Idempotency{}, fmt.Errorf("idempotency item: %w", err)
	}
	return i, nil
}

// --- runs ------------------------------------------------------------------

// runItem is the whole stored run, index keys included; shard is its "all"
// index partition (allShardOf).
func runItem(r store.Run, shard string) item {
	it := item{}
	it.putS(attrFleetRunID, r.FleetRunID)
	it.putNAlways(attrVersionFormat, formatVersion)
	it.putS(attrOwnerID, r.OwnerID)
	it.putS(attrHostID, r.HostID)
	it.putS(attrCreatedAt, createdKey(r.CreatedAt, r.FleetRunID))
	it.putS(attrIdempotencyKey, r.IdempotencyKey)
	it.putS(attrRepository, r.Repository)
	for k, v := range runMutable(r, shard) {
		it[k] = v
	}
	return it
}

// runMutable holds the attributes UpdateRun may change (everything but the
// keys and the fields fixed at creation). An attribute missing here is
// removed by an update.
func runMutable(r store.Run, shard string) item {
	it := item{}
	it.putS(attrChildRunID, r.ChildRunID)
	it.putS(attrStatus, r.Status)
	it.putN(attrAttempt, int64(r.Attempt))
	if r.ExitCode != nil {
		it.putNAlways(attrExitCode, int64(*r.ExitCode))
	}
	it.putS(attrReason, r.Reason)
	it.putS(attrDetail, r.Detail)
	it.putS(attrAgent, r.Agent)
	it.putBool(attrRewroteLocalPath, r.RewroteLocalPath)
	it.putTime(attrUpdatedAt, r.UpdatedAt)
	it.putTime(attrDeadline, r.Deadline)
	if r.EndedAt != nil {
		it.putTime(attrEndedAt, *r.EndedAt)
	}
	it.putN(attrEventCursor, r.EventCursor)
	it.putBool(attrDrained, r.Drained)
	if r.Live() {
		it.putS(attrLive, liveValue)
	}
	it.putExpiry(r.ExpiresAt)
	it.putTime(attrEventsExpireAfter, r.EventsExpireAfter)
	putBrokered(it, r.Brokered)
	putQueue(it, r.Queue)
	if r.Waiting() {
		it.putS(attrQueuePart, queuePart)
		it.putS(attrQueueKey, queueKey(r.Queue.Class, store.QueueOrder(*r.Queue, r.FleetRunID)))
		it.putS(attrQueueHosts, strings.Join(r.Queue.Hosts, ","))
		it.putTime(attrQueueEntryUntil, r.Queue.Until)
	}
	it.putNAlways(attrRunVersion, r.Version)
	// The "all" index key never changes (it derives from the id), so
	// rewriting it costs that index nothing; it is here so that an update
	// gives a run written before the index existed its entry (migration).
	it.putS(attrAllShard, shard)
	return it
}

// runMutableNames lists every attribute runMutable may write, so an update
// removes those it leaves out.
var runMutableNames = []string{
	attrChildRunID, attrStatus, attrAttempt, attrExitCode, attrReason, attrDetail, attrAgent,
	attrRewroteLocalPath, attrUpdatedAt, attrDeadline, attrEndedAt, attrEventCursor,
	attrDrained, attrLive, attrExpiresAt, attrEventsExpireAfter, attrBrokered, attrRunVersion, attrAllShard,
	attrQueue, attrQueuePart, attrQueueKey, attrQueueHosts, attrQueueEntryUntil,
}

// maxQueueRequest bounds what a stored request inflates to: far above
// any item's 400 KB, so only a corrupt one is refused.
const maxQueueRequest = 4 << 20

// inflate reads raw DEFLATE, refusing more than limit bytes.
func inflate(packed []byte, limit int) ([]byte, error) {
	fr := flate.NewReader(bytes.NewReader(packed))
	defer fr.Close()
	raw, err := io.ReadAll(io.LimitReader(fr, int64(limit)+1))
	if err != nil {
		return nil, fmt.Errorf("inflating: %w", err)
	}
	if len(raw) > limit {
		return nil, fmt.Errorf("inflates past %d bytes", limit)
	}
	return raw, nil
}

// splitHosts reads QueueInfo.Hosts as stored: nil when absent.
func splitHosts(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// queueKey is a waiting run's sort key in the queue index.
func queueKey(class, order string) string { return class + store.QueueClassSeparator + order }

// putQueue writes a run's wait, nothing for a run that never waited.
func putQueue(it item, q *store.QueueInfo) {
	if q == nil {
		return
	}
	m := item{}
	m.putS(attrQueueClass, q.Class)
	m.putN(attrQueuePriority, int64(q.Priority))
	m.putTime(attrQueueSince, q.Since)
	m.putNAlways(attrQueueTimeout, int64(q.Timeout))
	m.putTime(attrQueueUntil, q.Until)
	m.putN(attrQueueOffers, int64(q.Offers))
	if len(q.Request) > 0 {
		m.putB(attrQueueRequest, deflate(q.Request))
	}
	if q.StartedAt != nil {
		m.putTime(attrQueueStartedAt, *q.StartedAt)
	}
	m.putS(attrQueueStartedOn, q.StartedOn)
	m.putS(attrQueueHostIDs, strings.Join(q.Hosts, ","))
	it[attrQueue] = &types.AttributeValueMemberM{Value: m}
}

// queue reads a run's wait; nil when absent.
func (r *reader) queue() *store.QueueInfo {
	m := r.sub(attrQueue)
	if m == nil {
		return nil
	}
	q := &store.QueueInfo{
		Class: m.s(attrQueueClass), Priority: int(m.n(attrQueuePriority)), Since: m.time(attrQueueSince),
		Timeout: time.Duration(m.n(attrQueueTimeout)), Until: m.time(attrQueueUntil), Offers: int(m.n(attrQueueOffers)),
		StartedAt: m.timePtr(attrQueueStartedAt), StartedOn: m.s(attrQueueStartedOn), Hosts: splitHosts(m.s(attrQueueHostIDs)),
	}
	if packed := m.b(attrQueueRequest); len(packed) > 0 && m.err == nil {
		q.Request, m.err = inflate(packed, maxQueueRequest)
	}
	if m.err != nil {
		if r.err == nil {
			r.err = fmt.Errorf("attribute %q: %w", attrQueue, m.err)
		}
		return nil
	}
	return q
}

// putBrokered writes a run's brokered keys, nothing when it has none.
func putBrokered(it item, keys []store.BrokeredKey) {
	if len(keys) == 0 {
		return
	}
	l := make([]types.AttributeValue, len(keys))
	for i, k := range keys {
		e := item{}
		e.putS(attrBrokeredProjectID, k.ProjectID)
		e.putS(attrBrokeredKey, k.Key)
		e.putS(attrBrokeredKind, k.Kind)
		e.putTime(attrBrokeredExpiresAt, k.ExpiresAt)
		e.putB(attrBrokeredSealed, k.Sealed)
		if k.RevokedAt != nil {
			e.putTime(attrBrokeredRevokedAt, *k.RevokedAt)
		}
		l[i] = &types.AttributeValueMemberM{Value: e}
	}
	it[attrBrokered] = &types.AttributeValueMemberL{Value: l}
}

// brokered reads a run's brokered keys; nil when absent.
func (r *reader) brokered() []store.BrokeredKey {
	v, ok := r.it[attrBrokered]
	if !ok {
		return nil
	}
	l, ok := v.(*types.AttributeValueMemberL)
	if !ok {
		r.fail(attrBrokered, "L", v)
		return nil
	}
	keys := make([]store.BrokeredKey, 0, len(l.Value))
	for _, e := range l.Value {
		m, ok := e.(*types.AttributeValueMemberM)
		if !ok {
			r.fail(attrBrokered, "L of M", e)
			return nil
		}
		er := &reader{it: m.Value}
		k := store.BrokeredKey{
			ProjectID: er.s(attrBrokeredProjectID), Key: er.s(attrBrokeredKey), Kind: er.s(attrBrokeredKind),
			ExpiresAt: er.time(attrBrokeredExpiresAt), Sealed: er.b(attrBrokeredSealed),
			RevokedAt: er.timePtr(attrBrokeredRevokedAt),
		}
		if er.err != nil {
			if r.err == nil {
				r.err = fmt.Errorf("attribute %q: %w", attrBrokered, er.err)
			}
			return nil
		}
		keys = append(keys, k)
	}
	return keys
}

func runFromItem(it item) (store.Run, error) {
	r := &reader{it: it}
	r.checkVersion()
	run := store.Run{
		FleetRunID: r.s(attrFleetRunID), OwnerID: r.s(attrOwnerID), HostID: r.s(attrHostID),
		ChildRunID: r.s(attrChildRunID), Status: r.s(attrStatus), Attempt: int(r.n(attrAttempt)),
		Reason: r.s(attrReason), Detail: r.s(attrDetail), Agent: r.s(attrAgent), IdempotencyKey: r.s(attrIdempotencyKey),
		Repository: r.s(attrRepository), RewroteLocalPath: r.bool(attrRewroteLocalPath), UpdatedAt: r.time(attrUpdatedAt),
		Deadline: r.time(attrDeadline), EndedAt: r.timePtr(attrEndedAt),
		EventCursor: r.n(attrEventCursor), Drained: r.bool(attrDrained),
		ExpiresAt: r.expiry(), EventsExpireAfter: r.time(attrEventsExpireAfter), Brokered: r.brokered(),
		Queue: r.queue(), Version: r.n(attrRunVersion),
	}
	if r.has(attrExitCode) {
		code := int(r.n(attrExitCode))
		run.ExitCode = &code
	}
	if err := r.done(); err != nil {
		return store.Run{}, fmt.Errorf("run item: %w", err)
	}
	created, _, err := parseCreatedKey(r.s(attrCreatedAt))
	if err != nil {
		return store.Run{}, fmt.Errorf("run item %q: %w", run.FleetRunID, err)
	}
	run.CreatedAt = created
	return run, nil
}

// --- events ----------------------------------------------------------------

func eventItem(e store.Event) item {
	it := item{}
	it.putS(attrFleetRunID, e.FleetRunID)
	it.putNAlways(attrSequence, e.Sequence)
	it.putNAlways(attrVersionFormat, formatVersion)
	it.putS(attrType, e.Type)
	it.putS(attrData, string(e.Data))
	it.putTime(attrTS, e.TS)
	it.putExpiry(e.ExpiresAt)
	return it
}

func eventFromItem(it item) (store.Event, error) {
	r := &reader{it: it}
	r.checkVersion()
	e := store.Event{
		FleetRunID: r.s(attrFleetRunID), Sequence: r.n(attrSequence), Type: r.s(attrType), TS: r.time(attrTS),
		ExpiresAt: r.expiry(),
	}
	if data := r.s(attrData); data != "" {
		e.Data = json.RawMessage(data)
	}
	if err := r.done(); err != nil {
		return store.Event{}, fmt.Errorf("event item: %w", err)
	}
	return e, nil
}
