package proxy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/shared/runspec"
)

// Values from Fleet (issue 33): a key the policy takes from Fleet
// ("source": "fleet") has, for each run, the value Fleet minted for that
// run (a GitHub App token for its repository, an OAuth2 access token),
// sent with the run's start and again before it expires. The run's task
// holds them in memory only, across its attempts, until Drop; nothing
// writes them to disk, an event or a log line. Such a key is never read
// from the secrets source: grantedValue is the one place a granted plain
// key's value is read, and it picks the source by the policy in force.

// Credential is the value Fleet sent for one of a run's keys.
type Credential struct {
	Ref   policy.KeyRef
	Value secrets.Value
	// ExpiresAt is when the provider stops honouring Value; past it the
	// value is withheld as if missing, so Fleet's next pass sends a fresh
	// one. Zero: Fleet did not say.
	ExpiresAt time.Time
}

// fleetValues is a run's values from Fleet by key; immutable once
// published (task.fleet), replaced whole.
type fleetValues map[policy.KeyRef]Credential

// errAwaitingFleet: the run holds no usable value from Fleet for a key the
// policy takes from Fleet (an edge restart lost it, or it expired). A
// request that would carry the key is answered 503 withheld.
var errAwaitingFleet = errors.New("proxy: waiting for Fleet to send the value")

// errFleetValueExpired is errAwaitingFleet for a value held past its
// ExpiresAt.
var errFleetValueExpired = fmt.Errorf("%w (the one held expired)", errAwaitingFleet)

// CheckFleetValues is admission's question about the values Fleet sent
// for a run (given): does the policy in force take exactly those keys
// from Fleet? nil, or the policy's refusal naming the first key that
// disagrees (policy.CheckFleetValues; with complete, a declared key the
// policy takes from Fleet must have a value).
func (p *Proxy) CheckFleetValues(declared []runspec.Declared, given []policy.KeyRef, complete bool) *policy.Refusal {
	if p.cfg.Disabled {
		return nil // Ready refuses first
	}
	return p.cfg.Policy.Current().CheckFleetValues(declared, given, complete)
}

// SetCredentials gives a registered run values from Fleet, replacing the
// ones it holds for those keys and keeping its others; its placeholders
// never change. Each value is handed to Observe (the log redactor) and
// learnt by the run's answer scrubber before any request can use it. A
// run not registered is ErrUnknownTask. The caller checked that the run
// declares each key and the policy takes it from Fleet.
func (p *Proxy) SetCredentials(runID string, creds []Credential) error {
	if p.cfg.Disabled {
		return ErrDisabled
	}
	t, err := p.task(runID)
	if err != nil {
		return err
	}
	pol := p.cfg.Policy.Current()
	phs := t.placeholders.Load()
	values := make([]learnt, 0, len(creds))
	for _, c := range creds {
		if p.cfg.Observe != nil {
			p.cfg.Observe(c.Value)
		}
		ph := ""
		if phs != nil {
			ph = (*phs)[c.Ref]
		}
		prefix := ""
		if k, ok := pol.Key(c.Ref); ok {
			prefix = k.Placeholder.Prefix
		}
		values = append(values, learnt{ref: c.Ref, prefix: prefix, placeholder: ph, value: c.Value})
	}
	t.values.learn(values...)
	t.fleetMu.Lock()
	defer t.fleetMu.Unlock()
	next := fleetValues{}
	if old := t.fleet.Load(); old != nil {
		next = maps.Clone(*old)
	}
	for _, c := range creds {
		next[c.Ref] = c
	}
	t.fleet.Store(&next)
	return nil
}

// MissingCredentials names ("project/KEY", sorted) the declared keys the
// policy in force takes from Fleet that the run holds no usable value
// for: none yet (an edge restart lost them, or the run is not registered),
// or one past its ExpiresAt.
func (p *Proxy) MissingCredentials(runID string, declared []runspec.Declared) []string {
	if p.cfg.Disabled {
		return nil
	}
	pol := p.cfg.Policy.Current()
	var held fleetValues
	if t, err := p.task(runID); err == nil {
		if v := t.fleet.Load(); v != nil {
			held = *v
		}
	}
	now := p.cfg.Clock.Now()
	var out []string
	for _, d := range declared {
		ref := policy.KeyRef{Project: d.ProjectID, Key: d.Key}
		if k, ok := pol.Key(ref); !ok || k.Source != policy.SourceFleet {
			continue
		}
		if c, ok := held[ref]; !ok || expired(c, now) {
			out = append(out, ref.String())
		}
	}
	slices.Sort(out)
	return out
}

func expired(c Credential, now time.Time) bool {
	return !c.ExpiresAt.IsZero() && !now.Before(c.ExpiresAt)
}

// grantedValue is a granted plain key's real value for the run t: for a
// key the policy in force takes from Fleet, the value Fleet sent for this
// run (errAwaitingFleet when there is none it may use), never the secrets
// source; for any other key, the secrets source's (an error wrapping
// secrets.ErrNotFound when it has none).
func (p *Proxy) grantedValue(ctx context.Context, t *task, g *policy.Granted) (secrets.Value, error) {
	if g.Source != policy.SourceFleet {
		return p.cfg.Secrets.Value(ctx, g.Ref.Project, g.Ref.Key)
	}
	held := t.fleet.Load()
	if held == nil {
		return secrets.Value{}, errAwaitingFleet
	}
	c, ok := (*held)[g.Ref]
	switch {
	case !ok:
		return secrets.Value{}, errAwaitingFleet
	case expired(c, p.cfg.Clock.Now()):
		return secrets.Value{}, errFleetValueExpired
	}
	// At each read, as an observed secrets source hands over its values:
	// a value the redactor forgot past its bound is learnt again.
	if p.cfg.Observe != nil {
		p.cfg.Observe(c.Value)
	}
	return c.Value, nil
}
