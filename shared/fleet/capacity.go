package fleet

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/runfleet/runfleet/shared/store"
)

// Capacity is the fleet's demand and supply per routing class: what waits
// (the queue index's stats) against what the hosts routable for the class
// have free (their last probes' load). It is what an autoscaler acts on:
// GET /fleet/capacity, and the probe pass's metrics of the same names
// (scheduled.Jobs.Probe). Routable means what routing means (exclusions),
// so that the figures never count a host routing would not offer a run.

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
	// Published: the probe's metrics carry the class. It is one of the
	// classes always reported (Config.CapacityClasses), or a host is
	// routable or draining for it now. A class that only waiting runs
	// name, which no host serves and the operator did not declare, is left
	// out of the metrics (any caller can name one with a label value, and
	// each is a set of custom metrics CloudWatch bills by the month), not
	// out of GET /fleet/capacity.
	Published bool
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

// Capacity computes every class's figures, ordered by class. A host
// routable for the class counts its slots from its probe's load; one older
// than the load field (nil) counts as a host with no slot known, so an
// autoscaler never counts on room it cannot see. A class that does not
// parse (ParseClass) is reported with what waits in it and no host.
func Capacity(in CapacityInput) []ClassCapacity {
	classes := map[string]bool{}
	for c := range in.Queued {
		classes[c] = true
	}
	for _, c := range in.Classes {
		classes[c] = true
	}
	for _, h := range in.Hosts {
		if h.Probe != nil && h.Probe.Status == store.ProbeOK {
			for _, a := range h.Probe.Agents {
				classes[ClassOf(a, nil)] = true
			}
		}
	}
	out := make([]ClassCapacity, 0, len(classes))
	for _, class := range slices.Sorted(maps.Keys(classes)) {
		cc := ClassCapacity{Class: class, Published: slices.Contains(in.Classes, class)}
		if q, ok := in.Queued[class]; ok && q.Waiting > 0 {
			cc.Queued = q.Waiting
			if !q.Oldest.IsZero() {
				cc.OldestWait = max(in.Now.Sub(q.Oldest), 0)
			}
		}
		agent, labels, err := ParseClass(class)
		if err != nil {
			out = append(out, cc)
			continue
		}
		cc.Agent, cc.Labels = agent, labels
		route := RouteInput{Agent: agent, Labels: labels, Now: in.Now, MaxProbeAge: in.MaxProbeAge}
		for _, h := range in.Hosts {
			reasons, _ := exclusions(route, h, "")
			switch {
			case len(reasons) == 0:
				cc.Hosts++
				if l := h.Probe.Load; l != nil {
					cc.BusySlots += max(l.Active, 0)
					cc.FreeSlots += max(l.MaxConcurrent-l.Active, 0)
				}
			case len(reasons) == 1 && reasons[0] == ExcludedDraining:
				cc.DrainingHosts++
			}
		}
		cc.Published = cc.Published || cc.Hosts > 0 || cc.DrainingHosts > 0
		out = append(out, cc)
	}
	return out
}

// CapacityReport is GET /fleet/capacity.
type CapacityReport struct {
	At      time.Time
	Classes []ClassCapacity
}

// FleetCapacity reads the hosts and the queue's classes and computes
// Capacity now: one scan of the hosts, one read of the queue's classes
// and one of each class's stats. The probes it reads are the records the
// probe pass keeps (a quiet host's up to ProbeRefresh old, every material
// change written at once), so it agrees with the pass's metrics.
func (f *Fleet) FleetCapacity(ctx context.Context) (CapacityReport, error) {
	hosts, err := f.store.ListHosts(ctx)
	if err != nil {
		return CapacityReport{}, fmt.Errorf("fleet: listing hosts for the capacity: %w", err)
	}
	queued, _, err := f.queueStats(ctx)
	if err != nil {
		return CapacityReport{}, err
	}
	now := f.clock.Now()
	return CapacityReport{At: now.UTC(), Classes: f.capacity(hosts, queued, now)}, nil
}

// capacity is Capacity over hosts with f's configuration.
func (f *Fleet) capacity(hosts []store.Host, queued map[string]store.QueueStats, now time.Time) []ClassCapacity {
	return Capacity(CapacityInput{Hosts: hosts, Queued: queued, Classes: f.cfg.CapacityClasses, Now: now, MaxProbeAge: f.cfg.ProbeMaxAge})
}

// queueStats reads the classes with waiting runs and each one's stats;
// waiting lists the classes whose stats still count a waiting run (the
// index is eventually consistent: a class may have emptied since).
func (f *Fleet) queueStats(ctx context.Context) (stats map[string]store.QueueStats, waiting []string, err error) {
	classes, err := f.queueClasses(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("fleet: reading the queue's classes: %w", err)
	}
	stats = make(map[string]store.QueueStats, len(classes))
	for _, c := range classes {
		st, err := f.store.QueueStats(ctx, c)
		if err != nil {
			return nil, nil, fmt.Errorf("fleet: reading the queue of class %q: %w", c, err)
		}
		stats[c] = st
		if st.Waiting > 0 {
			waiting = append(waiting, c)
		}
	}
	return stats, waiting, nil
}
