// Package wake owns how a wake (fleet.Wake: a host may have room for runs
// that wait) travels from where Fleet learns of the room to
// Fleet.FillHosts: the message that carries it, the SQS sender Fleet's
// functions wake through in AWS (SQS), the dispatcher function's handler
// that the queue's event source mapping invokes with a batch of messages
// (Dispatcher), and the local stack's in-process queue, which drives that
// same handler as the mapping would, visibility timeout and redelivery
// included (Local).
//
// Delivery is at least once and needs nothing more: FillHosts offers a run
// under a versioned update and starts it with the run's clientToken, so a
// wake delivered twice, or a delivery whose dispatcher died mid-start and
// that comes again after the visibility timeout, starts each run once.
// A wake lost between Fleet's write and its send costs at most one probe
// interval: the probe pass wakes every routable host with free slots that
// serves a class with waiting runs (DESIGN.md, "Runs that wait").
package wake

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/runfleet/runfleet/shared/fleet"
)

// messageVersion is the format of a message's body (its "v").
const messageVersion = 1

// message is a wake as a queue carries it: fleet.Wake's fields and the
// format's version. Messages outlive the function that sent them (a deploy
// between the send and the delivery), hence the version.
type message struct {
	V      int    `json:"v"`
	HostID string `json:"hostId"`
	Slots  int    `json:"slots"`
	Reason string `json:"reason"`
}

// errBadWake is a wake that names no host or no slot: a caller's bug,
// refused before anything is sent.
var errBadWake = errors.New("wake: a wake names a host and at least one slot")

// encode is w as a message body.
func encode(w fleet.Wake) (string, error) {
	if w.HostID == "" || w.Slots < 1 {
		return "", fmt.Errorf("%w: %+v", errBadWake, w)
	}
	b, err := json.Marshal(message{V: messageVersion, HostID: w.HostID, Slots: w.Slots, Reason: w.Reason})
	return string(b), err
}

// decode reads a message body: strictly (an unknown field, another
// version, a missing host or slot is an error), since a body that is not
// ours must not pass for a wake.
func decode(body string) (fleet.Wake, error) {
	dec := json.NewDecoder(bytes.NewReader([]byte(body)))
	dec.DisallowUnknownFields()
	var m message
	if err := dec.Decode(&m); err != nil {
		return fleet.Wake{}, fmt.Errorf("wake: not a wake message: %w", err)
	}
	if dec.More() {
		return fleet.Wake{}, errors.New("wake: not a wake message: more after the JSON object")
	}
	switch {
	case m.V != messageVersion:
		return fleet.Wake{}, fmt.Errorf("wake: message version %d, want %d", m.V, messageVersion)
	case m.HostID == "" || m.Slots < 1:
		return fleet.Wake{}, fmt.Errorf("wake: message for host %q with %d slots: want a host and at least one slot", m.HostID, m.Slots)
	}
	return fleet.Wake{HostID: m.HostID, Slots: m.Slots, Reason: m.Reason}, nil
}

// coalesce merges wakes of one host into one (their slots added; the first
// one's reason), keeping the order hosts first appear in: a sweep that
// ends three runs on a host sends one message, not three, and a batch
// fills each host once.
func coalesce(wakes []fleet.Wake) []fleet.Wake {
	var out []fleet.Wake
	at := map[string]int{}
	for _, w := range wakes {
		if i, ok := at[w.HostID]; ok {
			out[i].Slots += w.Slots
			continue
		}
		at[w.HostID] = len(out)
		out = append(out, w)
	}
	return out
}

// encodeAll checks and encodes wakes, coalesced, as message bodies.
func encodeAll(wakes []fleet.Wake) ([]string, error) {
	bodies := make([]string, 0, len(wakes))
	for _, w := range wakes {
		if w.HostID == "" || w.Slots < 1 {
			return nil, fmt.Errorf("%w: %+v", errBadWake, w)
		}
	}
	for _, w := range coalesce(wakes) {
		b, err := encode(w)
		if err != nil {
			return nil, err
		}
		bodies = append(bodies, b)
	}
	return bodies, nil
}
