// Package policy owns the host's secrets policy: which project keys may be
// proxied, the canonical domains each may reach, where in a request each may
// be substituted, the shape of its placeholders, and the request rules
// (methods and paths) of the requests that carry it. It compiles the wire
// form of edge.json (config.Policy) into that, refusing at load what could
// never be enforced; intersects a task's declared secrets with it; keeps the
// policy in force current as the config file changes; and holds the pure
// host matcher and allow/block decisions the proxy applies per request.
package policy

import (
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/shared/netname"
)

// Location is where in a request a placeholder may be substituted.
type Location uint8

// Locations a key's `in` may list.
const (
	InHeader Location = 1 << iota
	InURL
	InBody
)

// String is the name the policy uses for the location(s).
func (l Location) String() string {
	var names []string
	for _, x := range []Location{InHeader, InURL, InBody} {
		if l&x != 0 {
			names = append(names, locationNames[x])
		}
	}
	if len(names) == 0 {
		return "nowhere"
	}
	return strings.Join(names, "+")
}

var locationNames = map[Location]string{InHeader: "header", InURL: "url", InBody: "body"}

// Placeholder shape bounds. The random part is at least MinRandom letters and
// digits (about 95 bits), so a placeholder cannot be guessed, and the proxy's
// scanner can anchor on it.
const (
	DefaultPlaceholderLength = 48
	MinRandom                = 16
	MaxPlaceholderLength     = 256
	MaxPrefix                = 32
)

// Shape is how a key's placeholders look: Prefix followed by letters and
// digits up to Length characters in all.
type Shape struct {
	Prefix string
	Length int
}

// Source is where a key's real value comes from.
type Source uint8

const (
	// SourceHost: the host's secrets source (a file, or Secrets Manager),
	// read per request. The default.
	SourceHost Source = iota
	// SourceFleet: the value Fleet minted for the run and sent with its
	// start or since (PUT /runs/{id}/credentials), held by edge in memory
	// for that run alone; the host's sources are never read for it.
	SourceFleet
)

// SourceFleetName is how edge.json writes SourceFleet: "source": "fleet".
const SourceFleetName = "fleet"

// String is the name the policy uses for the source; the host's is the
// default, which has none.
func (s Source) String() string {
	if s == SourceFleet {
		return SourceFleetName
	}
	return "host"
}

// KeyRef names a key: a project and the key within it.
type KeyRef struct {
	Project string
	Key     string
}

// String is "project/KEY", the form the secrets file and audit log use.
func (k KeyRef) String() string { return k.Project + "/" + k.Key }

// Key is one proxiable key of the host policy.
type Key struct {
	Ref KeyRef
	// Kind is "", KindAWS or KindSSH; AWS and SSH are set for their kind
	// only.
	Kind    string
	Domains []Domain
	// Source is where the key's value comes from; SourceFleet for a key
	// of no kind only.
	Source      Source
	In          Location
	Placeholder Shape
	AWS         *AWSKey
	SSH         *SSHKey
	// Rules decide the requests that carry the key; nil for none.
	Rules *Rules
}

// Reaches reports whether the key may be sent to d.
func (k *Key) Reaches(d Domain) bool { return slices.Contains(k.Domains, d) }

// Policy is a compiled host policy. It is immutable: a reload makes a new one.
type Policy struct {
	keys  map[KeyRef]*Key
	names map[string]bool
}

// Key returns the host policy for ref.
func (p *Policy) Key(ref KeyRef) (*Key, bool) {
	k, ok := p.keys[ref]
	return k, ok
}

// Keys returns every key, sorted by project then key.
func (p *Policy) Keys() []*Key {
	out := make([]*Key, 0, len(p.keys))
	for _, k := range p.keys {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ref.String() < out[j].Ref.String() })
	return out
}

// AllowsName reports whether some key's domains name this canonical name:
// the CA issues a leaf only for such a name.
func (p *Policy) AllowsName(name string) bool { return p != nil && p.names[name] }

var (
	projectPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	// A key becomes an environment variable of the task.
	keyPattern    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	prefixPattern = regexp.MustCompile(`^[A-Za-z0-9_.-]*$`)
)

// Compile checks the written policy and returns it compiled. Its error is
// config.Problems: every problem, each at its path in edge.json
// (policy.projects.acme.keys.API_KEY.domains[0]) with the offending value,
// in the order of projects and keys by name.
func Compile(written config.Policy) (*Policy, error) {
	p := &Policy{keys: map[KeyRef]*Key{}, names: map[string]bool{}}
	var ps config.Problems
	for _, project := range slices.Sorted(maps.Keys(written.Projects)) {
		at := config.Path{"policy", "projects", project}
		if !projectPattern.MatchString(project) {
			ps = append(ps, at.Problemf("a project id is letters, digits, '.', '_' and '-'"))
			continue
		}
		keys := written.Projects[project].Keys
		for _, key := range slices.Sorted(maps.Keys(keys)) {
			at := at.Key("keys", key)
			if !keyPattern.MatchString(key) {
				ps = append(ps, at.Problemf("a key must be a valid environment variable name"))
				continue
			}
			k, kps := compileKey(at, KeyRef{project, key}, keys[key])
			ps = append(ps, kps...)
			if len(kps) == 0 {
				p.keys[k.Ref] = k
				for _, d := range k.Domains {
					p.names[d.Name] = true
				}
			}
		}
	}
	ps = append(ps, p.refuseSharedSSHDomains()...)
	if len(ps) > 0 {
		return nil, ps
	}
	return p, nil
}

// keyPath is where the key ref is written in edge.json.
func keyPath(ref KeyRef) config.Path {
	return config.Path{"policy", "projects", ref.Project, "keys", ref.Key}
}

// refuseSharedSSHDomains refuses a domain named both by an ssh key and by
// a key of another kind: a connection there is either SSH edge terminates
// or TLS it intercepts, and which one must not depend on the task's keys.
func (p *Policy) refuseSharedSSHDomains() config.Problems {
	ssh := map[Domain]KeyRef{}
	for _, k := range p.Keys() {
		if k.SSH != nil {
			for _, d := range k.Domains {
				ssh[d] = k.Ref
			}
		}
	}
	var ps config.Problems
	for _, k := range p.Keys() {
		if k.SSH != nil {
			continue
		}
		for _, d := range k.Domains {
			if o, ok := ssh[d]; ok {
				ps = append(ps, keyPath(k.Ref).Key("domains").Problemf("%q: ssh key %s names it too; a domain is SSH for every key or for none", d, o))
			}
		}
	}
	return ps
}

func compileKey(at config.Path, ref KeyRef, kp config.KeyPolicy) (*Key, config.Problems) {
	var ps config.Problems
	k := &Key{Ref: ref}
	if len(kp.Domains) == 0 {
		ps = append(ps, at.Key("domains").Problemf("at least one is required"))
	}
	for i, raw := range kp.Domains {
		d, err := netname.ParseDomain(raw)
		if err != nil {
			ps = append(ps, at.Key("domains").Index(i).Problemf("%q: %v", raw, err))
			continue
		}
		if !slices.Contains(k.Domains, d) {
			k.Domains = append(k.Domains, d)
		}
	}
	var sps config.Problems
	k.Source, sps = compileSource(at.Key("source"), kp)
	ps = append(ps, sps...)
	if kp.Kind == KindSSH {
		if kp.Rules != nil || kp.Default != "" || kp.Mode != "" {
			ps = append(ps, at.Key(sshRulesField(kp)).Problemf(`an ssh key makes no HTTPS request for rules to decide: its commands are ruled by "ssh": {"allow": [...], "repositories": [...]}`))
		}
		return k, append(ps, compileSSH(at, k, kp)...)
	}
	var rps config.Problems
	k.Rules, rps = compileRules(at, kp)
	ps = append(ps, rps...)
	if kp.SSH != nil {
		ps = append(ps, at.Key("ssh").Problemf(`only a key of "kind": "ssh" takes it`))
	}
	if kp.Kind != "" || kp.AWS != nil {
		// An AWS key is never substituted: no location, no shape.
		return k, append(ps, compileAWS(at, k, kp)...)
	}
	if len(kp.In) == 0 {
		k.In = InHeader
	}
	for i, in := range kp.In {
		loc, ok := parseLocation(in)
		if !ok {
			ps = append(ps, at.Key("in").Index(i).Problemf("%q is not one of header, url, body", in))
		}
		k.In |= loc
	}
	shape, sps := compileShape(at.Key("placeholder"), kp.Placeholder)
	k.Placeholder = shape
	return k, append(ps, sps...)
}

// compileSource reads a key's source. Only a key whose value is sent as
// it is may take it from Fleet: an aws key signs and an ssh key logs in
// with what the host holds, which Fleet mints nothing for.
func compileSource(at config.Path, kp config.KeyPolicy) (Source, config.Problems) {
	switch kp.Source {
	case "":
		return SourceHost, nil
	case SourceFleetName:
		kind := kp.Kind
		if kind == "" && kp.AWS != nil {
			kind = KindAWS
		}
		if kind == "" && kp.SSH != nil {
			kind = KindSSH
		}
		if kind != "" {
			return SourceHost, config.Problems{at.Problemf(`%q is only for a key sent as its value, not one of "kind": %q: its value never travels, so Fleet has none to give it`, kp.Source, kind)}
		}
		return SourceFleet, nil
	}
	return SourceHost, config.Problems{at.Problemf(`%q: write %q for a value Fleet sends with each run, or omit it for the host's own secrets source`, kp.Source, SourceFleetName)}
}

func parseLocation(s string) (Location, bool) {
	for loc, name := range locationNames {
		if name == s {
			return loc, true
		}
	}
	return 0, false
}

func compileShape(at config.Path, w config.PlaceholderShape) (Shape, config.Problems) {
	s := Shape{Prefix: w.Prefix, Length: w.Length}
	if s.Length == 0 {
		s.Length = DefaultPlaceholderLength
	}
	switch {
	case len(s.Prefix) > MaxPrefix:
		return s, config.Problems{at.Key("prefix").Problemf("%q is longer than %d characters", s.Prefix, MaxPrefix)}
	case !prefixPattern.MatchString(s.Prefix):
		return s, config.Problems{at.Key("prefix").Problemf("%q may hold only letters, digits, '_', '.' and '-'", s.Prefix)}
	case s.Length > MaxPlaceholderLength:
		return s, config.Problems{at.Key("length").Problemf("%d is above %d", s.Length, MaxPlaceholderLength)}
	case s.Length-len(s.Prefix) < MinRandom:
		return s, config.Problems{at.Key("length").Problemf("%d leaves fewer than %d random characters after prefix %q (the length includes the prefix)", s.Length, MinRandom, s.Prefix)}
	}
	return s, nil
}
