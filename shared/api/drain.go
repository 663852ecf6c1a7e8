package api

import (
	"context"
	"net/http"

	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// drainAnswer is the answer of POST /fleet/hosts/{id}/drain and /resume:
// the host's outcome as the run verbs show it, its state as it answered
// (draining, and idle when it says), and the host as Fleet recorded it.
type drainAnswer struct {
	HostID string `json:"hostId"`
	hostproto.Outcome
	Draining bool     `json:"draining"`
	Idle     *bool    `json:"idle,omitempty"`
	Host     hostView `json:"host"`
}

func (h *Handler) drainHost(ctx context.Context, rq *request) (int, any, error) {
	return h.hostDrainVerb(ctx, rq, h.fleet.DrainHost)
}

func (h *Handler) resumeHost(ctx context.Context, rq *request) (int, any, error) {
	return h.hostDrainVerb(ctx, rq, h.fleet.ResumeHost)
}

func (h *Handler) hostDrainVerb(ctx context.Context, rq *request, verb func(context.Context, string) (fleet.HostDrain, error)) (int, any, error) {
	if err := noBody(rq.body); err != nil {
		return 0, nil, err
	}
	d, err := verb(ctx, rq.params["id"])
	if err != nil {
		return 0, nil, err
	}
	a := drainAnswer{HostID: d.Host.ID, Outcome: d.Outcome, Host: toHostView(d.Host, true)}
	if p := d.Host.Probe; p != nil {
		a.Draining, a.Idle = p.Draining, p.Idle
	}
	if d.Outcome.Accepted == hostproto.Accepted {
		a.Draining, a.Idle = d.State.Draining, d.State.Idle
	}
	return http.StatusOK, a, nil
}
