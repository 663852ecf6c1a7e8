package proxy

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy/placeholder"
	"github.com/runfleet/runfleet/edge/secrets"
)

// runValues is every real value a run's keys have held while it ran, and
// the placeholder.Set that scrubs them: the Source of every Scrubber of the
// run's answers, whichever request, stream, connection or WebSocket they
// come on. An upstream may keep what it was sent (a note, a gist, a request
// log) and hand it to any later request, so a value once known stays for
// the run's life, a rotated one too.
type runValues struct {
	mu    sync.Mutex
	known []knownValue
	set   atomic.Pointer[placeholder.Set]
}

type knownValue struct {
	ref    policy.KeyRef
	secret placeholder.Secret
}

// Set is the run's values now; nil before any is known.
func (rv *runValues) Set() *placeholder.Set { return rv.set.Load() }

// learn puts ref's value v in the set unless it is there: the set is built
// again, once per new value. The caller learns a value before it is sent
// upstream (placeholder.Source's contract).
func (rv *runValues) learn(g *policy.Granted, ph string, v secrets.Value) {
	real := v.Reveal()
	if real == "" {
		return
	}
	rv.mu.Lock()
	defer rv.mu.Unlock()
	for _, k := range rv.known {
		if k.ref == g.Ref && k.secret.Value.Reveal() == real {
			return
		}
	}
	public := 0
	if prefix := g.Placeholder.Prefix; strings.HasPrefix(real, prefix) {
		public = len(prefix)
	}
	rv.known = append(rv.known, knownValue{ref: g.Ref, secret: placeholder.Secret{Value: v, Placeholder: ph, Public: public}})
	all := make([]placeholder.Secret, len(rv.known))
	for i, k := range rv.known {
		all[i] = k.secret
	}
	rv.set.Store(placeholder.NewSet(all))
}

// learnGranted reads the value of every key the task is granted now and
// learns each: an answer may carry the value of a key the request never
// used (stored upstream by an earlier request, or by anyone). A key whose
// value cannot be read is skipped: the proxy cannot send it either, and a
// value read before stays known.
func (p *Proxy) learnGranted(ctx context.Context, t *task, g *grants) {
	phs := t.placeholders.Load()
	if phs == nil {
		return
	}
	for i := range g.granted {
		gr := &g.granted[i]
		ph, ok := (*phs)[gr.Ref]
		if !ok {
			continue
		}
		v, err := p.cfg.Secrets.Value(ctx, gr.Ref.Project, gr.Ref.Key)
		if err != nil {
			if !errors.Is(err, secrets.ErrNotFound) && ctx.Err() == nil {
				p.cfg.Logger.Warn("secrets proxy: reading a granted key's value, to scrub answers of it",
					slog.String("task", t.runID), slog.String("key", gr.Ref.String()), slog.String("error", err.Error()))
			}
			continue
		}
		t.values.learn(gr, ph, v)
	}
}
