package fleetapi

import (
	"encoding/json"
	"fmt"
)

// Acceptance is whether a host took a verb Fleet forwarded to it: true,
// false or "unknown" on the wire.
type Acceptance int8

const (
	// Refused: the host refused it (4xx), or it certainly never reached
	// the host.
	Refused Acceptance = iota
	// Accepted: the host took it (2xx).
	Accepted
	// Unknown: no answer in time, or a host fault (5xx): the host may or
	// may not have acted.
	Unknown
)

// MarshalJSON writes true, false or "unknown".
func (a Acceptance) MarshalJSON() ([]byte, error) {
	switch a {
	case Accepted:
		return []byte("true"), nil
	case Refused:
		return []byte("false"), nil
	}
	return []byte(`"unknown"`), nil
}

// UnmarshalJSON reads true, false or "unknown"; null leaves a as it is.
func (a *Acceptance) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case "true":
		*a = Accepted
	case "false":
		*a = Refused
	case `"unknown"`:
		*a = Unknown
	case "null":
	default:
		return fmt.Errorf("fleetapi: accepted: want true, false or \"unknown\", got %s", b)
	}
	return nil
}

var (
	_ json.Marshaler   = Acceptance(0)
	_ json.Unmarshaler = (*Acceptance)(nil)
)

// Outcome is a host's answer to a verb Fleet forwarded (a run's input,
// cancel and retry; a host's drain and resume). HostStatus is the host's
// when it answered outside 2xx. Code is the host's code; for a refusal it
// is never empty: host_unavailable when the request certainly never
// reached the host, host_refused when the host refused without one.
// Detail says why for a refusal or an unknown outcome.
//
// The answer's status says the same: 200 accepted, 409 refused (the body
// is then also an error: InteractionRefused, HostDrainRefused), 202
// unknown (the host may or may not have acted).
type Outcome struct {
	Accepted   Acceptance `json:"accepted"`
	HostStatus int        `json:"hostStatus,omitempty"`
	Code       string     `json:"code,omitempty"`
	Detail     string     `json:"detail,omitempty"`
}
