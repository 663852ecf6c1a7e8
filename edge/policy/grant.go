package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/runfleet/runfleet/shared/hostproto"
)

// Declared is one secret a task declared, its domains canonical. Empty
// Domains asks for every domain the host policy gives the key.
type Declared struct {
	Ref     KeyRef
	Domains []Domain
}

// ParseDeclared canonicalises a task's declared secrets once, at
// registration, so per-request grants compare plain values.
func ParseDeclared(secrets []hostproto.Secret) ([]Declared, error) {
	var errs []error
	out := make([]Declared, 0, len(secrets))
	for _, s := range secrets {
		d := Declared{Ref: KeyRef{Project: s.ProjectID, Key: s.Key}}
		if s.ProjectID == "" || s.Key == "" {
			errs = append(errs, fmt.Errorf("secret %q/%q: projectId and key are required", s.ProjectID, s.Key))
			continue
		}
		for _, raw := range s.Domains {
			dom, err := ParseDomain(raw)
			if err != nil {
				errs = append(errs, fmt.Errorf("secret %s domain %q: %v", d.Ref, raw, err))
				continue
			}
			if !slices.Contains(d.Domains, dom) {
				d.Domains = append(d.Domains, dom)
			}
		}
		if slices.ContainsFunc(out, func(o Declared) bool { return o.Ref == d.Ref }) {
			errs = append(errs, fmt.Errorf("secret %s is declared twice", d.Ref))
			continue
		}
		out = append(out, d)
	}
	return out, errors.Join(errs...)
}

// Granted is a key a task may use right now: the host's key, its domains
// narrowed to those the task declared.
type Granted struct {
	Ref         KeyRef
	Domains     []Domain
	In          Location
	Placeholder Shape
}

// Reaches reports whether the key may be sent to d.
func (g *Granted) Reaches(d Domain) bool { return slices.Contains(g.Domains, d) }

// Refusal says why a declared key is not granted.
type Refusal struct {
	Ref    KeyRef
	Reason string
}

func (r Refusal) String() string { return r.Ref.String() + ": " + r.Reason }

// Grant intersects declared secrets with the policy: a key is granted when
// the policy has it and every domain the task declared is one of the key's.
// The proxy calls it per request, so a reload applies to the next request.
func (p *Policy) Grant(declared []Declared) (granted []Granted, refused []Refusal) {
	for _, d := range declared {
		k, ok := p.keys[d.Ref]
		if !ok {
			refused = append(refused, Refusal{d.Ref, "this host's policy does not proxy this key"})
			continue
		}
		domains := k.Domains
		if len(d.Domains) > 0 {
			domains = nil
			for _, dom := range d.Domains {
				if !k.Reaches(dom) {
					refused = append(refused, Refusal{d.Ref, domainRefusal(dom, k.Domains)})
					domains = nil
					break
				}
				domains = append(domains, dom)
			}
			if domains == nil {
				continue
			}
		}
		granted = append(granted, Granted{Ref: d.Ref, Domains: domains, In: k.In, Placeholder: k.Placeholder})
	}
	return granted, refused
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
