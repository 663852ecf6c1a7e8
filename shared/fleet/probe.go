package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync"

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
	if err := f.store.RecordProbe(ctx, id, p); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return store.Probe{}, notFound("host %q was deleted while being probed", id)
		}
		return store.Probe{}, fmt.Errorf("fleet: recording the probe of %q: %w", id, err)
	}
	return p, nil
}

// ProbeAll probes hosts concurrently (at most ProbeConcurrency at once, each
// bounded by ProbeTimeout) and records each probe. enabledOnly skips disabled
// hosts (the scheduled probe); the admin's probe-now covers every host. A
// host deleted meanwhile is skipped; other recording failures are joined
// into the error after every host was tried.
func (f *Fleet) ProbeAll(ctx context.Context, enabledOnly bool) ([]ProbeResult, error) {
	hosts, err := f.store.ListHosts(ctx)
	if err != nil {
		return nil, fmt.Errorf("fleet: listing hosts to probe: %w", err)
	}
	var todo []store.Host
	for _, h := range hosts {
		if h.Enabled || !enabledOnly {
			todo = append(todo, h)
		}
	}
	results := make([]*ProbeResult, len(todo))
	errs := make([]error, len(todo))
	sem := make(chan struct{}, f.cfg.ProbeConcurrency)
	var wg sync.WaitGroup
	for i, h := range todo {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			p := f.probe(ctx, h)
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
	out := make([]ProbeResult, 0, len(todo))
	for _, r := range results {
		if r != nil {
			out = append(out, *r)
		}
	}
	return out, errors.Join(errs...)
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
		f.log.Warn("probe: no client for host", "host", h.ID, "err", err)
		return p
	}
	health, err := client.Health(ctx)
	p.LatencyMs = f.clock.Now().Sub(start).Milliseconds()
	var he *hostproto.Error
	switch {
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
		f.log.Error("probe: unexpected error", "host", h.ID, "err", err)
	}
	if err == nil {
		p.Version = health.Version
		p.Agents = health.Agents
		p.Features = health.Features
		p.CA = health.CA
		p.Draining = health.Draining
	}
	return p
}
