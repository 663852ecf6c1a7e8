package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/runfleet/runfleet/shared/store"
)

// DefaultSweepConcurrency bounds the runs a sweep syncs at once.
const DefaultSweepConcurrency = 8

// SweepOptions bound one sweep.
type SweepOptions struct {
	// Until is the budget: no run is started, and no host call (a
	// recovery, a credential read, a state, a page of events) is started,
	// once the clock reaches it; a run stopped short keeps its progress.
	// Each host call is bounded by HostTimeout, so the sweep's host work is
	// over by Until + HostTimeout (leave that, and a margin for the last
	// writes, before the invocation's deadline). Zero: no budget (ctx alone
	// bounds the sweep).
	Until time.Time
	// PageSize is how many ids one read of the live index returns; zero is
	// store.DefaultLimit.
	PageSize int
	// Concurrency bounds the runs synced at once; zero is
	// DefaultSweepConcurrency.
	Concurrency int
}

// SweepReport counts what a sweep did. Every live run it read is counted
// once among Current, Drained, Lost, InFlight, Unreachable, Partial and
// Failed; Skipped counts the runs of the last page read that the budget
// left for the next sweep.
type SweepReport struct {
	// Pages and Live count the reads of the live index and the ids they
	// returned.
	Pages int `json:"pages"`
	Live  int `json:"live"`
	// Current: up to date and still live (or already drained).
	Current int `json:"current"`
	// Drained: left the live index in this sweep (terminal, final event
	// mirrored), dispatch_lost runs included.
	Drained int `json:"drained"`
	// Lost: the host denies the run.
	Lost int `json:"lost"`
	// InFlight: dispatching, before its deadline or within the grace.
	InFlight int `json:"inFlight"`
	// Recovered: dispatching runs resolved from their host (also counted
	// by what they became).
	Recovered int `json:"recovered"`
	// Unreachable: the host did not answer; the run stays live.
	Unreachable int `json:"unreachable"`
	// Partial: events still to mirror when the budget ran out.
	Partial int `json:"partial"`
	// Failed: another error (logged); the run stays as it was.
	Failed int `json:"failed"`
	// Events counts the events mirrored.
	Events int `json:"events"`
	// Extended counts the runs whose events' expiry was extended (a run
	// live over a week, retried, or drained long after its first events).
	Extended int `json:"extended"`
	// Skipped counts runs left unread because the budget ran out.
	Skipped int `json:"skipped"`
	// BudgetExhausted: the sweep stopped at Until, before the live index's end.
	BudgetExhausted bool `json:"budgetExhausted"`
}

// Sweep walks the live runs only, through the sparse live index in pages,
// and brings each up to date from its host (syncRun: state, events by
// cursor, recovery of dispatches past their deadline, lost for a run its
// host denies, drained once terminal with its final event mirrored). A run
// whose host does not answer stays live for the next sweep. It returns an
// error only when the live index cannot be read; per-run failures are
// logged and counted.
func (f *Fleet) Sweep(ctx context.Context, opts SweepOptions) (SweepReport, error) {
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultSweepConcurrency
	}
	var (
		rep   SweepReport
		mu    sync.Mutex
		hosts = newHostClients(f)
	)
	spent := func() bool {
		return ctx.Err() != nil || (!opts.Until.IsZero() && !f.clock.Now().Before(opts.Until))
	}
	cursor := ""
	for {
		if spent() {
			rep.BudgetExhausted = true
			break
		}
		page, err := f.store.ListLive(ctx, cursor, opts.PageSize)
		if err != nil {
			return rep, fmt.Errorf("fleet: sweep: reading the live index: %w", err)
		}
		rep.Pages++
		rep.Live += len(page.FleetRunIDs)

		ids := make(chan string)
		var wg sync.WaitGroup
		for w := 0; w < min(opts.Concurrency, len(page.FleetRunIDs)); w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for id := range ids {
					if spent() {
						mu.Lock()
						rep.Skipped++
						mu.Unlock()
						continue
					}
					res := f.sweepOne(ctx, id, hosts, opts.Until)
					mu.Lock()
					rep.count(res)
					mu.Unlock()
				}
			}()
		}
		for _, id := range page.FleetRunIDs {
			ids <- id
		}
		close(ids)
		wg.Wait()
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	if rep.Skipped > 0 {
		rep.BudgetExhausted = true
	}
	return rep, nil
}

// sweepOne syncs one run of the live index.
func (f *Fleet) sweepOne(ctx context.Context, id string, hosts *hostClients, until time.Time) syncResult {
	// Eventually consistent: every write the sync makes is conditional on
	// the version read, so a stale read costs a retry, never a lost update.
	run, err := f.store.GetRun(store.EventualRead(ctx), id)
	if errors.Is(err, store.ErrNotFound) {
		return syncResult{outcome: syncCurrent} // deleted since the index was read
	}
	if err != nil {
		f.log.Error("sweep: reading a run", logRun, id, logErr, err.Error())
		return syncResult{outcome: syncFailed, err: err}
	}
	_, res := f.syncRun(ctx, run, syncPass{hosts: hosts, until: until, extend: true})
	return res
}

func (r *SweepReport) count(res syncResult) {
	r.Events += res.events
	if res.recovered {
		r.Recovered++
	}
	if res.extended {
		r.Extended++
	}
	switch res.outcome {
	case syncCurrent:
		r.Current++
	case syncDrained:
		r.Drained++
	case syncLost:
		r.Lost++
	case syncInFlight:
		r.InFlight++
	case syncUnreachable:
		r.Unreachable++
	case syncPartial:
		r.Partial++
	case syncFailed:
		r.Failed++
	}
}
