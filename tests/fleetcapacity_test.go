package tests

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/scheduled"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// TestCapacityRouteAndMetricsCarryTheScenario: on both stores, a fleet
// of hosts with labels and slots, some busy with runs, one drained
// through Fleet, and runs of two classes queued through the API while the
// fake clock moves. GET /fleet/capacity answers exactly the scenario's
// figures, and so do the probe job's EMF lines, one per class; the oldest
// wait moves with the clock; a caller who is not an admin is refused.
func TestCapacityRouteAndMetricsCarryTheScenario(t *testing.T) {
	for _, kind := range []string{"bolt", "dynamodb"} {
		t.Run(kind, func(t *testing.T) {
			var metrics syncbuf.Buffer
			s := newStack(t, kind, stackOptions{metrics: &metrics,
				env: map[string]string{config.EnvCapacityClasses: "shell?pool=build"}})
			ci := map[string]any{"labels": map[string]string{"pool": "ci"}}
			s.addHost(t, "a", fakehost.Config{MaxConcurrent: 2}, ci)
			s.addHost(t, "b", fakehost.Config{MaxConcurrent: 1}, ci)
			s.addHost(t, "d", fakehost.Config{MaxConcurrent: 3}, ci)
			s.addHost(t, "c", fakehost.Config{MaxConcurrent: 4}, map[string]any{"labels": map[string]string{"pool": "build"}})
			s.addHost(t, "g", fakehost.Config{MaxConcurrent: 1, Agents: []string{"shell", "claude"}}, map[string]any{"labels": map[string]string{"pool": "gpu"}})
			for _, id := range []string{"a", "b", "d", "c", "g"} {
				s.probe(t, id)
			}
			s.must(t, http.StatusOK, "POST", "/fleet/hosts/d/drain", adminToken, "")
			alice := s.mint(t, "alice", "*", "*")
			// a and b full, g busy.
			for _, run := range []string{`{"agent":"shell","host":"a"}`, `{"agent":"shell","host":"a"}`, `{"agent":"shell","host":"b"}`, `{"agent":"claude","host":"g"}`} {
				s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, run)
			}
			queue := func(body string) {
				t.Helper()
				if a := s.must(t, http.StatusAccepted, "POST", "/fleet/runs", alice, body); a.str("status") != fleetapi.StatusQueued {
					t.Fatalf("dispatch %s: %s, want it queued", body, a.raw)
				}
			}
			queue(`{"agent":"shell","labels":{"pool":"ci"},"queue":{"timeout":"30m"}}`)
			s.clk.Advance(30 * time.Second)
			queue(`{"agent":"shell","labels":{"pool":"ci"},"queue":{"timeout":"30m"}}`)
			queue(`{"agent":"claude","labels":{"pool":"gpu"},"queue":{"timeout":"30m","priority":5}}`)
			s.clk.Advance(60 * time.Second)

			// The probe job: each host's load as its runs make it.
			sum, err := s.app.Jobs.Probe(context.Background(), events.EventBridgeEvent{})
			if err != nil || sum.Probed != 5 || sum.Wakes != 0 {
				t.Fatalf("probe job: %+v, %v (no host has room for a waiting run)", sum, err)
			}
			ciLabels, gpu := map[string]string{"pool": "ci"}, map[string]string{"pool": "gpu"}
			want := []fleetapi.ClassCapacity{
				{Class: "claude", Agent: "claude", Hosts: 1, BusySlots: 1},
				{Class: "claude?pool=gpu", Agent: "claude", Labels: gpu, Queued: 1, OldestWaitSeconds: 60, Hosts: 1, BusySlots: 1},
				// a (2 busy), b (1 busy), c (4 free), g (1 busy); d draining.
				{Class: "shell", Agent: "shell", Hosts: 4, FreeSlots: 4, BusySlots: 4, DrainingHosts: 1},
				{Class: "shell?pool=build", Agent: "shell", Labels: map[string]string{"pool": "build"}, Hosts: 1, FreeSlots: 4},
				{Class: "shell?pool=ci", Agent: "shell", Labels: ciLabels, Queued: 2, OldestWaitSeconds: 90, Hosts: 2, BusySlots: 3, DrainingHosts: 1},
			}
			got := capacityOf(t, s, adminToken)
			if !got.At.Equal(s.clk.Now()) || !reflect.DeepEqual(got.Classes, want) {
				t.Fatalf("GET /fleet/capacity at %v:\n%+v\nwant at %v\n%+v", got.At, got.Classes, s.clk.Now(), want)
			}
			lines := capacityLines(t, metrics.String(), s.clk.Now())
			if !reflect.DeepEqual(lines, want) {
				t.Fatalf("the probe's metric lines:\n%+v\nwant\n%+v", lines, want)
			}

			// 45 s on, the waits have grown; nothing else has.
			s.clk.Advance(45 * time.Second)
			want[1].OldestWaitSeconds, want[4].OldestWaitSeconds = 105, 135
			if got := capacityOf(t, s, adminToken); !reflect.DeepEqual(got.Classes, want) {
				t.Fatalf("45 s later:\n%+v\nwant\n%+v", got.Classes, want)
			}
			if a := s.do(t, "GET", "/fleet/capacity", alice, ""); a.status != http.StatusForbidden {
				t.Fatalf("a caller's GET /fleet/capacity: %d %s, want 403", a.status, a.raw)
			}
		})
	}
}

// capacityOf is GET /fleet/capacity with token, decoded strictly.
func capacityOf(t *testing.T, s *stack, token string) fleetapi.Capacity {
	t.Helper()
	a := s.must(t, http.StatusOK, "GET", "/fleet/capacity", token, "")
	var c fleetapi.Capacity
	dec := json.NewDecoder(strings.NewReader(a.raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("capacity answer %s: %v", a.raw, err)
	}
	return c
}

// capacityLines reads the probe's capacity EMF lines (each at at, one
// directive of namespace Runfleet, dimension RoutingClass, the six
// metrics) back into the API's form, in the order written.
func capacityLines(t *testing.T, out string, at time.Time) []fleetapi.ClassCapacity {
	t.Helper()
	var classes []fleetapi.ClassCapacity
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var doc struct {
			RoutingClass                        string
			QueuedRuns, OldestQueuedWaitSeconds float64
			FreeSlots, BusySlots                float64
			DrainingHosts, RoutableHosts        float64
			AWS                                 struct {
				Timestamp         int64
				CloudWatchMetrics []struct {
					Namespace  string
					Dimensions [][]string
					Metrics    []struct{ Name, Unit string }
				}
			} `json:"_aws"`
		}
		dec := json.NewDecoder(strings.NewReader(l))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&doc); err != nil {
			t.Fatalf("metric line %s: %v", l, err)
		}
		d := doc.AWS.CloudWatchMetrics
		if doc.AWS.Timestamp != at.UnixMilli() || len(d) != 1 || d[0].Namespace != "Runfleet" ||
			!reflect.DeepEqual(d[0].Dimensions, [][]string{{scheduled.DimensionRoutingClass}}) || len(d[0].Metrics) != 6 {
			t.Fatalf("metric line %s", l)
		}
		c := fleetapi.ClassCapacity{Class: doc.RoutingClass, Queued: int(doc.QueuedRuns), OldestWaitSeconds: int64(doc.OldestQueuedWaitSeconds),
			FreeSlots: int(doc.FreeSlots), BusySlots: int(doc.BusySlots), Hosts: int(doc.RoutableHosts), DrainingHosts: int(doc.DrainingHosts)}
		// The line names the class; its agent and labels are the class's.
		var err error
		if c.Agent, c.Labels, err = fleet.ParseClass(c.Class); err != nil {
			t.Fatalf("metric line %s: class: %v", l, err)
		}
		classes = append(classes, c)
	}
	if len(classes) == 0 {
		t.Fatalf("no metric line in %q", out)
	}
	return classes
}
