package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/runfleet/runfleet/shared/auth"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/rollup"
	"github.com/runfleet/runfleet/shared/store"
)

// MaxMetricsHosts bounds the hosts one rollup scrapes: each is a host call
// (ProbeConcurrency at once, each up to ProbeTimeout), and the API answers
// within API Gateway's 29 s. A larger fleet is rolled up in pages.
const MaxMetricsHosts = 50

// MetricsQuery selects the hosts of one rollup among those the caller may
// see.
type MetricsQuery struct {
	// Host, when set, is the one host rolled up: 403 when the caller may not
	// see it, 404 when it is not registered. Not with After.
	Host string
	// After continues a paged rollup from the host the last page ended at
	// (its Next).
	After string
}

// MetricsPage is the rollup of one page of hosts.
type MetricsPage struct {
	rollup.Result
	// Next is the After of the next page; empty when this page reached the
	// caller's last host.
	Next string
}

// MetricsRollup scrapes the metrics of the hosts c may see (an admin: every
// host), at most MaxMetricsHosts of them from q (metricsHosts), concurrently
// (at most ProbeConcurrency at once, each bounded by ProbeTimeout), and
// merges them (rollup.Merge): a caller limited to some hosts learns nothing
// of the others. A non-admin caller is scoped rather than refused: DESIGN's
// /metrics is the rollup of the caller's visible hosts, which is also what
// an operator of some hosts needs, and the bound holds for everyone.
// Dropped families and failed scrapes are logged here; the rollup reports
// them too, per host (runfleet_rollup_dropped_families, runfleet_rollup_up).
func (f *Fleet) MetricsRollup(ctx context.Context, c store.Caller, q MetricsQuery) (MetricsPage, error) {
	hosts, page, err := f.metricsHosts(ctx, c, q)
	if err != nil {
		return MetricsPage{}, err
	}
	scrapes := make([]rollup.Scrape, len(hosts))
	sem := make(chan struct{}, f.cfg.ProbeConcurrency)
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			scrapes[i] = f.scrape(ctx, h)
		}()
	}
	wg.Wait()
	page.Result = rollup.Merge(scrapes)
	if len(page.Dropped) > 0 {
		f.log.Warn("metrics rollup dropped families", "dropped", len(page.Dropped), "families", page.Dropped, logOwner, c.OwnerID)
	}
	for _, fail := range page.Failed {
		f.log.Warn("metrics rollup: a host's scrape failed", logHost, fail.Host, logReason, fail.Reason)
	}
	return page, nil
}

// metricsHosts picks a rollup's hosts: q.Host alone, or the next page of
// c's visible hosts after q.After. Its reads are bounded like its scrapes:
// a caller who may see every host pages the registry itself
// (ListHostsPage, in the store's order: a page costs its own bytes, not the
// registry's); a caller with a list pages that list, by id, reading each
// host of the page.
func (f *Fleet) metricsHosts(ctx context.Context, c store.Caller, q MetricsQuery) ([]store.Host, MetricsPage, error) {
	if q.Host != "" && q.After != "" {
		return nil, MetricsPage{}, invalid("host and after: give one (host rolls up that host alone)")
	}
	for _, p := range []struct{ name, id string }{{"host", q.Host}, {"after", q.After}} {
		if p.id != "" {
			if err := checkID(p.name, p.id); err != nil {
				return nil, MetricsPage{}, err
			}
		}
	}
	if q.Host != "" {
		// The scope first: whether a host outside it exists is not the
		// caller's business.
		if !auth.CanUseHost(c, q.Host) {
			return nil, MetricsPage{}, forbidden("host %q is not in this caller's allowedHosts", q.Host)
		}
		h, err := f.Host(ctx, q.Host)
		if err != nil {
			return nil, MetricsPage{}, err
		}
		return []store.Host{h}, MetricsPage{}, nil
	}
	if c.Admin || c.AllowedHosts.All {
		p, err := f.store.ListHostsPage(ctx, q.After, MaxMetricsHosts)
		if err != nil {
			return nil, MetricsPage{}, fmt.Errorf("fleet: listing a page of hosts: %w", err)
		}
		return p.Hosts, MetricsPage{Next: p.Next}, nil
	}
	ids := slices.Compact(slices.Sorted(slices.Values(c.AllowedHosts.IDs)))
	ids = ids[sort.Search(len(ids), func(i int) bool { return ids[i] > q.After }):]
	var page MetricsPage
	if len(ids) > MaxMetricsHosts {
		ids = ids[:MaxMetricsHosts]
		page.Next = ids[len(ids)-1]
	}
	hosts := make([]store.Host, 0, len(ids))
	for _, id := range ids {
		h, err := f.store.GetHost(store.EventualRead(ctx), id)
		if errors.Is(err, store.ErrNotFound) {
			continue // in the caller's scope, not (or no longer) registered
		}
		if err != nil {
			return nil, MetricsPage{}, fmt.Errorf("fleet: reading host %q: %w", id, err)
		}
		hosts = append(hosts, h)
	}
	return hosts, page, nil
}

// scrape reads one host's metrics. The error kept is what a caller of the
// rollup may read in the log: never the credential.
func (f *Fleet) scrape(ctx context.Context, h store.Host) rollup.Scrape {
	s := rollup.Scrape{Host: h.ID}
	client, err := f.HostClient(ctx, h, f.cfg.ProbeTimeout)
	if err != nil {
		f.log.Error("metrics rollup: no client for host", logHost, h.ID, logErr, err.Error())
		s.Err = errors.New("the host credential is unavailable")
		return s
	}
	s.Text, err = client.Metrics(ctx)
	if err != nil {
		if errors.Is(err, hostproto.ErrNoAnswer) {
			s.Err = errors.New(hostproto.OutcomeOf(err).Detail)
		} else {
			s.Err = err
		}
	}
	return s
}
