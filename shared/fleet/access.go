package fleet

import (
	"context"
	"errors"
	"fmt"

	"github.com/runfleet/runfleet/shared/auth"
	"github.com/runfleet/runfleet/shared/store"
)

// Log field names of the package (runs, verbs, the sweep and the mirror,
// probes, the metrics rollup).
const (
	logRun      = "fleetRunId"
	logHost     = "host"
	logChildRun = "childRunId"
	logOwner    = "ownerId"
	logErr      = "err"
	logStatus   = "status"
	logReason   = "reason"
	logAttempt  = "attempt"
	logDoing    = "doing"
	logVerb     = "verb"
	logSequence = "sequence"
	logCursor   = "cursor"
	logClass    = "class"
)

// RunFor returns the run c may read and act on, as stored. It is the one
// scope check of every per-run route (GET, the verbs, events, the stream):
// an unknown run and another owner's run are both 404 (another owner's
// run's existence is not the caller's business); a run on a host outside
// c's allowedHosts is 403 naming the host. An admin may act on any run. An
// id of another shape than a run id is 404 before any store call.
func (f *Fleet) RunFor(ctx context.Context, c store.Caller, id string) (store.Run, error) {
	if e := runPathID(id); e != nil {
		return store.Run{}, e
	}
	run, err := f.store.GetRun(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !auth.CanSeeRun(c, run)) {
		return store.Run{}, notFound("run %q does not exist", id)
	}
	if err != nil {
		return store.Run{}, fmt.Errorf("fleet: reading run %s: %w", id, err)
	}
	// A queued run is on no host (HostID empty): its owner's alone.
	if run.HostID != "" && !auth.CanUseHost(c, run.HostID) {
		return store.Run{}, forbidden("run %q is on host %q, which is not in this caller's allowedHosts", id, run.HostID)
	}
	return run, nil
}
