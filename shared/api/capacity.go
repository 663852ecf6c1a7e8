package api

import (
	"context"
	"net/http"
	"time"

	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/fleetapi"
)

// capacity answers GET /fleet/capacity (admin): fleet.FleetCapacity, per
// routing class, as the probe's metrics of the same names report it.
func (h *Handler) capacity(ctx context.Context, _ *request) (int, any, error) {
	rep, err := h.fleet.FleetCapacity(ctx)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, toCapacity(rep), nil
}

// toCapacity is the report on the wire: the oldest wait in whole seconds
// (rounded down, as the metric is), classes an empty list when none.
func toCapacity(rep fleet.CapacityReport) fleetapi.Capacity {
	out := fleetapi.Capacity{At: rep.At, Classes: make([]fleetapi.ClassCapacity, len(rep.Classes))}
	for i, c := range rep.Classes {
		out.Classes[i] = fleetapi.ClassCapacity{
			Class: c.Class, Agent: c.Agent, Labels: c.Labels,
			Queued: c.Queued, OldestWaitSeconds: int64(c.OldestWait / time.Second),
			FreeSlots: c.FreeSlots, BusySlots: c.BusySlots, Hosts: c.Hosts, DrainingHosts: c.DrainingHosts,
		}
	}
	return out
}
