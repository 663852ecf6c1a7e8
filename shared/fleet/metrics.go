package fleet

import (
	"context"
	"errors"
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
	// After continues a paged rollup: hosts whose id sorts after it.
	After string
}

// MetricsPage is the rollup of one page of hosts.
type MetricsPage struct {
	rollup.Result
	// Next is the After of the next page; empty when this page reached the
	// caller's last host.
	Next string
	// Left counts the hosts the caller may see after this page.
	Left int
}

// MetricsRollup scrapes the metrics of the hosts c may see (an admin: every
// host), at most MaxMetricsHosts of them in id order from q, concurrently
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

// metricsHosts picks a rollup's hosts: q.Host alone, or the first
// MaxMetricsHosts of c's visible hosts after q.After, with where the next
// page starts.
func (f *Fleet) metricsHosts(ctx context.Context, c store.Caller, q MetricsQuery) ([]store.Host, MetricsPage, error) {
	if q.Host != "" && q.After != "" {
		return nil, MetricsPage{}, invalid("host and after: give one (host rolls up that host alone)")
	}
	if q.Host != "" {
		if err := checkID("host", q.Host); err != nil {
			return nil, MetricsPage{}, err
		}
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
	if q.After != "" {
		if err := checkID("after", q.After); err != nil {
			return nil, MetricsPage{}, err
		}
	}
	visible, err := f.Hosts(ctx, c)
	if err != nil {
		return nil, MetricsPage{}, err
	}
	start := sort.Search(len(visible), func(i int) bool { return visible[i].ID > q.After })
	hosts := visible[start:]
	var page MetricsPage
	if len(hosts) > MaxMetricsHosts {
		hosts = hosts[:MaxMetricsHosts]
		page.Next = hosts[len(hosts)-1].ID
		page.Left = len(visible) - start - MaxMetricsHosts
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
