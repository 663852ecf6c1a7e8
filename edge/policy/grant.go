package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/runfleet/runfleet/shared/runspec"
)

// Granted is a key a task may use right now: the host's key, its domains
// narrowed to those the task declared.
type Granted struct {
	Ref     KeyRef
	Domains []Domain
	// Source is where the key's value comes from: the host's sources, or
	// the run's values from Fleet (SourceFleet).
	Source      Source
	In          Location
	Placeholder Shape
	// AWS is the key's bounds when it is of kind aws, nil otherwise.
	AWS *AWSKey
	// SSH is the key's bounds when it is of kind ssh, nil otherwise.
	SSH *SSHKey
	// Rules decide the requests that carry the key (DecideRequest); nil
	// for none.
	Rules *Rules
}

// Reaches reports whether the key may be sent to d.
func (g *Granted) Reaches(d Domain) bool { return slices.Contains(g.Domains, d) }

// Refusal says why a declared key is not granted.
type Refusal struct {
	Ref    KeyRef
	Reason string
}

func (r Refusal) String() string { return r.Ref.String() + ": " + r.Reason }

// Grant intersects a task's declared secrets (runspec.Request.Declare) with
// the policy: a key is granted when the policy has it and every domain the
// task declared is one of the key's, and it reaches only those, unless it
// would set a variable a key granted before it sets (refuseEnvClashes). The proxy
// calls it per request, so a reload applies to the next request.
func (p *Policy) Grant(declared []runspec.Declared) (granted []Granted, refused []Refusal) {
	for _, d := range declared {
		ref := KeyRef{Project: d.ProjectID, Key: d.Key}
		k, ok := p.keys[ref]
		if !ok {
			refused = append(refused, Refusal{ref, "this host's policy does not proxy this key"})
			continue
		}
		// A declaration names at least one domain (runspec): none would
		// reach nothing.
		domains := make([]Domain, 0, len(d.Domains))
		for _, dom := range d.Domains {
			if !k.Reaches(dom) {
				refused = append(refused, Refusal{ref, domainRefusal(dom, k.Domains)})
				domains = nil
				break
			}
			domains = append(domains, dom)
		}
		if len(domains) == 0 {
			if len(d.Domains) == 0 {
				refused = append(refused, Refusal{ref, "it declares no domain to reach"})
			}
			continue
		}
		granted = append(granted, Granted{Ref: ref, Domains: domains, Source: k.Source, In: k.In, Placeholder: k.Placeholder, AWS: k.AWS, SSH: k.SSH, Rules: k.Rules})
	}
	return refuseEnvClashes(granted, refused)
}

// CheckFleetValues is admission's check of the keys Fleet sent a run's
// values for (given) against the run's declared keys and the policy: a
// value is taken only for a key the policy takes from Fleet (SourceFleet),
// and when complete (a start, which carries every value Fleet minted for
// the run) every declared key the policy takes from Fleet must have one,
// since Fleet sends none for a key it has no recipe for. It returns the
// first refusal, given keys first, nil when there is none; its Reason is a
// whole sentence naming the key (never a value).
func (p *Policy) CheckFleetValues(declared []runspec.Declared, given []KeyRef, complete bool) *Refusal {
	for _, ref := range given {
		k, ok := p.keys[ref]
		switch {
		case !ok:
			return &Refusal{ref, fmt.Sprintf("this host's policy does not proxy %s, so it takes no value from Fleet for it", ref)}
		case k.Source != SourceFleet:
			return &Refusal{ref, fmt.Sprintf("the host's policy takes %s from its own sources, not from Fleet", ref)}
		}
	}
	if !complete {
		return nil
	}
	for _, d := range declared {
		ref := KeyRef{Project: d.ProjectID, Key: d.Key}
		if k, ok := p.keys[ref]; ok && k.Source == SourceFleet && !slices.Contains(given, ref) {
			return &Refusal{ref, fmt.Sprintf("the host's policy takes %s from Fleet, and Fleet sent no value for it (Fleet has no recipe for it)", ref)}
		}
	}
	return nil
}

// domainRefusal names the domain refused with its port (a name alone is
// port 443, which a caller easily misses) and the domains the policy has
// for the key, as the policy writes them: the caller declares one of those.
func domainRefusal(refused Domain, allowed []Domain) string {
	names := make([]string, len(allowed))
	for i, d := range allowed {
		names[i] = d.String()
	}
	return fmt.Sprintf("it may not reach %s (port %d); this host's policy lets it reach only %s: declare those domains",
		refused, refused.Port, strings.Join(names, ", "))
}

// NotGrantedError is the typed refusal for declared keys the host policy does
// not grant (the run's reason is key_not_granted).
type NotGrantedError struct {
	Refused []Refusal
}

func (e *NotGrantedError) Error() string {
	msg := "policy: key not granted:"
	for i, r := range e.Refused {
		if i > 0 {
			msg += ";"
		}
		msg += " " + r.String()
	}
	return msg
}
