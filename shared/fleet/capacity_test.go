package fleet

import (
	"reflect"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/store"
)

// loaded is healthyHost (routing_test.go) with labels and a load.
func loaded(id string, labels map[string]string, active, max int) store.Host {
	h := healthyHost(id)
	h.Labels = labels
	h.Probe.Load = &store.Load{Active: active, MaxConcurrent: max}
	return h
}

// TestCapacityCountsWhatRoutingWouldOffer: per class, the hosts routing
// would offer a run of the class (and only those) give their slots; a
// host excluded for draining alone is counted as draining, one excluded
// for more (draining and disabled) is not; the queue's figures are the
// class's; classes come from the queue, the configuration and the agents
// ok hosts offer, ordered.
func TestCapacityCountsWhatRoutingWouldOffer(t *testing.T) {
	ci := map[string]string{"pool": "ci"}
	gpu := map[string]string{"pool": "gpu"}
	draining := loaded("d1", ci, 0, 2)
	draining.Probe.Draining = true
	drainingOff := loaded("d2", ci, 0, 2)
	drainingOff.Probe.Draining = true
	drainingOff.Enabled = false
	stale := loaded("s1", ci, 0, 4)
	stale.Probe.At = routeNow.Add(-10 * time.Minute)
	low := loaded("l1", ci, 0, 4)
	low.Probe.Storage = &store.Storage{Low: true}
	claude := loaded("c1", gpu, 1, 1)
	claude.Probe.Agents = []string{"claude", "shell"}
	noLoad := healthyHost("n1")
	noLoad.Labels = ci
	down := loaded("x1", ci, 0, 4)
	down.Probe.Status = store.ProbeUnreachable
	down.Probe.Agents = []string{"codex"}
	hosts := []store.Host{loaded("h1", ci, 1, 4), loaded("h2", ci, 3, 2), draining, drainingOff, stale, low, claude, noLoad, down}

	shellCI := ClassOf("shell", ci)
	claudeGPU := ClassOf("claude", gpu)
	got := Capacity(CapacityInput{
		Hosts: hosts,
		Queued: map[string]store.QueueStats{
			shellCI:   {Waiting: 3, Oldest: routeNow.Add(-95 * time.Second)},
			claudeGPU: {Waiting: 1, Oldest: routeNow.Add(-2 * time.Second)},
		},
		Classes:     []string{ClassOf("shell", gpu)},
		Now:         routeNow,
		MaxProbeAge: 5 * time.Minute,
	})
	want := []ClassCapacity{
		// c1 offers claude; the queue names claude?pool=gpu.
		{Class: "claude", Agent: "claude", Hosts: 1, BusySlots: 1},
		{Class: claudeGPU, Agent: "claude", Labels: gpu, Queued: 1, OldestWait: 2 * time.Second, Hosts: 1, BusySlots: 1},
		// Every routable shell host: h1 (3 free, 1 busy), h2 (over its
		// max: 0 free, 3 busy), c1 (full), n1 (no load: no slot known).
		{Class: "shell", Agent: "shell", Hosts: 4, FreeSlots: 3, BusySlots: 5, DrainingHosts: 1},
		{Class: shellCI, Agent: "shell", Labels: ci, Queued: 3, OldestWait: 95 * time.Second, Hosts: 3, FreeSlots: 3, BusySlots: 4, DrainingHosts: 1},
		{Class: ClassOf("shell", gpu), Agent: "shell", Labels: gpu, Hosts: 1, BusySlots: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("capacity:\n%+v\nwant\n%+v", got, want)
	}
}

// TestCapacityOfNothing: no host, nothing queued, no class configured:
// no class; a configured class with no host is reported, all zeros.
func TestCapacityOfNothing(t *testing.T) {
	if got := Capacity(CapacityInput{Now: routeNow, MaxProbeAge: time.Minute}); len(got) != 0 {
		t.Fatalf("capacity of nothing: %+v", got)
	}
	got := Capacity(CapacityInput{Classes: []string{"claude?pool=gpu"}, Now: routeNow, MaxProbeAge: time.Minute})
	want := []ClassCapacity{{Class: "claude?pool=gpu", Agent: "claude", Labels: map[string]string{"pool": "gpu"}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("a configured class: %+v, want %+v", got, want)
	}
}
