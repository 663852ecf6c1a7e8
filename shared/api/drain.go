package api

import (
	"context"

	"github.com/runfleet/runfleet/shared/fleet"
)

// The host verbs through Fleet, POST /fleet/hosts/{id}/drain and /resume:
// the host's outcome as the run verbs show it, with the same statuses
// (outcomeStatus), its state as it answered (draining, and idle when it
// says), and the host as Fleet recorded it (fleetapi.HostDrain).

func (h *Handler) drainHost(ctx context.Context, rq *request) (int, any, error) {
	return h.hostDrainVerb(ctx, rq, "drain", h.fleet.DrainHost)
}

func (h *Handler) resumeHost(ctx context.Context, rq *request) (int, any, error) {
	return h.hostDrainVerb(ctx, rq, "resume", h.fleet.ResumeHost)
}

func (h *Handler) hostDrainVerb(ctx context.Context, rq *request, name string, verb func(context.Context, string) (fleet.HostDrain, error)) (int, any, error) {
	if err := noBody(rq.body); err != nil {
		return 0, nil, err
	}
	d, err := verb(ctx, rq.params["id"])
	if err != nil {
		return 0, nil, err
	}
	status, answer := toHostDrain(name, d)
	return status, answer, nil
}
