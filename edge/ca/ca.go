// Package ca owns the secrets proxy's certificate authority: the CA set kept
// under the data dir with its private keys sealed at rest, its rotation
// (signer, successor, switch) against an injected clock, the leaves it
// issues on demand through certmagic, and the delivery of its bundle to the
// running tasks that must trust it.
//
// The signer mints a successor inside its last SuccessorWindow; the bundle is
// the signer plus that successor; the signer hands over SwitchBefore its end,
// to a CA every task that installed a bundle since has. A sealed key that
// cannot be opened refuses the start: a new CA is never minted over it.
//
// The clock may be wrong. A CA not valid yet never signs (its leaves would
// not verify), and CAs that leave the bundle stay in the store, sealed (the
// latest few), so a clock that ran ahead (edge then minted a CA dated in the
// future) and is put right finds the CA it had and signs with it again. A
// clock set back is noticed at the next handshake or hourly review.
package ca

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
)

// Log field names.
const (
	logFingerprint = "fingerprint"
	logNotAfter    = "notAfter"
	logError       = "error"
	logReason      = "reason"
	logRetryAt     = "retryAt"
)

// minTimerDelay keeps the review timer from spinning on a due transition.
const minTimerDelay = time.Second

// ErrClosed is returned by an Authority's methods after Close.
var ErrClosed = errors.New("ca: the authority is closed")

// Authority is the CA of one edge: open with Open, stop with Close. Its
// methods are safe for concurrent use.
type Authority struct {
	cfg    Config
	policy leafPolicy
	log    *slog.Logger
	lock   *os.File

	// ctx ends at Close, aborting a sealer call a review has under way.
	ctx    context.Context
	cancel context.CancelFunc

	// reviewMu serializes reviews, and with them every store write.
	reviewMu sync.Mutex
	stored   []*authority // the store file's CAs, unsealed; guarded by reviewMu
	closed   atomic.Bool  // set under reviewMu: nothing is written after it

	state atomic.Pointer[caState]

	// admitted counts, by name, the holds AdmitName gave out that are not
	// released yet.
	admitMu  sync.Mutex
	admitted map[string]int

	// mu guards trust delivery and the review timer.
	mu          sync.Mutex
	watchers    map[*watcher]struct{}
	deliveries  sync.WaitGroup
	trustClosed bool
	timer       clock.Timer

	closeOnce sync.Once
	closeErr  error
}

// caState is what the Authority serves between two reviews; replaced whole.
type caState struct {
	signer    *authority
	successor *authority // nil until minted
	bundle    []byte
	status    Status
	// nextReview is when the dates next call for a review: a transition,
	// or the retry after a failed one.
	nextReview time.Time
	// reviewedAt is the (wall) time the state was decided at: a clock read
	// before it has been set back, which calls for a review too.
	reviewedAt time.Time
	leaves     *leafIssuer
}

// due reports whether the state must be reviewed at now: a transition is
// due, or the clock was set back since (wall times: a monotonic reading
// does not see the clock set back).
func (st *caState) due(now time.Time) bool {
	now = now.Round(0)
	return !now.Before(st.nextReview) || now.Before(st.reviewedAt)
}

func newState(signer, successor *authority, nextReview time.Time) *caState {
	st := &caState{signer: signer, successor: successor, nextReview: nextReview}
	st.bundle = slices.Clone(signer.certPEM)
	st.status.Signer = signer.info()
	if successor != nil {
		st.bundle = append(st.bundle, successor.certPEM...)
		info := successor.info()
		st.status.Successor = &info
	}
	return st
}

// Open loads the CA set from cfg.Dir, or creates it on first start, and
// brings it up to date at the clock's now: a CA that expired or passed its
// switch point while edge was down is replaced (its successor signs, or a
// new CA), and a successor due is minted. It refuses to start, without
// writing anything, when the store cannot be read back or a sealed key
// cannot be opened (ErrStoreUnreadable, ErrSealedKey).
func Open(ctx context.Context, cfg Config) (*Authority, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("ca: creating %s: %w", cfg.Dir, err)
	}
	lock, err := lockDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	a, err := open(ctx, cfg, lock)
	if err != nil {
		lock.Close()
		return nil, err
	}
	return a, nil
}

func open(ctx context.Context, cfg Config, lock *os.File) (*Authority, error) {
	stored, err := loadStored(cfg.Dir)
	if err != nil {
		return nil, err
	}
	for _, s := range stored {
		if err := s.unseal(ctx, cfg.Sealer); err != nil {
			return nil, refusal(storePath(cfg.Dir), ErrSealedKey,
				fmt.Sprintf("the key of CA %s (%s): %v", s.info().Fingerprint, s.cert.Subject, err))
		}
	}
	removeStaleTemps(cfg.Dir)
	a := &Authority{
		cfg:      cfg,
		log:      cfg.Logger,
		lock:     lock,
		stored:   stored,
		watchers: map[*watcher]struct{}{},
		admitted: map[string]int{},
	}
	a.policy = leafPolicy{
		now: cfg.Clock.Now, random: cfg.Rand, lifetime: cfg.LeafLifetime, allow: a.mayIssue, maxLeaves: maxLeaves,
	}
	st, err := a.rotate(ctx, cfg.Clock.Now(), nil)
	if st == nil {
		return nil, err
	}
	if err != nil {
		a.log.Error("ca: rotation at start failed; serving with the current signer", logError, err.Error())
	}
	st.leaves = newLeafIssuer(st.signer, a.policy)
	a.state.Store(st)
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.log.Info("ca: ready", logFingerprint, st.status.Signer.Fingerprint, logNotAfter, st.status.Signer.NotAfter)
	a.mu.Lock()
	a.timer = cfg.Clock.AfterFunc(a.timerDelay(st), a.onTimer)
	a.mu.Unlock()
	return a, nil
}

// loadStored reads the store's certificates; their keys stay sealed.
func loadStored(dir string) ([]*authority, error) {
	raw, err := readStore(dir)
	if err != nil {
		return nil, err
	}
	return parseStored(storePath(dir), raw)
}

func parseStored(path string, raw []storedAuthority) ([]*authority, error) {
	stored := make([]*authority, 0, len(raw))
	for i, r := range raw {
		s, err := parseStoredCert(r)
		if err != nil {
			return nil, refusal(path, ErrStoreUnreadable, fmt.Sprintf("CA #%d: %v", i+1, err))
		}
		stored = append(stored, s)
	}
	return stored, nil
}

func validities(stored []*authority) []validity {
	v := make([]validity, len(stored))
	for i, s := range stored {
		v[i] = s.validity()
	}
	return v
}

// rotate applies the rotation plan at now: mints what is due and writes
// the store (dropping CAs that left the bundle). It always returns the best
// state it can: a failed mint or write keeps the roles the stored CAs allow
// (a switch needs no write), and the error sets the next review one
// ReviewInterval away. Only when no stored CA can sign and none could be
// minted does it fall back to prev, the current state; with prev nil it
// returns no state. The caller holds reviewMu, or has not shared a.
func (a *Authority) rotate(ctx context.Context, now time.Time, prev *caState) (*caState, error) {
	plan := planRotation(rotationInput{Now: now, Stored: validities(a.stored), Timing: a.cfg.timing()})
	var err error
	switch {
	case plan.Signer == noCA || plan.MintSuccessor:
		var fresh *authority
		fresh, err = mintAuthority(ctx, now, a.cfg.Lifetime, a.cfg.Rand, a.cfg.Sealer)
		if err == nil {
			err = a.replaceStored(append(kept(a.stored, plan), fresh))
		}
		if err == nil {
			a.log.Info("ca: minted a CA", logFingerprint, fresh.info().Fingerprint, logNotAfter, fresh.cert.NotAfter, logReason, plan.Reason)
		} else {
			err = fmt.Errorf("ca: minting a CA (%s): %w", plan.Reason, err)
		}
	case len(plan.Drop) > 0:
		if err = a.replaceStored(kept(a.stored, plan)); err != nil {
			err = fmt.Errorf("ca: dropping retired CAs from the store: %w", err)
		}
	}
	if err == nil {
		plan = planRotation(rotationInput{Now: now, Stored: validities(a.stored), Timing: a.cfg.timing()})
	}
	var st *caState
	switch {
	case plan.Signer != noCA:
		var successor *authority
		if plan.Successor != noCA {
			successor = a.stored[plan.Successor]
		}
		st = newState(a.stored[plan.Signer], successor, plan.NextTransition)
	case prev != nil:
		st = newState(prev.signer, prev.successor, time.Time{})
	default:
		return nil, err
	}
	st.reviewedAt = now.Round(0)
	if retry := now.Add(a.cfg.ReviewInterval); err != nil && (st.nextReview.IsZero() || retry.Before(st.nextReview)) {
		st.nextReview = retry
	}
	return st, err
}

// kept is the stored CAs the plan keeps: signer, successor, retired.
func kept(stored []*authority, plan rotationPlan) []*authority {
	var out []*authority
	for _, i := range append([]int{plan.Signer, plan.Successor}, plan.Retired...) {
		if i != noCA {
			out = append(out, stored[i])
		}
	}
	return out
}

// replaceStored writes set as the store and, once durable, adopts it: a CA
// is never used before its sealed key is safely on disk.
func (a *Authority) replaceStored(set []*authority) error {
	raw := make([]storedAuthority, len(set))
	for i, s := range set {
		raw[i] = s.stored()
	}
	if err := writeStore(a.cfg.Dir, raw); err != nil {
		return err
	}
	a.stored = set
	return nil
}

// current returns the state, reviewing first when the dates call for it.
func (a *Authority) current() *caState { return a.currentAt(a.cfg.Clock.Now()) }

// currentAt is current for a caller that read the clock already: the state
// it returns can sign at now (a review it makes reads the clock again, no
// earlier than now).
func (a *Authority) currentAt(now time.Time) *caState {
	st := a.state.Load()
	if !st.due(now) {
		return st
	}
	st, changed := a.review()
	if changed {
		a.deliverAll()
	}
	return st
}

// review brings the state up to date and reports whether the bundle
// changed (the caller delivers it). A failure keeps serving (the current
// signer, or the successor if the switch is due) and is retried one
// ReviewInterval later; it never fails a handshake.
func (a *Authority) review() (st *caState, bundleChanged bool) {
	a.reviewMu.Lock()
	defer a.reviewMu.Unlock()
	prev := a.state.Load()
	now := a.cfg.Clock.Now()
	if a.closed.Load() || !prev.due(now) {
		return prev, false
	}
	st, err := a.rotate(a.ctx, now, prev)
	if err != nil {
		a.log.Error("ca: review failed; serving with the current signer and retrying at the next review",
			logError, err.Error(), logRetryAt, st.nextReview)
	}
	if st.signer == prev.signer {
		st.leaves = prev.leaves
	} else {
		st.leaves = newLeafIssuer(st.signer, a.policy)
		a.log.Info("ca: the signer changed; leaves are issued anew",
			logFingerprint, st.status.Signer.Fingerprint, logNotAfter, st.status.Signer.NotAfter)
	}
	a.state.Store(st)
	if st.leaves != prev.leaves {
		prev.leaves.stop()
	}
	return st, !bytes.Equal(st.bundle, prev.bundle)
}

// onTimer is the periodic review: it delivers a changed bundle and retries
// failed deliveries in one pass.
func (a *Authority) onTimer() {
	st := a.state.Load()
	if st.due(a.cfg.Clock.Now()) {
		st, _ = a.review()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.trustClosed {
		return
	}
	a.deliverAllLocked()
	a.timer.Reset(a.timerDelay(st))
}

// timerDelay is the time to the next review: a transition, or
// ReviewInterval, whichever comes first.
func (a *Authority) timerDelay(st *caState) time.Duration {
	d := min(st.nextReview.Sub(a.cfg.Clock.Now()), a.cfg.ReviewInterval)
	return max(d, minTimerDelay)
}

// GetCertificate returns a leaf for the handshake's server name, signed by
// the current signer and fresh at the clock's now; it is a
// tls.Config.GetCertificate. It reviews the CA first when a transition is
// due. A name AllowName refuses, and no AdmitName holds, gets an error and
// no leaf, even one cached earlier.
func (a *Authority) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if a.closed.Load() {
		return nil, ErrClosed
	}
	// The leaf's time is read after the state: a review reads the clock
	// itself and may mint a signer that begins after an earlier reading
	// (a leaf dated before its signer would not be valid), and a state
	// that is due again at the later reading (the clock jumped on) is
	// reviewed again, a few times at most.
	var st *caState
	var now time.Time
	for try := 0; ; try++ {
		st = a.currentAt(a.cfg.Clock.Now())
		now = a.cfg.Clock.Now()
		if !st.due(now) || try == 2 {
			break
		}
	}
	name := normalizeServerName(hello.ServerName)
	if name == "" {
		return nil, errors.New("ca: the client sent no server name (SNI); no leaf without one")
	}
	if err := allowed(a.policy.allow, name); err != nil {
		return nil, err
	}
	ctx := hello.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	return st.leaves.get(ctx, name, now)
}

// AdmitName lets name get a leaf although AllowName refuses it, until
// release is called. It is the secrets proxy's gate for a name it decided
// to intercept only to scrub the answers (policy.InterceptToScrub: under
// open egress, a run holding a key an upstream may store has its other
// names intercepted), and the proxy holds it around that one connection's
// handshake: no other caller, and no handshake outside one the proxy
// decided, gets a leaf for a name the policy does not list. Holds are
// counted per name (concurrent connections to one name each hold their
// own); release may be called more than once. Such leaves are cached like
// the policy's, the cache bounded (maxLeaves), and a cached one is served
// only while its name is admitted again.
func (a *Authority) AdmitName(name string) (release func()) {
	name = normalizeServerName(name)
	a.admitMu.Lock()
	a.admitted[name]++
	a.admitMu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			a.admitMu.Lock()
			defer a.admitMu.Unlock()
			if a.admitted[name]--; a.admitted[name] <= 0 {
				delete(a.admitted, name)
			}
		})
	}
}

// mayIssue is the one name gate of the handshake, the on-demand decision
// and the Issuer: a name the policy lists (AllowName), or one AdmitName
// holds now.
func (a *Authority) mayIssue(name string) bool {
	if a.cfg.AllowName != nil && a.cfg.AllowName(name) {
		return true
	}
	a.admitMu.Lock()
	defer a.admitMu.Unlock()
	return a.admitted[name] > 0
}

// ServerTLSConfig is a server tls.Config on GetCertificate: TLS 1.2 at
// least, offering nextProtos (acme-tls/1, which certmagic's own TLSConfig
// adds, is never offered).
func (a *Authority) ServerTLSConfig(nextProtos ...string) *tls.Config {
	protos := slices.DeleteFunc(slices.Clone(nextProtos), func(p string) bool { return p == "acme-tls/1" })
	return &tls.Config{
		GetCertificate: a.GetCertificate,
		MinVersion:     tls.VersionTLS12,
		NextProtos:     protos,
	}
}

// Bundle is the PEM of the signer followed by its successor, if any: what a
// task installs to trust the proxy.
func (a *Authority) Bundle() []byte { return slices.Clone(a.current().bundle) }

// Status describes the signer and its successor.
func (a *Authority) Status() Status { return a.current().status }

// Close stops reviews and deliveries: it aborts the delivery under way and
// returns once it has ended, so nothing is delivered or written after.
// Called from inside a trust listener it is refused (ErrInsideTrustListener)
// and changes nothing. Later calls return the first one's result.
func (a *Authority) Close() error {
	if insideTrustListener() {
		return fmt.Errorf("ca: Close: %w", ErrInsideTrustListener)
	}
	a.closeOnce.Do(func() {
		a.cancel()
		a.reviewMu.Lock()
		a.closed.Store(true)
		a.reviewMu.Unlock()

		a.mu.Lock()
		a.trustClosed = true
		a.timer.Stop()
		for w := range a.watchers {
			a.stopWatcherLocked(w, ErrClosed)
		}
		a.mu.Unlock()
		a.deliveries.Wait()

		a.state.Load().leaves.stop()
		a.closeErr = a.lock.Close()
	})
	return a.closeErr
}
