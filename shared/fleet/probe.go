package fleet

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
)

// ProbeResult is one host's probe as recorded.
type ProbeResult struct {
	HostID string      `json:"hostId"`
	Probe  store.Probe `json:"probe"`
}

// ProbeHost probes one host now, records the probe and returns it.
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
	if err := f.RefreshRouteView(ctx); err != nil {
		return store.Probe{}, err
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
// bounded by ProbeTimeout) and records each probe. enabledOnly skips disabled
// hosts; the admin's probe-now covers every host. A host deleted meanwhile
// is skipped; other recording failures are joined into the error after
// every host was tried.
func (f *Fleet) ProbeAll(ctx context.Context, enabledOnly bool) ([]ProbeResult, error) {
	rep, err := f.probeHosts(ctx, enabledOnly, time.Time{})
	return rep.Probed, err
}

// ProbeReport is a scheduled probe's outcome.
type ProbeReport struct {
	Probed []ProbeResult `json:"probed"`
	// Skipped lists the hosts the budget left for the next probe.
	Skipped []string `json:"skipped,omitempty"`
}

// ProbeEnabled is the scheduled probe: every enabled host, as ProbeAll,
// within a budget. A probe that could not finish before until (it may take
// ProbeTimeout) is not started, so none is cut short and recorded as a
// false unreachable; hosts are taken oldest probe first, so the ones a
// short budget skipped come first next time.
func (f *Fleet) ProbeEnabled(ctx context.Context, until time.Time) (ProbeReport, error) {
	return f.probeHosts(ctx, true, until)
}

func (f *Fleet) probeHosts(ctx context.Context, enabledOnly bool, until time.Time) (ProbeReport, error) {
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
		sort.SliceStable(due, func(i, j int) bool { return probedAt(due[i]).Before(probedAt(due[j])) })
	}
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
			switch err := f.store.RecordProbe(ctx, h.ID, p); {
			case errors.Is(err, store.ErrNotFound):
			case err != nil:
				errs[i] = fmt.Errorf("fleet: recording the probe of %q: %w", h.ID, err)
			default:
				results[i] = &ProbeResult{HostID: h.ID, Probe: p}
			}
		}()
	}
	wg.Wait()
	rep := ProbeReport{Probed: make([]ProbeResult, 0, len(due))}
	probed := make(map[string]*store.Probe, len(due))
	for i, r := range results {
		if r != nil {
			rep.Probed = append(rep.Probed, *r)
			probed[r.HostID] = &r.Probe
		}
		if skipped[i] {
			rep.Skipped = append(rep.Skipped, due[i].ID)
		}
	}
	// The view from the hosts this pass holds, with the probes it just
	// recorded: no second scan. A host deleted meanwhile (its probe not
	// recorded) stays until the next pass; dispatch's strong re-read of a
	// chosen host skips it.
	for i, h := range hosts {
		if p, ok := probed[h.ID]; ok {
			hosts[i].Probe = p
		}
	}
	if err := f.writeRouteView(ctx, hosts); err != nil {
		errs = append(errs, err)
	}
	return rep, errors.Join(errs...)
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
)
