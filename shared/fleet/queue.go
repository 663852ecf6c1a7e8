package fleet

import (
	"context"
	"errors"
	"net/url"
	"time"
)

// Runs that wait for capacity (DESIGN.md, "Runs that wait").
//
// A dispatch that asks to wait (DispatchRequest.Queue, or Config.QueueDefault
// for one that does not say) and finds no eligible host that takes it now
// (routing found none, or every host it tried refused with a transient
// reason) is recorded queued, with the request it will be started with,
// and answered 202. Wakes (Wake) say that a host may have room: a run on
// it ended (Fleet sends one whenever it records a run's end), it became
// routable or showed free slots in a probe pass, or it was resumed or
// enabled. They travel through a Waker (SQS in AWS, an in-process queue in
// the local stack) to FillHosts, which offers each host with room the
// waiting runs it can take, in queue order, and offers each run to hosts
// in routing's order (the dispatch fallback's). A run is offered under a
// versioned update (queued -> dispatching on the host, still in the queue
// index), then started with its ClientToken; a dispatcher that dies in
// between leaves it dispatching in the index, and the next delivery for
// that host resumes the same start (same token, so the host starts it at
// most once). The sweep ends a run whose Until passed (queue_timeout) and
// takes back, to its place, a run whose offer was never delivered.

// QueueRequest is a dispatch's ask to wait: how long at most, and its
// priority in its class (higher first; store.QueuePriorityMin..Max).
type QueueRequest struct {
	Timeout  time.Duration
	Priority int
}

// DefaultQueueMaxTimeout bounds a wait when Config.QueueMaxTimeout is zero.
const DefaultQueueMaxTimeout = 24 * time.Hour

// Wake says that a host may have room for waiting runs.
type Wake struct {
	// HostID is the host.
	HostID string `json:"hostId"`
	// Slots is how many runs it may take: 1 for a run that ended, the
	// probe's free slots otherwise. FillHosts starts at most this many.
	Slots int `json:"slots"`
	// Reason says why, for logs and metrics: one of the Wake* reasons.
	Reason string `json:"reason"`
}

// Wake reasons.
const (
	WakeRunEnded = "run_ended"
	WakeProbe    = "probe"
	WakeResumed  = "resumed"
	WakeEnabled  = "enabled"
)

// Waker delivers wakes to FillHosts, at least once: SQS in AWS (the
// dispatcher function on its event source mapping), an in-process queue in
// the local stack. Wake may be called from any Fleet function; an error
// is logged by the caller, never fatal to what it was doing (the next
// probe pass finds a host with room that a lost wake did not announce).
type Waker interface {
	Wake(ctx context.Context, wakes []Wake) error
}

// FillReport is what one FillHosts did.
type FillReport struct {
	// Started are the runs a host took, in the order started.
	Started []string `json:"started,omitempty"`
	// Offered counts host start calls made (Started plus refusals).
	Offered int `json:"offered"`
	// Resumed counts offers a dead dispatcher had left unfinished.
	Resumed int `json:"resumed,omitempty"`
}

// errQueueTODO marks what issue 34 has still to build.
var errQueueTODO = errors.New("fleet: runs that wait are not built yet")

// FillHosts offers waiting runs to the hosts wakes name, at most Slots
// each. An error means a delivery should come again (the dispatcher
// reports the batch item failed): offers already made are kept.
func (f *Fleet) FillHosts(ctx context.Context, wakes []Wake) (FillReport, error) {
	return FillReport{}, errQueueTODO
}

// ClassOf is a run's routing class: its agent and the labels it asks for,
// as one string that names the class in the queue, the capacity figures
// and the metrics' RoutingClass dimension: the agent, then "?" and the
// labels as a sorted, escaped query ("claude?gpu=a100&pool=build"); the
// agent alone without labels. It never holds "#" (the store's separator).
func ClassOf(agent string, labels map[string]string) string {
	if len(labels) == 0 {
		return url.PathEscape(agent)
	}
	v := url.Values{}
	for k, val := range labels {
		v.Set(k, val)
	}
	return url.PathEscape(agent) + "?" + v.Encode()
}

// ParseClass is ClassOf's inverse.
func ParseClass(class string) (agent string, labels map[string]string, err error) {
	a, q, _ := cutQuery(class)
	if agent, err = url.PathUnescape(a); err != nil {
		return "", nil, err
	}
	if q == "" {
		return agent, nil, nil
	}
	v, err := url.ParseQuery(q)
	if err != nil {
		return "", nil, err
	}
	labels = make(map[string]string, len(v))
	for k, vals := range v {
		labels[k] = vals[0]
	}
	return agent, labels, nil
}

func cutQuery(s string) (before, after string, found bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == '?' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}
