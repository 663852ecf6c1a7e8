package fleet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
)

// ProbeResult is one host's probe as taken.
type ProbeResult struct {
	HostID string      `json:"hostId"`
	Probe  store.Probe `json:"probe"`
	// Recorded: the probe was written to the host's record (ProbeEnabled
	// writes only what changed; see probeChange).
	Recorded bool `json:"recorded"`
}

// ProbeHost probes one host now and records the probe, whatever changed
// (an admin asking for a probe reads it back), and returns it. A host it
// finds with free slots for a class with waiting runs is woken at once,
// so that a host joining (registered, then probed) takes queued work
// without waiting for the probe pass.
func (f *Fleet) ProbeHost(ctx context.Context, id string) (store.Probe, error) {
	h, err := f.Host(ctx, id)
	if err != nil {
		return store.Probe{}, err
	}
	p := f.probe(ctx, h)
	f.logProbe(h, p)
	if err := f.store.RecordProbe(ctx, id, p); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return store.Probe{}, notFound("host %q was deleted while being probed", id)
		}
		return store.Probe{}, fmt.Errorf("fleet: recording the probe of %q: %w", id, err)
	}
	f.probed.remember(map[string]time.Time{id: p.At}, nil)
	if err := f.RefreshRouteView(ctx); err != nil {
		return store.Probe{}, err
	}
	if probeFree(&p) > 0 {
		classes, err := f.queueClasses(ctx)
		if err != nil {
			f.log.Error("probe: reading the queue's classes for the host's wake", logHost, id, logErr, err.Error())
			return p, nil
		}
		h.Probe = &p
		f.sendProbeWakes(ctx, ProbeWakes([]store.Host{h}, classes, f.clock.Now(), f.cfg.ProbeMaxAge))
	}
	return p, nil
}

// RefreshRouteView rebuilds the routing view from every host as stored now
// (one scan of the hosts table), so that what an admin verb on one host
// just changed (a probe, enabled, a drain or resume) is routed on at once
// rather than after the next probe pass.
func (f *Fleet) RefreshRouteView(ctx context.Context) error {
	hosts, err := f.store.ListHosts(ctx)
	if err != nil {
		return fmt.Errorf("fleet: listing hosts for the routing view: %w", err)
	}
	return f.writeRouteView(ctx, hosts)
}

// writeRouteView writes the view of hosts (BuildRouteView at now).
func (f *Fleet) writeRouteView(ctx context.Context, hosts []store.Host) error {
	v := BuildRouteView(hosts, f.clock.Now(), f.cfg.ProbeMaxAge)
	kept, err := f.store.PutRouteView(ctx, v)
	if err != nil {
		return fmt.Errorf("fleet: writing the routing view: %w", err)
	}
	for list, n := range kept {
		if n < len(hosts) {
			f.log.Info("routing view: list truncated", logRouteList, list, logKept, n, logHosts, len(hosts))
		}
	}
	return nil
}

// ProbeAll probes hosts concurrently (at most ProbeConcurrency at once, each
// bounded by ProbeTimeout) and records each probe, changed or not (the
// admin's probe-now: what it answers is what the hosts list shows next).
// enabledOnly skips disabled hosts; the admin's probe-now covers every host.
// A host deleted meanwhile is skipped; other recording failures are joined
// into the error after every host was tried.
func (f *Fleet) ProbeAll(ctx context.Context, enabledOnly bool) ([]ProbeResult, error) {
	rep, err := f.probeHosts(ctx, enabledOnly, time.Time{}, true)
	return rep.Probed, err
}

// ProbeReport is a probe pass's outcome.
type ProbeReport struct {
	// Probed are the probes taken, recorded or not.
	Probed []ProbeResult `json:"probed"`
	// Written counts the probes recorded.
	Written int `json:"written"`
	// Skipped lists the hosts the budget left for the next probe.
	Skipped []string `json:"skipped,omitempty"`
	// Wakes are the wakes the pass sent (ProbeWakes).
	Wakes []Wake `json:"wakes,omitempty"`
	// Capacity is the fleet's capacity from the probes the pass holds
	// (Capacity); nil when the queue could not be read (logged).
	Capacity []ClassCapacity `json:"-"`
}

// ProbeEnabled is the scheduled probe: every enabled host, as ProbeAll,
// within a budget, recording a host's probe only when it changed in a way
// that matters or its record is due for refresh (probeChange): a quiet
// fleet's pass writes almost nothing, while the routing view, the capacity
// figures and the wakes are computed from every probe it took. A probe that
// could not finish before until (it may take ProbeTimeout) is not started,
// so none is cut short and recorded as a false unreachable; hosts are taken
// least recently probed first (as this process remembers, else as
// recorded), so the ones a short budget skipped come first next time.
func (f *Fleet) ProbeEnabled(ctx context.Context, until time.Time) (ProbeReport, error) {
	return f.probeHosts(ctx, true, until, false)
}

// probeHosts is a probe pass; always records every probe, else only those
// probeChange calls for.
func (f *Fleet) probeHosts(ctx context.Context, enabledOnly bool, until time.Time, always bool) (ProbeReport, error) {
	hosts, err := f.store.ListHosts(ctx)
	if err != nil {
		return ProbeReport{}, fmt.Errorf("fleet: listing hosts to probe: %w", err)
	}
	var due []store.Host
	for _, h := range hosts {
		if h.Enabled || !enabledOnly {
			due = append(due, h)
		}
	}
	if !until.IsZero() {
		last := f.probed.lastProbed(due)
		sort.SliceStable(due, func(i, j int) bool { return last[due[i].ID].Before(last[due[j].ID]) })
	}
	refresh := f.probeRefresh()
	results := make([]*ProbeResult, len(due))
	skipped := make([]bool, len(due))
	errs := make([]error, len(due))
	sem := make(chan struct{}, f.cfg.ProbeConcurrency)
	var wg sync.WaitGroup
	for i, h := range due {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if ctx.Err() != nil || (!until.IsZero() && f.clock.Now().Add(f.cfg.ProbeTimeout).After(until)) {
				skipped[i] = true
				return
			}
			p := f.probe(ctx, h)
			f.logProbe(h, p)
			if !always && probeChange(h.Probe, p, refresh) == "" {
				results[i] = &ProbeResult{HostID: h.ID, Probe: p}
				return
			}
			switch err := f.store.RecordProbe(ctx, h.ID, p); {
			case errors.Is(err, store.ErrNotFound):
			case err != nil:
				errs[i] = fmt.Errorf("fleet: recording the probe of %q: %w", h.ID, err)
			default:
				results[i] = &ProbeResult{HostID: h.ID, Probe: p, Recorded: true}
			}
		}()
	}
	wg.Wait()
	rep := ProbeReport{Probed: make([]ProbeResult, 0, len(due))}
	probed := make(map[string]*store.Probe, len(due))
	at := make(map[string]time.Time, len(due))
	for i, r := range results {
		if r != nil {
			rep.Probed = append(rep.Probed, *r)
			probed[r.HostID] = &r.Probe
			at[r.HostID] = r.Probe.At
			if r.Recorded {
				rep.Written++
			}
		}
		if skipped[i] {
			rep.Skipped = append(rep.Skipped, due[i].ID)
		}
	}
	f.probed.remember(at, hosts)
	// The view from the hosts this pass holds, with the probes it just
	// took, recorded or not: no second scan. A host deleted meanwhile (its
	// probe not recorded) stays until the next pass; dispatch's strong
	// re-read of a chosen host skips it. That re-read finds a quiet host's
	// record at most ProbeRefresh (plus a pass) old, inside ProbeMaxAge, and
	// equal to the probe in all that routing reads.
	for i, h := range hosts {
		if p, ok := probed[h.ID]; ok {
			hosts[i].Probe = p
		}
	}
	if err := f.writeRouteView(ctx, hosts); err != nil {
		errs = append(errs, err)
	}
	rep.Capacity, rep.Wakes = f.passQueue(ctx, hosts, probed)
	return rep, errors.Join(errs...)
}

// passQueue is the pass's part in runs that wait, from the hosts as the
// pass holds them: the capacity figures, and a wake for every host probed
// now that has room for a class with waiting runs (ProbeWakes): how a host
// that joined or became healthy again gets queued work, and the net for a
// run-end wake that was lost. A queue that cannot be read is logged, not
// fatal: the pass's routing view is written already.
func (f *Fleet) passQueue(ctx context.Context, hosts []store.Host, probed map[string]*store.Probe) ([]ClassCapacity, []Wake) {
	stats, waiting, err := f.queueStats(ctx)
	if err != nil {
		f.log.Error("probe: the queue could not be read; no capacity figures and no wakes this pass", logErr, err.Error())
		return nil, nil
	}
	now := f.clock.Now()
	fresh := make([]store.Host, 0, len(probed))
	for _, h := range hosts {
		if probed[h.ID] != nil {
			fresh = append(fresh, h)
		}
	}
	wakes := ProbeWakes(fresh, waiting, now, f.cfg.ProbeMaxAge)
	f.sendProbeWakes(ctx, wakes)
	return f.capacity(hosts, stats, now), wakes
}

// ProbeWakes are the wakes for hosts: one for each host routable now with
// free slots (its probe's maxConcurrent - active) for at least one of
// classes (as routing judges it for the class's agent and labels), for
// all its free slots. Ordered by host id. Pure.
func ProbeWakes(hosts []store.Host, classes []string, now time.Time, maxProbeAge time.Duration) []Wake {
	type route struct {
		agent  string
		labels map[string]string
	}
	routes := make([]route, 0, len(classes))
	for _, c := range classes {
		if agent, labels, err := ParseClass(c); err == nil {
			routes = append(routes, route{agent, labels})
		}
	}
	var wakes []Wake
	for _, h := range hosts {
		free := probeFree(h.Probe)
		if free <= 0 {
			continue
		}
		for _, r := range routes {
			if reasons, _ := exclusions(RouteInput{Agent: r.agent, Labels: r.labels, Now: now, MaxProbeAge: maxProbeAge}, h, ""); len(reasons) == 0 {
				wakes = append(wakes, Wake{HostID: h.ID, Slots: free, Reason: WakeProbe})
				break
			}
		}
	}
	sort.Slice(wakes, func(i, j int) bool { return wakes[i].HostID < wakes[j].HostID })
	return wakes
}

// probeFree is what a probe shows free: maxConcurrent - active, zero
// without a load (a host older than the field) or without an ok answer.
// (freeSlots, for a host an admin verb made routable, assumes one.)
func probeFree(p *store.Probe) int {
	if p == nil || p.Status != store.ProbeOK || p.Load == nil {
		return 0
	}
	return p.Load.MaxConcurrent - p.Load.Active
}

// sendProbeWakes sends wakes in one Waker call (wake); without a Waker
// (tests, tools), FillHosts takes them here (Config.Waker). A failure is
// logged: the next pass wakes the hosts that still have room.
func (f *Fleet) sendProbeWakes(ctx context.Context, wakes []Wake) {
	if len(wakes) == 0 {
		return
	}
	if f.cfg.Waker != nil {
		f.wake(ctx, wakes...)
		return
	}
	if _, err := f.FillHosts(ctx, wakes); err != nil {
		f.log.Error("probe: filling the hosts with room", logWakes, len(wakes), logErr, err.Error())
	}
}

// probeRefresh is Config.ProbeRefresh, ProbeMaxAge/2 when zero or not
// under ProbeMaxAge: a quiet host's record must never be stale for routing.
func (f *Fleet) probeRefresh() time.Duration {
	if r := f.cfg.ProbeRefresh; r > 0 && r < f.cfg.ProbeMaxAge {
		return r
	}
	return f.cfg.ProbeMaxAge / 2
}

// probeChange says why probe p must be recorded over was, the host's
// record ("" when it need not be): the host was never probed; something a
// decision or a person reads changed (status, the class of the detail,
// version, agents, features, CA dates, draining, idle, storage (below),
// limits, load, the ledger key); or the record is refresh old. Latency
// alone never is: it orders routing's candidates only among hosts alike
// in every other way, and the view carries the pass's own.
//
// Free storage is material when low flips, the reserve changes, or free
// bytes moved by a tenth of what the record says was free. Nothing in Fleet
// decides on the bytes (routing reads low, which the host judges against
// its reserve); a person reads them, and a tenth keeps the record within
// about 10% of the host's as of the last pass, the step shrinking as the
// disk fills, so a host nearing its reserve is tracked closely: a disk
// going from 100 GB free to 10 GB is written about 22 times, not every
// pass in which a run wrote a file.
func probeChange(was *store.Probe, p store.Probe, refresh time.Duration) string {
	switch {
	case was == nil:
		return "never probed"
	case p.At.Sub(was.At) >= refresh:
		return "refresh"
	case p.Status != was.Status:
		return "status"
	case detailClass(p.Detail) != detailClass(was.Detail):
		return "detail"
	case p.Version != was.Version:
		return "version"
	case !slices.Equal(p.Agents, was.Agents):
		return "agents"
	case p.Features != was.Features:
		return "features"
	case !caEqual(p.CA, was.CA):
		return "ca"
	case p.Draining != was.Draining:
		return "draining"
	case !ptrEqual(p.Idle, was.Idle):
		return "idle"
	case storageMoved(was.Storage, p.Storage):
		return "storage"
	case !ptrEqual(p.Limits, was.Limits):
		return "limits"
	case !ptrEqual(p.Load, was.Load):
		return "load"
	case p.LedgerKey != was.LedgerKey:
		return "ledgerKey"
	}
	return ""
}

// detailClass is a detail without its numbers (ports, sizes, times), so
// that a host failing the same way is not rewritten for each new number.
func detailClass(d string) string {
	var b strings.Builder
	digits := false
	for _, r := range d {
		if r >= '0' && r <= '9' {
			if !digits {
				b.WriteByte('#')
			}
			digits = true
			continue
		}
		digits = false
		b.WriteRune(r)
	}
	return b.String()
}

func ptrEqual[T comparable](a, b *T) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

func caEqual(a, b *store.CAInfo) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	if !a.NotAfter.Equal(b.NotAfter) {
		return false
	}
	if a.SuccessorNotAfter == nil || b.SuccessorNotAfter == nil {
		return a.SuccessorNotAfter == nil && b.SuccessorNotAfter == nil
	}
	return a.SuccessorNotAfter.Equal(*b.SuccessorNotAfter)
}

// storageMoved: see probeChange.
func storageMoved(was, is *store.Storage) bool {
	if was == nil || is == nil {
		return was != is
	}
	if was.Low != is.Low || was.MinFreeBytes != is.MinFreeBytes {
		return true
	}
	d := is.FreeBytes - was.FreeBytes
	if d < 0 {
		d = -d
	}
	return d*10 >= max(was.FreeBytes, 1)
}

// probeMemory remembers when this process last probed each host. A
// budgeted pass takes hosts least recently probed first; a quiet host's
// record keeps the time it was last written, so without this a pass the
// budget cannot cover would take the same quiet hosts first every time.
// A new process (a cold Lambda) starts from the records' times. Safe for
// concurrent use.
type probeMemory struct {
	mu sync.Mutex
	at map[string]time.Time
}

// lastProbed is when each of hosts was last probed, as remembered or, if
// later, recorded.
func (m *probeMemory) lastProbed(hosts []store.Host) map[string]time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]time.Time, len(hosts))
	for _, h := range hosts {
		out[h.ID] = probedAt(h)
		if t, ok := m.at[h.ID]; ok && t.After(out[h.ID]) {
			out[h.ID] = t
		}
	}
	return out
}

// remember notes the probes at; when registry is given (a pass's every
// host), hosts no longer in it are forgotten.
func (m *probeMemory) remember(at map[string]time.Time, registry []store.Host) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.at == nil {
		m.at = map[string]time.Time{}
	}
	if registry != nil {
		keep := make(map[string]bool, len(registry))
		for _, h := range registry {
			keep[h.ID] = true
		}
		maps.DeleteFunc(m.at, func(id string, _ time.Time) bool { return !keep[id] })
	}
	maps.Copy(m.at, at)
}

// logProbe logs probe p of h against the probe h holds: a host that
// becomes unreachable, unhealthy or low on storage at WARN, once, when it
// changes; one that recovers at INFO; every probe that changes nothing
// worth a person's attention at DEBUG, so a healthy fleet's log is quiet.
func (f *Fleet) logProbe(h store.Host, p store.Probe) {
	was, is := probeCondition(h.Probe), probeCondition(&p)
	attrs := []any{logHost, h.ID, logStatus, p.Status, logLatencyMs, p.LatencyMs}
	switch {
	case is == was:
		f.log.Debug("probe", attrs...)
	case is != conditionOK:
		if p.Detail != "" {
			attrs = append(attrs, logDetail, p.Detail)
		}
		f.log.Warn("probe: host "+is, append(attrs, logWas, was)...)
	default:
		f.log.Info("probe: host healthy", append(attrs, logWas, was)...)
	}
}

// Probe conditions, as logProbe names a change.
const (
	conditionOK          = "healthy"
	conditionNever       = "never probed"
	conditionUnreachable = "unreachable"
	conditionUnhealthy   = "unhealthy"
	conditionStorageLow  = "low on storage"
)

// probeCondition is what a probe says of its host, for a person.
func probeCondition(p *store.Probe) string {
	switch {
	case p == nil:
		return conditionNever
	case p.Status == store.ProbeUnreachable:
		return conditionUnreachable
	case p.Status != store.ProbeOK:
		return conditionUnhealthy
	case p.Storage != nil && p.Storage.Low:
		return conditionStorageLow
	}
	return conditionOK
}

// probedAt is when h was last probed; never is the zero time (first).
func probedAt(h store.Host) time.Time {
	if h.Probe == nil {
		return time.Time{}
	}
	return h.Probe.At
}

// probe asks one host's /healthz and classifies the answer: ok, auth_fail
// (credential refused or unavailable), unreachable (no answer in time or at
// all), bad_response (anything else, including a host saying ok: false).
func (f *Fleet) probe(ctx context.Context, h store.Host) store.Probe {
	start := f.clock.Now()
	p := store.Probe{At: start.UTC()}
	client, err := f.HostClient(ctx, h, f.cfg.ProbeTimeout)
	if err != nil {
		p.Status = store.ProbeAuthFail
		p.Detail = "the host credential is unavailable"
		f.log.Warn("probe: no client for host", logHost, h.ID, logErr, err.Error())
		return p
	}
	health, err := client.Health(ctx)
	p.LatencyMs = f.clock.Now().Sub(start).Milliseconds()
	var he *hostproto.Error
	switch {
	case err == nil && outOfBounds(health) != "":
		// Recorded as is, it could outgrow the host's item: never routed to.
		p.Status = store.ProbeBadResponse
		p.Detail = outOfBounds(health)
		err = errors.New(p.Detail)
	case err == nil && health.OK:
		p.Status = store.ProbeOK
	case err == nil:
		p.Status = store.ProbeBadResponse
		p.Detail = "the host reports ok: false"
	case errors.Is(err, hostproto.ErrUnauthorized):
		p.Status = store.ProbeAuthFail
		p.Detail = "the host refused the credential"
	case errors.Is(err, hostproto.ErrNoAnswer):
		p.Status = store.ProbeUnreachable
		p.Detail = hostproto.OutcomeOf(err).Detail
	case errors.As(err, &he):
		p.Status = store.ProbeBadResponse
		p.Detail = he.Error()
	default:
		p.Status = store.ProbeBadResponse
		p.Detail = "the probe failed"
		f.log.Error("probe: unexpected error", logHost, h.ID, logErr, err.Error())
	}
	if err == nil {
		probeFromWire(&p, health)
		if was := h.Probe; was != nil && was.LedgerKey != "" && p.LedgerKey != was.LedgerKey {
			// Ledgers it sealed before now fail verification: worth a look.
			f.log.Warn("probe: the host's ledger key changed", logHost, h.ID, "was", was.LedgerKey, "now", p.LedgerKey)
		}
	} else if h.Probe != nil {
		// The key is the host's, not this answer's: a probe that got none
		// keeps it, so ledgers verify while the host is down.
		p.LedgerKey = h.Probe.LedgerKey
	}
	return p
}

// outOfBounds says what of a health answer exceeds what a probe records,
// "" when nothing does.
func outOfBounds(h hostproto.Health) string {
	if len(h.Agents) > maxProbeAgents {
		return fmt.Sprintf("the host reports %d agents; at most %d are recorded", len(h.Agents), maxProbeAgents)
	}
	for _, a := range h.Agents {
		if len(a) > maxProbeAgentName {
			return fmt.Sprintf("the host reports an agent name of %d bytes; at most %d are recorded", len(a), maxProbeAgentName)
		}
	}
	if len(h.Version) > maxProbeVersion {
		return fmt.Sprintf("the host reports a version of %d bytes; at most %d are recorded", len(h.Version), maxProbeVersion)
	}
	if l := h.Limits; l != nil && len(l.Enforced)+len(l.Detail) > maxProbeLimits {
		return fmt.Sprintf("the host reports limits of %d bytes; at most %d are recorded", len(l.Enforced)+len(l.Detail), maxProbeLimits)
	}
	if len(h.LedgerKey) > maxProbeLedgerKey {
		return fmt.Sprintf("the host reports a ledger key of %d bytes; at most %d are recorded", len(h.LedgerKey), maxProbeLedgerKey)
	}
	return ""
}

// Log fields of the routing view's and the probe's lines.
const (
	logRouteList = "routeList"
	logKept      = "kept"
	logHosts     = "hosts"
	logLatencyMs = "latencyMs"
	logDetail    = "detail"
	logWas       = "was"
	logWakes     = "wakes"
)
