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
	// Intercept serves a target a key of the task may reach: its requests
	// are scanned and substituted, its answers scrubbed.
	Intercept
	// Tunnel relays a target no key of the task reaches, untouched.
	Tunnel
	// InterceptToScrub serves a target no key of the task reaches through
	// the pipeline all the same, so that its answers are scrubbed: the task
	// holds a key an upstream may store (HoldsStorable), which it could
	// otherwise fetch back through a tunnel. Nothing is substituted there
	// (no key reaches it); a placeholder sent there blocks the request.
	// What cannot be read (not TLS, a client that refuses the proxy's leaf)
	// is refused, for the reason StorableEgressRule.
	InterceptToScrub
	// TerminateSSH serves a target an ssh key of the task reaches: edge's
	// SSH front answers the task and runs, with the real key, each git
	// command DecideSSHExec allows.
	TerminateSSH
)

func (a ConnectAction) String() string {
	return [...]string{"refuse", "intercept", "tunnel", "intercept to scrub", "terminate ssh"}[a]
}

// Storable is the locations whose values an upstream may keep and hand
// back later: a URL or a body is what services store (a gist, a note, a
// request log, a saved conversation), whereas a header carries the
// credential the upstream checks. Issue 27 item 4.
const Storable = InURL | InBody

// HoldsStorable reports whether any of the keys may be substituted in a
// Storable location.
func HoldsStorable(granted []Granted) bool {
	return slices.ContainsFunc(granted, func(g Granted) bool { return g.In&Storable != 0 })
}

// StorableEgressRule is why a connection of a task that HoldsStorable is
// refused under open egress when the proxy cannot read it: a connection
// that is not TLS, a client that refuses the proxy's leaf, an IP address
// (no name to issue a leaf for).
const StorableEgressRule = "this run holds keys an upstream may store (in a url or body); only TLS the proxy can read may leave under open egress"

// ConnectInput is everything the CONNECT decision looks at.
type ConnectInput struct {
	Target Authority
	// Granted is the task's keys under the policy in force; whether one of
	// them HoldsStorable decides what open egress does elsewhere.
	Granted []Granted
	Egress  string
}

// ConnectDecision is the CONNECT decision with a human reason.
type ConnectDecision struct {
	Action ConnectAction
	Reason string
}

// DecideConnect decides a CONNECT before anything is resolved: intercept a
// target one of the task's keys may reach (terminate SSH there for an ssh
// key; Compile keeps a domain SSH for every key or for none); refuse a name a key reaches but on
// another port; refuse anything else when egress is strict. With egress
// open, anything else is tunnelled, unless the task holds a key an upstream
// may store (HoldsStorable): then a name is intercepted to scrub its answers
// and an IP address, which has no name to intercept, is refused.
func DecideConnect(in ConnectInput) ConnectDecision {
	if d, ok := in.Target.Domain(); ok {
		nameKnown := false
		for i := range in.Granted {
			if in.Granted[i].Reaches(d) {
				if in.Granted[i].SSH != nil {
					return ConnectDecision{TerminateSSH, "an ssh key of this task may reach " + d.String()}
				}
				return ConnectDecision{Intercept, "a key of this task may reach " + d.String()}
			}
			nameKnown = nameKnown || slices.ContainsFunc(in.Granted[i].Domains, func(x Domain) bool { return x.Name == d.Name })
		}
		if nameKnown {
			return ConnectDecision{Refuse, fmt.Sprintf("no key of this task names port %d of %s", d.Port, d.Name)}
		}
	}
	nowhere := "no key of this task reaches " + in.Target.String()
	switch {
	case in.Egress != EgressOpen:
		return ConnectDecision{Refuse, nowhere + "; egress is strict"}
	case !HoldsStorable(in.Granted):
		return ConnectDecision{Tunnel, nowhere + "; egress is open"}
	case in.Target.Name == "":
		return ConnectDecision{Refuse, nowhere + " and an IP address cannot be intercepted; " + StorableEgressRule}
	}
	return ConnectDecision{InterceptToScrub, nowhere + "; egress is open, and this run holds keys an upstream may store (in a url or body), so its answers are scrubbed"}
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
