package policy

import (
	"fmt"
	"slices"
)

// Egress modes (config.EgressOpen / EgressStrict).
const (
	EgressOpen   = "open"
	EgressStrict = "strict"
)

// ConnectAction is what the proxy does with a CONNECT.
type ConnectAction int

// Connect actions; the zero value refuses.
const (
	Refuse ConnectAction = iota
	Intercept
	Tunnel
)

func (a ConnectAction) String() string {
	return [...]string{"refuse", "intercept", "tunnel"}[a]
}

// ConnectInput is everything the CONNECT decision looks at.
type ConnectInput struct {
	Target  Authority
	Granted []Granted
	Egress  string
}

// ConnectDecision is the CONNECT decision with a human reason.
type ConnectDecision struct {
	Action ConnectAction
	Reason string
}

// DecideConnect decides a CONNECT before anything is resolved: intercept a
// target one of the task's keys may reach; refuse a name a key reaches but on
// another port; tunnel anything else when egress is open; refuse otherwise.
func DecideConnect(in ConnectInput) ConnectDecision {
	if d, ok := in.Target.Domain(); ok {
		nameKnown := false
		for i := range in.Granted {
			if in.Granted[i].Reaches(d) {
				return ConnectDecision{Intercept, "a key of this task may reach " + d.String()}
			}
			nameKnown = nameKnown || slices.ContainsFunc(in.Granted[i].Domains, func(x Domain) bool { return x.Name == d.Name })
		}
		if nameKnown {
			return ConnectDecision{Refuse, fmt.Sprintf("no key of this task names port %d of %s", d.Port, d.Name)}
		}
	}
	if in.Egress == EgressOpen {
		return ConnectDecision{Tunnel, "no key of this task reaches " + in.Target.String() + "; egress is open"}
	}
	return ConnectDecision{Refuse, "no key of this task reaches " + in.Target.String() + "; egress is strict"}
}

// Occurrence is one placeholder found in a request: whose it is, which key it
// stands for, and where it was found.
type Occurrence struct {
	Owner    string
	Ref      KeyRef
	Location Location
}

// SubstituteInput is everything the decision about one occurrence looks at.
type SubstituteInput struct {
	Task       string
	Authority  Authority
	Granted    []Granted
	Occurrence Occurrence
}

// SubstituteDecision says whether an occurrence is replaced by its real value
// or blocks the request, with a reason that never holds a value or a
// placeholder.
type SubstituteDecision struct {
	Allow  bool
	Reason string
}

// DecideSubstitution allows a placeholder only when it is the task's own, its
// key is granted now, the request goes to one of the key's domains and the
// location is one the key allows. Anything else blocks.
func DecideSubstitution(in SubstituteInput) SubstituteDecision {
	oc := in.Occurrence
	if oc.Owner != in.Task {
		return SubstituteDecision{false, "a placeholder of another task"}
	}
	i := slices.IndexFunc(in.Granted, func(g Granted) bool { return g.Ref == oc.Ref })
	if i < 0 {
		return SubstituteDecision{false, fmt.Sprintf("key %s is not granted to this task", oc.Ref)}
	}
	g := &in.Granted[i]
	d, ok := in.Authority.Domain()
	if !ok || !g.Reaches(d) {
		return SubstituteDecision{false, fmt.Sprintf("key %s may not reach %s", oc.Ref, in.Authority)}
	}
	if g.In&oc.Location == 0 {
		return SubstituteDecision{false, fmt.Sprintf("key %s found in the %s; it is substituted only in the %s", oc.Ref, oc.Location, g.In)}
	}
	// The hot path: a static reason, nothing formatted per request.
	return SubstituteDecision{true, "allowed"}
}
