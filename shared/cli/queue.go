package cli

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/runfleet/runfleet/shared/fleetapi"
)

// Runs that wait in Fleet's queue, as runfleet shows them, and the fleet's
// capacity per routing class.

// queuedLine is what run says of a dispatch that was queued.
func queuedLine(q *fleetapi.RunQueue) string {
	if q == nil {
		return "queued, waiting for an eligible host with room"
	}
	where := "in " + q.Class
	if q.Position > 0 {
		where = fmt.Sprintf("position %d in %s", q.Position, q.Class)
	}
	return fmt.Sprintf("queued: %s, waiting up to %s", where, q.Timeout)
}

// queueLine is a run's wait for a get's view: its place while it waits,
// how long it waited once a host took it, or that none did.
func queueLine(now time.Time, status string, q *fleetapi.RunQueue) string {
	if q == nil {
		return ""
	}
	class := q.Class
	if q.Priority != 0 {
		class += fmt.Sprintf(" (priority %d)", q.Priority)
	}
	waited := waitedOf(time.Duration(q.WaitedSeconds) * time.Second)
	switch {
	case q.StartedAt != nil:
		return fmt.Sprintf("waited %s in %s; started %s on %s", waited, class, stamp(now, *q.StartedAt), q.StartedOn)
	case status != fleetapi.StatusQueued && status != fleetapi.StatusDispatching:
		return fmt.Sprintf("waited %s in %s; never started", waited, class)
	}
	place := "in " + class
	if q.Position > 0 {
		place = fmt.Sprintf("position %d in %s", q.Position, class)
	}
	return fmt.Sprintf("%s, waiting since %s, until %s (timeout %s)", place, stamp(now, q.Since), untilOf(now, q.Until), q.Timeout)
}

// untilOf is a deadline and how far off it is.
func untilOf(now, t time.Time) string {
	left := t.Sub(now).Round(time.Second)
	if left <= 0 {
		return t.Local().Format(time.RFC3339) + " (passed)"
	}
	return fmt.Sprintf("%s (in %s)", t.Local().Format(time.RFC3339), left)
}

// waitedOf is a wait as a person reads it, to the second.
func waitedOf(d time.Duration) string { return d.Round(time.Second).String() }

// leftTheQueue reports a run's queued event (its first, recorded by the
// host that took it): where it went and how long it waited. Said off a
// terminal too, as the queued line was.
func (f *follower) leftTheQueue(data json.RawMessage) {
	var q struct {
		HostID   string `json:"hostId"`
		WaitedMs int64  `json:"waitedMs"`
	}
	if json.Unmarshal(data, &q) != nil {
		return
	}
	f.inv.ui.notef("run %s started on host %s after %s in the queue", f.runID, q.HostID, waitedOf(time.Duration(q.WaitedMs)*time.Millisecond))
}

func capacityCmd() *command {
	return &command{
		name: "capacity", summary: "Show the runs waiting and the room for them, per routing class (admin)",
		long: "Per routing class (an agent and the labels runs ask for), the runs queued and how long the oldest\n" +
			"has waited, and the free and busy slots, routable hosts and draining hosts that serve it\n" +
			"(GET /fleet/capacity): the figures Fleet also publishes as CloudWatch metrics for an autoscaler.",
		examples: []string{
			"runfleet capacity",
			"runfleet capacity --json | jq -r '.classes[] | select(.queued > .freeSlots) | .class'",
		},
		setup: func(fs *flagSet) func(*invocation) int {
			asJSON := fs.Bool("json", "print the API's answer as JSON")
			return func(inv *invocation) int { return inv.capacity(*asJSON) }
		},
	}
}

func (inv *invocation) capacity(asJSON bool) int {
	if err := inv.connect(); err != nil {
		return inv.fail(err)
	}
	cp, err := inv.client.Capacity(inv.ctx)
	if err != nil {
		return inv.fail(err)
	}
	if asJSON {
		if cp.Classes == nil {
			cp.Classes = []fleetapi.ClassCapacity{}
		}
		inv.ui.document(cp)
		return ExitOK
	}
	if len(cp.Classes) == 0 {
		inv.ui.notef("No routing class: no run waits and no host serves one.")
		return ExitOK
	}
	rows := make([][]cell, 0, len(cp.Classes))
	for _, c := range cp.Classes {
		queued, oldest := cell{text: strconv.Itoa(c.Queued)}, ""
		if c.Queued > 0 {
			queued.color = yellow
			oldest = waitedOf(time.Duration(c.OldestWaitSeconds) * time.Second)
		}
		rows = append(rows, []cell{plain(c.Class), queued, plain(oldest), plain(strconv.Itoa(c.FreeSlots)),
			plain(strconv.Itoa(c.BusySlots)), plain(strconv.Itoa(c.Hosts)), plain(strconv.Itoa(c.DrainingHosts))})
	}
	inv.ui.table([]string{"CLASS", "QUEUED", "OLDEST WAIT", "FREE", "BUSY", "HOSTS", "DRAINING"}, rows)
	return ExitOK
}
