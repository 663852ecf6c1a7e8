package fleet

import (
	"context"
	"errors"
	"sync"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/rollup"
	"github.com/runfleet/runfleet/shared/store"
)

// MetricsRollup scrapes the metrics of every host c may see, concurrently
// (at most ProbeConcurrency at once, each bounded by ProbeTimeout), and
// merges them (rollup.Merge): a caller limited to some hosts learns nothing
// of the others. Dropped families and failed scrapes are logged here; the
// rollup reports them too, per host (runfleet_rollup_dropped_families,
// runfleet_rollup_up).
func (f *Fleet) MetricsRollup(ctx context.Context, c store.Caller) (rollup.Result, error) {
	hosts, err := f.Hosts(ctx, c)
	if err != nil {
		return rollup.Result{}, err
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
	res := rollup.Merge(scrapes)
	if len(res.Dropped) > 0 {
		f.log.Warn("metrics rollup dropped families", "dropped", len(res.Dropped), "families", res.Dropped, logOwner, c.OwnerID)
	}
	for _, fail := range res.Failed {
		f.log.Warn("metrics rollup: a host's scrape failed", logHost, fail.Host, logReason, fail.Reason)
	}
	return res, nil
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
