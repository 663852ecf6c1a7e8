package proxy

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy/placeholder"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/shared/runspec"
)

// ErrUnknownTask is a run id the registry does not hold.
var ErrUnknownTask = errors.New("proxy: unknown task")

// task is one registered run across its attempts.
type task struct {
	runID    string
	declared []runspec.Declared

	// Guarded by registry.mu.
	attempt *attempt

	// grants caches the grant under the policy in force (grantsUnder).
	grants atomic.Pointer[grants]
	// placeholders is the task's placeholder for each key, as Register
	// last left it.
	placeholders atomic.Pointer[map[policy.KeyRef]string]
	// values is what the run's answers are scrubbed of.
	values runValues
	// fleet is the run's values from Fleet (fleetvalues.go), in memory
	// only, for the run's life across its attempts: SetCredentials
	// replaces it under fleetMu, requests read it without a lock.
	fleet   atomic.Pointer[fleetValues]
	fleetMu sync.Mutex

	// handlers counts its attempts' tracked connections whose handlers
	// still run: each track that succeeds adds one, its untrack (once the
	// handler recorded its decisions: a tunnel's record is written as it
	// closes) is done. Settle waits for it.
	handlers sync.WaitGroup
}

// attempt is one attempt's proxy credential and the connections made with it.
type attempt struct {
	task    *task
	pwHash  [sha256.Size]byte
	ctx     context.Context
	cancel  context.CancelFunc
	revoked atomic.Bool

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	// closers are the sockets of the attempt's network (ServeNetwork).
	closers []io.Closer
}

// live reports whether the attempt's credential still serves.
func (a *attempt) live() bool { return !a.revoked.Load() }

// track adds a connection; false if the attempt already ended (the caller
// closes the connection).
func (a *attempt) track(c net.Conn) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conns == nil {
		return false
	}
	a.conns[c] = struct{}{}
	a.task.handlers.Add(1)
	return true
}

// untrack is called once for each track that succeeded, as its handler
// returns.
func (a *attempt) untrack(c net.Conn) {
	a.mu.Lock()
	delete(a.conns, c)
	a.mu.Unlock()
	a.task.handlers.Done()
}

// settleGrace bounds how long Settle waits for an ended attempt's
// connection handlers, their connections closed, to record what they did.
const settleGrace = 5 * time.Second

// revoke ends the attempt: its credential stops working, its network's
// sockets and its connections are closed and its in-flight requests cancelled, at once. The connections
// close before the cancel: a request whose upstream call fails on the cancel
// must find its task's connection already gone, never answer it.
func (a *attempt) revoke() {
	a.revoked.Store(true)
	a.mu.Lock()
	conns, closers := a.conns, a.closers
	a.conns, a.closers = nil, nil
	a.mu.Unlock()
	for _, c := range closers {
		c.Close()
	}
	for c := range conns {
		c.Close()
	}
	a.cancel()
}

// registry holds tasks and every task's placeholders, persisted or live.
type registry struct {
	store placeholderStore
	rand  io.Reader

	mu           sync.Mutex
	tasks        map[string]*task
	placeholders map[string]map[policy.KeyRef]string // by run id, registered or not
	index        atomic.Pointer[placeholder.Index]
	// aws finds an aws key's placeholders by their access key id.
	aws atomic.Pointer[map[string]awsOwner]
}

func newRegistry(store placeholderStore, rand io.Reader) (*registry, error) {
	all, err := store.loadAll()
	if err != nil {
		return nil, err
	}
	r := &registry{store: store, rand: rand, tasks: map[string]*task{}, placeholders: all}
	r.reindexLocked()
	return r, nil
}

func (r *registry) reindexLocked() {
	all := map[string]placeholder.Owner{}
	aws := map[string]awsOwner{}
	for runID, m := range r.placeholders {
		for ref, ph := range m {
			if a, ok := storedAWS(ph); ok {
				aws[a.AccessKeyID] = awsOwner{task: runID, ref: ref, ph: a}
				continue
			}
			all[ph] = placeholder.Owner{Task: runID, Ref: ref}
		}
	}
	r.index.Store(placeholder.NewIndex(all))
	r.aws.Store(&aws)
}

// awsStartTimeout bounds the calls that ready a run's aws keys at
// registration (an STS AssumeRole): admission waits on them.
const awsStartTimeout = 30 * time.Second

// Register records a task and its declared secrets (as
// runspec.Request.Declare reads them), and mints (or, after a restart,
// reloads) a placeholder for each. Every declared key must be granted by the
// policy in force, else a *policy.NotGrantedError (the run's reason is
// key_not_granted) and nothing is registered. Registering a known run id
// again with the same secrets is a no-op.
func (p *Proxy) Register(runID string, declared []runspec.Declared) error {
	if p.cfg.Disabled {
		return ErrDisabled
	}
	if err := checkRunID(runID); err != nil {
		return err
	}
	decl := slices.Clone(declared)
	pol := p.cfg.Policy.Current()
	granted, refused := pol.Grant(decl)
	if len(refused) > 0 {
		return &policy.NotGrantedError{Refused: refused}
	}
	// An aws key's real credentials are read (or its STS session minted)
	// now, outside the lock: a run whose credentials cannot be had is
	// refused, never started without them, and the placeholders take
	// their shape (temporary or not).
	if err := p.checkSSHKeys(granted); err != nil {
		return err
	}
	temporary := map[policy.KeyRef]bool{}
	for i := range granted {
		g := &granted[i]
		if g.AWS == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), awsStartTimeout)
		creds, err := p.awsCredentials(ctx, runID, g)
		cancel()
		if err != nil && p.cfg.AWSSessions != nil {
			// The run is refused: a session minted for another of its
			// keys is not kept for it.
			p.cfg.AWSSessions.Drop(runID)
		}
		if errors.Is(err, secrets.ErrNotFound) {
			return fmt.Errorf("aws key %s: the secrets source holds no value for it", g.Ref)
		}
		if err != nil {
			return fmt.Errorf("aws key %s: %w", g.Ref, err)
		}
		temporary[g.Ref] = creds.SessionToken != ""
	}
	r := p.reg
	r.mu.Lock()
	defer r.mu.Unlock()
	existing := r.placeholders[runID]
	m := make(map[policy.KeyRef]string, len(granted))
	changed := false
	for _, g := range granted {
		if g.SSH != nil {
			continue // the task uses an ssh key holding nothing
		}
		ph, ok := existing[g.Ref]
		if _, isAWS := storedAWS(ph); ok && isAWS == (g.AWS != nil) {
			m[g.Ref] = ph
			continue
		}
		// New, or the key changed kind since (a policy reload).
		var err error
		if g.AWS != nil {
			var a placeholder.AWSPlaceholders
			a, err = placeholder.MintAWS(r.rand, temporary[g.Ref])
			ph = storeAWS(a)
		} else {
			ph, err = placeholder.Mint(r.rand, g.Placeholder)
		}
		if err != nil {
			return err
		}
		m[g.Ref] = ph
		changed = true
	}
	for ref, ph := range existing {
		if _, ok := m[ref]; !ok {
			m[ref] = ph // a placeholder is the task's for its whole life
		}
	}
	if changed || existing == nil {
		if err := r.store.save(runID, m); err != nil {
			return err
		}
		r.placeholders[runID] = m
		r.reindexLocked()
	}
	phs := r.placeholders[runID]
	t, ok := r.tasks[runID]
	if ok {
		t.declared = decl
	} else {
		t = &task{runID: runID, declared: decl}
		r.tasks[runID] = t
	}
	t.placeholders.Store(&phs)
	r.learnFleetValuesOf(t, pol)
	return nil
}

// CheckGrant is admission's question: would the policy in force grant every
// declared key? nil, or a *policy.NotGrantedError naming each refused key
// (reason key_not_granted).
func (p *Proxy) CheckGrant(declared []runspec.Declared) error {
	if p.cfg.Disabled {
		return ErrDisabled
	}
	if _, refused := p.cfg.Policy.Current().Grant(declared); len(refused) > 0 {
		return &policy.NotGrantedError{Refused: refused}
	}
	return nil
}

// TaskKey is one variable the runner puts in a task's env for a key: the
// key's own name holding its placeholder, or for an aws key each of its
// credentials' variables (policy.AWSKey.Env).
type TaskKey struct {
	ProjectID   string
	Key         string
	Var         string
	Placeholder string
}

// TaskKeys returns the task's placeholder variables for each key it
// declared.
func (p *Proxy) TaskKeys(runID string) ([]TaskKey, error) {
	if p.cfg.Disabled {
		return nil, ErrDisabled
	}
	pol := p.cfg.Policy.Current()
	r := p.reg
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.tasks[runID]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnknownTask, runID)
	}
	var out []TaskKey
	for _, d := range t.declared {
		ref := policy.KeyRef{Project: d.ProjectID, Key: d.Key}
		ph, ok := r.placeholders[runID][ref]
		if !ok {
			continue
		}
		a, isAWS := storedAWS(ph)
		if k, ok := pol.Key(ref); ok && k.SSH != nil {
			continue // an ssh key since (a reload): the task holds nothing for it
		}
		if !isAWS {
			out = append(out, TaskKey{ProjectID: d.ProjectID, Key: d.Key, Var: d.Key, Placeholder: ph})
			continue
		}
		k, ok := pol.Key(ref)
		if !ok || k.AWS == nil {
			continue // no longer an aws key: Register mints it again
		}
		env := k.AWS.Env()
		out = append(out,
			TaskKey{ProjectID: d.ProjectID, Key: d.Key, Var: env.AccessKeyID, Placeholder: a.AccessKeyID},
			TaskKey{ProjectID: d.ProjectID, Key: d.Key, Var: env.SecretAccessKey, Placeholder: a.SecretAccessKey})
		if a.SessionToken != "" {
			out = append(out, TaskKey{ProjectID: d.ProjectID, Key: d.Key, Var: env.SessionToken, Placeholder: a.SessionToken})
		}
	}
	return out, nil
}

// ProxiedKey is one entry of RUNFLEET_PROXIED_KEYS: a key and the domains
// it may reach now.
type ProxiedKey struct {
	ProjectID string   `json:"projectId"`
	Key       string   `json:"key"`
	Domains   []string `json:"domains"`
}

// ProxiedKeys returns the task's keys granted by the policy in force, each
// with its domains ("name" or "name:port"), sorted.
func (p *Proxy) ProxiedKeys(runID string) ([]ProxiedKey, error) {
	t, err := p.task(runID)
	if err != nil {
		return nil, err
	}
	granted, _ := p.cfg.Policy.Current().Grant(t.declared)
	out := make([]ProxiedKey, 0, len(granted))
	for _, g := range granted {
		k := ProxiedKey{ProjectID: g.Ref.Project, Key: g.Ref.Key}
		for _, d := range g.Domains {
			k.Domains = append(k.Domains, d.String())
		}
		sort.Strings(k.Domains)
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].ProjectID+"/"+out[i].Key < out[j].ProjectID+"/"+out[j].Key
	})
	return out, nil
}

func (p *Proxy) task(runID string) (*task, error) {
	if p.cfg.Disabled {
		return nil, ErrDisabled
	}
	p.reg.mu.Lock()
	defer p.reg.mu.Unlock()
	t, ok := p.reg.tasks[runID]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnknownTask, runID)
	}
	return t, nil
}

// StartAttempt mints the attempt's proxy password (revoking a previous
// attempt's) and returns the proxy URL with the credential, the value of
// the task's HTTPS_PROXY. A stopped task is served again from here on.
func (p *Proxy) StartAttempt(runID string) (*url.URL, error) {
	if p.cfg.Disabled {
		return nil, ErrDisabled
	}
	var raw [32]byte
	if _, err := io.ReadFull(p.cfg.Rand, raw[:]); err != nil {
		return nil, fmt.Errorf("proxy: minting a password: %w", err)
	}
	password := hex.EncodeToString(raw[:])
	r := p.reg
	r.mu.Lock()
	t, ok := r.tasks[runID]
	if !ok {
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: %s", ErrUnknownTask, runID)
	}
	old := t.attempt
	ctx, cancel := context.WithCancel(context.Background())
	t.attempt = &attempt{task: t, pwHash: sha256.Sum256([]byte(password)), ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
	r.mu.Unlock()
	if old != nil {
		old.revoke()
	}
	return &url.URL{Scheme: "http", User: url.UserPassword(runID, password), Host: p.cfg.Listener.Addr().String()}, nil
}

// EndAttempt revokes the current attempt's password and closes the
// connections made with it, and forgets the run's STS sessions: nothing
// signs with them once the task is gone (a retry's registration mints its
// own).
func (p *Proxy) EndAttempt(runID string) {
	p.revoke(runID)
	if p.cfg.AWSSessions != nil && !p.cfg.Disabled {
		p.cfg.AWSSessions.Drop(runID)
	}
}

// Settle returns once the handlers of the run's ended attempts'
// connections have returned, having recorded their decisions (at most
// settleGrace): the run's egress ledger, sealed as an attempt ends, then
// holds every one of them, a tunnel the task closed as it exited
// included. Call it after EndAttempt, never from a handler of the run.
func (p *Proxy) Settle(runID string) {
	if p.cfg.Disabled {
		return
	}
	p.reg.mu.Lock()
	t, ok := p.reg.tasks[runID]
	p.reg.mu.Unlock()
	if !ok {
		return
	}
	done := make(chan struct{})
	go func() {
		t.handlers.Wait()
		close(done)
	}()
	timer := p.cfg.Clock.NewTimer(settleGrace)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C():
	}
}

// Stop closes the task's connections at once; nothing is served for it until
// a new attempt starts. Its placeholders stay.
func (p *Proxy) Stop(runID string) { p.revoke(runID) }

func (p *Proxy) revoke(runID string) {
	if p.cfg.Disabled {
		return
	}
	r := p.reg
	r.mu.Lock()
	var a *attempt
	if t, ok := r.tasks[runID]; ok {
		a, t.attempt = t.attempt, nil
	}
	r.mu.Unlock()
	if a != nil {
		a.revoke()
	}
}

// Drop stops the task and forgets it, its values from Fleet and its
// placeholders, on disk too.
func (p *Proxy) Drop(runID string) error {
	if p.cfg.Disabled {
		return nil
	}
	p.revoke(runID)
	if p.cfg.AWSSessions != nil {
		p.cfg.AWSSessions.Drop(runID)
	}
	r := p.reg
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.tasks, runID)
	if _, ok := r.placeholders[runID]; ok {
		delete(r.placeholders, runID)
		r.reindexLocked()
	}
	return r.store.remove(runID)
}

// authenticate returns the attempt a runID:password credential belongs to.
// The password is compared in constant time (as hashes, so lengths match).
func (r *registry) authenticate(runID, password string) *attempt {
	given := sha256.Sum256([]byte(password))
	r.mu.Lock()
	t := r.tasks[runID]
	var a *attempt
	if t != nil {
		a = t.attempt
	}
	r.mu.Unlock()
	if a == nil || !a.live() {
		subtle.ConstantTimeCompare(given[:], given[:]) // same work either way
		return nil
	}
	if subtle.ConstantTimeCompare(given[:], a.pwHash[:]) != 1 {
		return nil
	}
	return a
}

// closeAll revokes every attempt (proxy shutdown).
func (r *registry) closeAll() {
	r.mu.Lock()
	var all []*attempt
	for _, t := range r.tasks {
		if t.attempt != nil {
			all = append(all, t.attempt)
			t.attempt = nil
		}
	}
	r.mu.Unlock()
	for _, a := range all {
		a.revoke()
	}
}
