package proxy

import (
	"errors"
	"log/slog"
	"slices"
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
	mu    sync.Mutex // serialises adding
	state atomic.Pointer[runValuesState]
}

// runValuesState is immutable: every request of the run reads it without
// a lock.
type runValuesState struct {
	known []knownValue
	set   *placeholder.Set
}

type knownValue struct {
	ref    policy.KeyRef
	secret placeholder.Secret
}

// Set is the run's values now; nil before any is known.
func (rv *runValues) Set() *placeholder.Set {
	if st := rv.state.Load(); st != nil {
		return st.set
	}
	return nil
}

// learnt is a key's value and its placeholder, for runValues.learn. A
// value that starts with prefix (the placeholder's own, such as "sk-" or
// AWS's "AKIA") may keep it when scrubbed: it tells nothing.
type learnt struct {
	ref         policy.KeyRef
	prefix      string
	placeholder string
	value       secrets.Value
}

// learntGranted is a granted key's value as learnt.
func learntGranted(g *policy.Granted, placeholder string, v secrets.Value) learnt {
	return learnt{ref: g.Ref, prefix: g.Placeholder.Prefix, placeholder: placeholder, value: v}
}

// learn puts each value in the set unless it is there: the set is built
// again once for all that are new. The caller learns a value before it is
// sent upstream (placeholder.Source's contract).
func (rv *runValues) learn(values ...learnt) {
	if rv.knowsAll(rv.state.Load(), values) {
		return
	}
	rv.mu.Lock()
	defer rv.mu.Unlock()
	old := rv.state.Load()
	var known []knownValue
	if old != nil {
		known = old.known
	}
	known = slices.Clip(known) // appending never writes what readers hold
	added := false
	for _, l := range values {
		real := l.value.Reveal()
		if real == "" || knows(known, l.ref, real) {
			continue
		}
		public := 0
		if strings.HasPrefix(real, l.prefix) {
			public = len(l.prefix)
		}
		known = append(known, knownValue{ref: l.ref, secret: placeholder.Secret{Value: l.value, Placeholder: l.placeholder, Public: public}})
		added = true
	}
	if !added {
		return
	}
	all := make([]placeholder.Secret, len(known))
	for i, k := range known {
		all[i] = k.secret
	}
	rv.state.Store(&runValuesState{known: known, set: placeholder.NewSet(all)})
}

func (rv *runValues) knowsAll(st *runValuesState, values []learnt) bool {
	if st == nil {
		return false
	}
	for _, l := range values {
		if real := l.value.Reveal(); real != "" && !knows(st.known, l.ref, real) {
			return false
		}
	}
	return true
}

func knows(known []knownValue, ref policy.KeyRef, real string) bool {
	for _, k := range known {
		if k.ref == ref && k.secret.Value.Reveal() == real {
			return true
		}
	}
	return false
}

// learnGranted reads the value of every key the task is granted now (from
// where the policy takes it: grantedValue) and
// learns each: an answer may carry the value of a key the request never
// used (stored upstream by an earlier request, or by anyone). A key whose
// value cannot be read is skipped: the proxy cannot send it either, and a
// value read before stays known. Each value read is kept as the request's
// (st.subs, not yet used), so substitute does not read the key again: a
// request puts in the values its keys held when it began.
func (st *requestState) learnGranted() {
	t := st.ci.attempt.task
	phs := t.placeholders.Load()
	if phs == nil {
		return
	}
	var batch [4]learnt
	values := batch[:0]
	st.mu.Lock()
	defer st.mu.Unlock()
	for i := range st.grants.granted {
		gr := &st.grants.granted[i]
		ph, ok := (*phs)[gr.Ref]
		if !ok {
			continue
		}
		if gr.AWS != nil {
			st.learnAWSGranted(gr, ph)
			continue
		}
		v, err := st.p.grantedValue(st.ctx, t, gr)
		if err != nil {
			if !errors.Is(err, secrets.ErrNotFound) && !errors.Is(err, errAwaitingFleet) && st.ctx.Err() == nil {
				st.p.cfg.Logger.Warn("secrets proxy: reading a granted key's value, to scrub answers of it",
					slog.String("task", t.runID), slog.String("key", gr.Ref.String()), slog.String("error", err.Error()))
			}
			continue
		}
		values = append(values, learntGranted(gr, ph, v))
		st.subs = append(st.subs, substitution{ref: gr.Ref, value: v, placeholder: ph})
	}
	t.values.learn(values...)
}
