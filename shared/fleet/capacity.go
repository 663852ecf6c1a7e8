package fleet

import (
	"context"
	"time"

	"github.com/runfleet/runfleet/shared/store"
)

// ClassCapacity is one routing class's demand and supply (GET
// /fleet/capacity, and the metrics of the same names, dimension
// RoutingClass): what an autoscaler acts on.
type ClassCapacity struct {
	Class  string
	Agent  string
	Labels map[string]string
	// Queued runs wait in the class; OldestWait is the longest of them
	// has waited (zero when none).
	Queued     int
	OldestWait time.Duration
	// FreeSlots and BusySlots sum, over the hosts routable for the class
	// (enabled, an ok probe no older than ProbeMaxAge, not draining,
	// storage not low, offering the agent, carrying the labels), their last
	// probe's maxConcurrent - active and active.
	FreeSlots int
	BusySlots int
	// Hosts counts those routable hosts; DrainingHosts the hosts that
	// would be routable for the class but for draining.
	Hosts         int
	DrainingHosts int
}

// CapacityInput is what Capacity is computed from. Pure: no I/O, no clock.
type CapacityInput struct {
	Hosts []store.Host
	// Queued are the classes with waiting runs.
	Queued map[string]store.QueueStats
	// Classes are classes reported even when nothing waits in them
	// (Config.CapacityClasses); every agent an ok host offers is reported
	// too, without labels.
	Classes     []string
	Now         time.Time
	MaxProbeAge time.Duration
}

// Capacity computes every class's figures, ordered by class.
func Capacity(in CapacityInput) []ClassCapacity {
	return nil
}

// CapacityReport is GET /fleet/capacity.
type CapacityReport struct {
	At      time.Time
	Classes []ClassCapacity
}

// FleetCapacity reads the hosts and the queue's classes and computes
// Capacity now.
func (f *Fleet) FleetCapacity(ctx context.Context) (CapacityReport, error) {
	return CapacityReport{}, errQueueTODO
}
