package fleetapi

import "time"

// Capacity is GET /fleet/capacity (admin): per routing class, the runs
// waiting and the room the fleet has for them, as the metrics of the same
// names report them (namespace Runfleet, dimension RoutingClass).
type Capacity struct {
	At      time.Time       `json:"at"`
	Classes []ClassCapacity `json:"classes"`
}

// ClassCapacity is one routing class: the agent and the labels runs ask
// for, named as Class ("claude?pool=gpu"). Queued runs wait, the oldest
// for OldestWaitSeconds; FreeSlots and BusySlots sum the last probes of
// the Hosts routable for the class; DrainingHosts would be but drain.
type ClassCapacity struct {
	Class             string            `json:"class"`
	Agent             string            `json:"agent"`
	Labels            map[string]string `json:"labels,omitempty"`
	Queued            int               `json:"queued"`
	OldestWaitSeconds int64             `json:"oldestWaitSeconds"`
	FreeSlots         int               `json:"freeSlots"`
	BusySlots         int               `json:"busySlots"`
	Hosts             int               `json:"hosts"`
	DrainingHosts     int               `json:"drainingHosts"`
}
