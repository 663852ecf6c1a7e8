package broker

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
)

// The oauth2 refresher's timing.
const (
	// LeaseDuration is how long a refresher holds a credential's lease:
	// far longer than one exchange with the token endpoint (bounded by
	// the HTTP client's timeout) and the commit after it, so a live
	// refresher never loses it; one that died (a Lambda timed out) is
	// replaced once it passed.
	LeaseDuration = 60 * time.Second
	// flightLimit bounds one refresh or wait for another's, however the
	// callers that asked for it fare: a refresh, once begun, is finished
	// even when its caller gave up, since a refresh token the provider
	// rotated and Fleet did not store would end the family.
	flightLimit = 2 * LeaseDuration
	// pollFirst and pollMax are the backoff of a wait on another
	// invocation's refresh: its state is read at these intervals.
	pollFirst = 100 * time.Millisecond
	pollMax   = time.Second
	// failureHold is how long a refresh the provider refused is answered
	// from memory, so a dead refresh token costs the provider one call
	// per Fleet invocation per failureHold, not one per dispatch.
	failureHold = 30 * time.Second
	// defaultLifetime is an access token's assumed lifetime when the
	// provider omits expires_in (RFC 6749 only recommends it): short, so
	// a shorter real one is replaced soon rather than served stale.
	defaultLifetime = 15 * time.Minute
	// commitAttempts is how many times the new tokens' commit is tried.
	commitAttempts = 3
	// maxTokenAnswer bounds the token endpoint's answer read.
	maxTokenAnswer = 64 << 10
)

// The sealed values of a credential's state are each bound to its id and
// their role, so neither can be opened as the other, nor as another
// credential's.
func bindAccess(id string) string  { return id + "#access" }
func bindRefresh(id string) string { return id + "#refresh" }
func bindSeed(id string) string    { return id + "#seed" }

// oauth2Minter keeps one fleet-wide access token fresh for one key. Many
// goroutines of one Fleet process share one refresh or wait (a flight);
// processes share the credential's state and lease (store.BrokerStates).
type oauth2Minter struct {
	id   string // "<project>/<KEY>", the state's id
	r    OAuth2
	deps Deps
	// holder names this minter in the lease: unique per process.
	holder string

	mu     sync.Mutex
	opened access // the newest generation's access token opened
	seeds  seedCheck
	flight *flight
	failed *failedRefresh
}

// seedCheck is the last comparison of a family's Seed fingerprint with the
// configured seed, so a warm process compares each pair once (the
// fingerprint's key is sealed: a KMS call).
type seedCheck struct {
	seed   string   // the state's Seed
	digest [32]byte // SHA-256 of the configured seed it was compared with
	same   bool
}

// access is one generation's access token, opened. A warm process opens
// each generation once: no KMS call per dispatch.
type access struct {
	generation int64
	expiresAt  time.Time
	// lifetime is the token's whole life (expires_in), kept sealed with
	// it: a store's state says when it ends, not when it began.
	lifetime time.Duration
	value    hostproto.SecretString
}

// fresh reports whether a may be handed out at now: it has more than its
// margin left. The margin is RefreshMargin, or half the token's lifetime
// when that is shorter (a provider issuing 10-minute tokens would
// otherwise have every dispatch refresh).
func (a access) fresh(now time.Time) bool {
	return a.value != "" && a.expiresAt.Sub(now) > min(RefreshMargin, a.lifetime/2)
}

func (a access) minted() Minted {
	return Minted{Kind: KindOAuth2, Value: a.value, ExpiresAt: a.expiresAt}
}

// flight is one refresh, or wait for another process's, shared by every
// caller of one process; a and err are set before done is closed.
type flight struct {
	done chan struct{}
	a    access
	err  error
	// exchanging is set from the request to the token endpoint until the
	// answer is stored: callers wait for that even past their context,
	// since in Lambda a handler that returns freezes the flight, and a
	// refresh token rotated but not stored ends the family.
	exchanging atomic.Bool
}

// failedRefresh is a refusal by the provider, kept for failureHold.
type failedRefresh struct {
	generation int64
	until      time.Time
	err        *Error
}

func newOAuth2Minter(id string, r OAuth2, deps Deps) (*oauth2Minter, error) {
	holder := make([]byte, 12)
	if _, err := io.ReadFull(deps.Random, holder); err != nil {
		return nil, fmt.Errorf("broker: %s: naming the refresher: %w", id, err)
	}
	return &oauth2Minter{id: id, r: r, deps: deps, holder: base64.RawURLEncoding.EncodeToString(holder)}, nil
}

// mint returns the current access token, refreshed first when it has too
// little left.
func (m *oauth2Minter) mint(ctx context.Context) (Minted, error) {
	st, err := m.deps.States.GetBrokerState(ctx, m.id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return Minted{}, m.fail(0, "reading its state: %v", err)
	}
	if st.Generation > 0 {
		a, err := m.open(ctx, st)
		switch {
		case err == nil && a.fresh(m.deps.Clock.Now()):
			if !m.reseeded(ctx, st) {
				return a.minted(), nil
			}
			// An operator stored a new seed (after revoking the family
			// at the provider, say): start again from it now, not at the
			// expiry. Until that works, the current token is served.
			if b, err := m.refreshed(ctx, st.Generation); err == nil {
				return b.minted(), nil
			}
			return a.minted(), nil
		case err != nil && !errors.Is(err, ErrUnopenable):
			return Minted{}, m.fail(0, "opening its access token: %v", err)
		}
		// Due, or sealed under a key no longer ours: refresh.
	}
	a, err := m.refreshed(ctx, st.Generation)
	if err != nil {
		return Minted{}, err
	}
	return a.minted(), nil
}

// open returns st's access token, opening it once per generation.
func (m *oauth2Minter) open(ctx context.Context, st store.BrokerState) (access, error) {
	m.mu.Lock()
	a := m.opened
	m.mu.Unlock()
	if a.generation == st.Generation && a.expiresAt.Equal(st.AccessExpiresAt) && a.value != "" {
		return a, nil
	}
	plain, err := m.deps.Sealer.Open(ctx, st.SealedAccessToken, bindAccess(m.id))
	if err != nil {
		return access{}, err
	}
	defer clear(plain)
	lifetime, token, err := unwrapAccess(plain)
	if err != nil {
		return access{}, fmt.Errorf("broker: %s's access token: %w: %w", m.id, err, ErrUnopenable)
	}
	a = access{generation: st.Generation, expiresAt: st.AccessExpiresAt, lifetime: lifetime, value: hostproto.SecretString(token)}
	m.remember(a)
	return a, nil
}

func (m *oauth2Minter) remember(a access) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if a.generation >= m.opened.generation {
		m.opened = a
	}
}

// The access token is sealed as accessFormat, its lifetime in seconds (8
// bytes, big-endian), then the token.
const accessFormat = 1

func wrapAccess(token string, lifetime time.Duration) []byte {
	b := make([]byte, 9, 9+len(token))
	b[0] = accessFormat
	binary.BigEndian.PutUint64(b[1:9], uint64(lifetime/time.Second))
	return append(b, token...)
}

func unwrapAccess(b []byte) (time.Duration, string, error) {
	if len(b) < 10 || b[0] != accessFormat {
		return 0, "", errors.New("not an access token of this format")
	}
	return time.Duration(binary.BigEndian.Uint64(b[1:9])) * time.Second, string(b[9:]), nil
}

// reseeded reports whether refreshTokenSecret now holds another seed than
// the one st's family began from. Not knowing (the secret or the sealer
// failed) is no: the family goes on.
func (m *oauth2Minter) reseeded(ctx context.Context, st store.BrokerState) bool {
	if st.Seed == "" {
		return false
	}
	token, err := m.deps.Secrets.Read(ctx, m.r.RefreshTokenSecret)
	if err != nil {
		m.deps.Logger.Warn("broker: reading refreshTokenSecret to compare its seed", "key", m.id, "kind", KindOAuth2, "err", err)
		return false
	}
	digest := sha256.Sum256([]byte(token))
	m.mu.Lock()
	c := m.seeds
	m.mu.Unlock()
	if c.seed == st.Seed && c.digest == digest {
		return !c.same
	}
	same, err := m.seedMatches(ctx, st.Seed, token)
	if err != nil {
		return false
	}
	m.rememberSeed(st.Seed, token, same)
	return !same
}

func (m *oauth2Minter) rememberSeed(seed, token string, same bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seeds = seedCheck{seed: seed, digest: sha256.Sum256([]byte(token)), same: same}
}

// refreshed returns the access token once a refresh, this process's or
// another's, has replaced generation seen, or the provider's refusal.
func (m *oauth2Minter) refreshed(ctx context.Context, seen int64) (access, error) {
	m.mu.Lock()
	if f := m.failed; f != nil && f.generation == seen && m.deps.Clock.Now().Before(f.until) {
		m.mu.Unlock()
		return access{}, f.err
	}
	f := m.flight
	if f == nil {
		f = &flight{done: make(chan struct{})}
		m.flight = f
		go m.fly(context.WithoutCancel(ctx), f, seen)
	}
	m.mu.Unlock()
	select {
	case <-f.done:
		return f.a, f.err
	case <-ctx.Done():
		if f.exchanging.Load() {
			<-f.done // bounded by the HTTP client's timeout and one store write
		}
		return access{}, m.fail(0, "waiting for its refresh: %v", ctx.Err())
	}
}

// fly runs one flight to its end, on its own goroutine.
func (m *oauth2Minter) fly(ctx context.Context, f *flight, seen int64) {
	ctx, cancel := clock.WithTimeout(ctx, m.deps.Clock, flightLimit)
	defer cancel()
	a, err := m.refreshOrWait(ctx, f, seen)
	m.mu.Lock()
	f.a, f.err = a, err
	if m.flight == f {
		m.flight = nil
	}
	var e *Error
	if errors.As(err, &e) && e.ProviderStatus != 0 {
		m.failed = &failedRefresh{generation: seen, until: m.deps.Clock.Now().Add(failureHold), err: e}
	} else if err == nil {
		m.failed = nil
	}
	m.mu.Unlock()
	close(f.done)
}

// refreshOrWait takes the lease and refreshes generation seen, or waits
// for the lease's holder to: never two refreshes of one credential at
// once, fleet-wide.
func (m *oauth2Minter) refreshOrWait(ctx context.Context, f *flight, seen int64) (access, error) {
	for {
		now := m.deps.Clock.Now()
		st, err := m.deps.States.AcquireBrokerLease(ctx, m.id, m.holder, now.Add(LeaseDuration))
		switch {
		case err == nil:
			if st.Generation > seen {
				// Another refreshed between our read and our lease.
				if a, err := m.open(ctx, st); err == nil && a.fresh(now) {
					m.release(ctx)
					return a, nil
				}
			}
			return m.refresh(ctx, f, st)
		case errors.Is(err, store.ErrConflict):
			next, err := m.await(ctx, st)
			if err != nil {
				return access{}, err
			}
			if next.Generation > st.Generation {
				a, err := m.open(ctx, next)
				if err != nil {
					return access{}, m.fail(0, "opening its access token: %v", err)
				}
				return a, nil
			}
			// The lease is free again without a new token (its holder
			// failed, or died): take it ourselves.
		default:
			return access{}, m.fail(0, "taking its refresh lease: %v", err)
		}
	}
}

// await polls the state, on the clock with a short backoff, until a
// generation newer than held's is committed or held's lease is released
// or expired, and returns the state as read.
func (m *oauth2Minter) await(ctx context.Context, held store.BrokerState) (store.BrokerState, error) {
	wait := pollFirst
	for {
		if left := held.LeaseExpiresAt.Sub(m.deps.Clock.Now()); left > 0 && left < wait {
			wait = left
		}
		if !clock.Sleep(m.deps.Clock, wait, ctx.Done()) {
			return store.BrokerState{}, m.fail(0, "waiting for another Fleet invocation's refresh: %v", ctx.Err())
		}
		wait = min(2*wait, pollMax)
		st, err := m.deps.States.GetBrokerState(ctx, m.id)
		if err != nil {
			return store.BrokerState{}, m.fail(0, "reading its state: %v", err)
		}
		if st.Generation > held.Generation || st.LeaseHolder != held.LeaseHolder || !m.deps.Clock.Now().Before(st.LeaseExpiresAt) {
			return st, nil
		}
	}
}

// refresh exchanges the refresh token while holding the lease, and stores
// the new tokens before it returns them. It releases the lease on failure
// (a commit releases it on success).
func (m *oauth2Minter) refresh(ctx context.Context, f *flight, st store.BrokerState) (_ access, err error) {
	defer func() {
		f.exchanging.Store(false)
		if err != nil {
			m.release(ctx)
		}
	}()
	clientSecret, err := m.deps.Secrets.Read(ctx, m.r.ClientSecretSecret)
	if err != nil {
		return access{}, m.fail(0, "reading clientSecretSecret: %v", err)
	}
	seedToken, err := m.deps.Secrets.Read(ctx, m.r.RefreshTokenSecret)
	if err != nil {
		return access{}, m.fail(0, "reading refreshTokenSecret: %v", err)
	}
	refreshToken, seed, restart, err := m.refreshTokenOf(ctx, st, seedToken)
	if err != nil {
		return access{}, err
	}
	f.exchanging.Store(true)
	answer, err := m.exchange(ctx, refreshToken, clientSecret, restart)
	if err != nil {
		return access{}, err
	}
	if answer.refreshToken == "" {
		// The provider does not rotate: the token presented stays.
		answer.refreshToken = refreshToken
	}
	now := m.deps.Clock.Now()
	next := st
	next.Seed = seed
	next.AccessExpiresAt = now.Add(answer.lifetime)
	next.UpdatedAt = now
	next.LeaseHolder = m.holder
	wrapped := wrapAccess(answer.accessToken, answer.lifetime)
	defer clear(wrapped)
	if next.SealedRefreshToken, err = m.deps.Sealer.Seal(ctx, []byte(answer.refreshToken), bindRefresh(m.id)); err != nil {
		return access{}, m.lost("sealing the new refresh token: %v", err)
	}
	if next.SealedAccessToken, err = m.deps.Sealer.Seal(ctx, wrapped, bindAccess(m.id)); err != nil {
		return access{}, m.lost("sealing the new access token: %v", err)
	}
	// A store failure that is not an answer (a throttle, a lost
	// response) is tried again at once: the rotated token exists nowhere
	// else. A retried write recognises its own success (dynamostore's
	// write tokens).
	var committed store.BrokerState
	for range commitAttempts {
		committed, err = m.deps.States.CommitBrokerState(ctx, next)
		if err == nil || errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return access{}, m.lost("storing the new tokens: %v", err)
	}
	a := access{generation: committed.Generation, expiresAt: committed.AccessExpiresAt, lifetime: answer.lifetime,
		value: hostproto.SecretString(answer.accessToken)}
	m.remember(a)
	m.rememberSeed(committed.Seed, seedToken, true)
	m.deps.OnEvent(KindOAuth2, EventRefresh)
	m.deps.Logger.Info("broker: refreshed", "key", m.id, "kind", KindOAuth2,
		"generation", committed.Generation, "expiresAt", committed.AccessExpiresAt, "fromSeed", restart)
	return a, nil
}

// refreshTokenOf picks the refresh token to present: the stored one, or
// the configured seed when there is none or the operator stored a new
// seed since the family began (restart). It returns the Seed fingerprint
// the committed state will carry.
func (m *oauth2Minter) refreshTokenOf(ctx context.Context, st store.BrokerState, seedToken string) (token, seed string, restart bool, err error) {
	if len(st.SealedRefreshToken) > 0 {
		same, err := m.seedMatches(ctx, st.Seed, seedToken)
		if err != nil {
			return "", "", false, err
		}
		if same {
			plain, err := m.deps.Sealer.Open(ctx, st.SealedRefreshToken, bindRefresh(m.id))
			switch {
			case err == nil:
				defer clear(plain)
				return string(plain), st.Seed, false, nil
			case !errors.Is(err, ErrUnopenable):
				return "", "", false, m.fail(0, "opening its refresh token: %v", err)
			}
			m.deps.Logger.Warn("broker: the stored refresh token cannot be opened; starting again from refreshTokenSecret",
				"key", m.id, "kind", KindOAuth2)
		}
	}
	seed, err = m.newSeed(ctx, seedToken)
	if err != nil {
		return "", "", false, err
	}
	return seedToken, seed, true, nil
}

// The Seed fingerprint is "s1.<sealed key>.<HMAC-SHA256 of the seed under
// that key>", both base64url: keyed with a random key of the family's,
// sealed, so the table alone (a backup, a reader with no KMS grant) cannot
// confirm a guess at a seed.
const seedVersion = "s1"

func (m *oauth2Minter) newSeed(ctx context.Context, seedToken string) (string, error) {
	key := make([]byte, 32)
	defer clear(key)
	if _, err := io.ReadFull(m.deps.Random, key); err != nil {
		return "", m.fail(0, "making its seed fingerprint: %v", err)
	}
	sealed, err := m.deps.Sealer.Seal(ctx, key, bindSeed(m.id))
	if err != nil {
		return "", m.fail(0, "sealing its seed fingerprint: %v", err)
	}
	enc := base64.RawURLEncoding
	return seedVersion + "." + enc.EncodeToString(sealed) + "." + enc.EncodeToString(seedMAC(key, seedToken)), nil
}

// seedMatches reports whether seed fingerprints seedToken. A fingerprint
// that cannot be read or opened matches nothing: the family restarts from
// the configured seed. Only a failure that may pass (KMS unreachable) is an
// error, so a passing outage never restarts a family from a stale seed.
func (m *oauth2Minter) seedMatches(ctx context.Context, seed, seedToken string) (bool, error) {
	version, rest, _ := strings.Cut(seed, ".")
	sealedB64, macB64, ok := strings.Cut(rest, ".")
	enc := base64.RawURLEncoding
	sealed, err1 := enc.DecodeString(sealedB64)
	mac, err2 := enc.DecodeString(macB64)
	if version != seedVersion || !ok || err1 != nil || err2 != nil {
		return false, nil
	}
	key, err := m.deps.Sealer.Open(ctx, sealed, bindSeed(m.id))
	switch {
	case errors.Is(err, ErrUnopenable):
		return false, nil
	case err != nil:
		return false, m.fail(0, "opening its seed fingerprint: %v", err)
	}
	defer clear(key)
	return hmac.Equal(mac, seedMAC(key, seedToken)), nil
}

func seedMAC(key []byte, seedToken string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(seedToken))
	return h.Sum(nil)
}

// tokenAnswer is a token endpoint's successful answer.
type tokenAnswer struct {
	accessToken, refreshToken string
	lifetime                  time.Duration
}

// errorCode is what of an error answer's "error" is repeated: an RFC 6749
// code, or a provider's own of the same shape.
var errorCode = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// exchange is the refresh_token grant (RFC 6749 section 6) with
// client_secret_basic (section 2.3.1).
func (m *oauth2Minter) exchange(ctx context.Context, refreshToken, clientSecret string, fromSeed bool) (tokenAnswer, error) {
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refreshToken}}
	if len(m.r.Scopes) > 0 {
		form.Set("scope", strings.Join(m.r.Scopes, " "))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.r.TokenURL, strings.NewReader(form.Encode()))
	if err != nil {
		return tokenAnswer{}, m.fail(0, "building the token request: %v", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.SetBasicAuth(url.QueryEscape(m.r.ClientID), url.QueryEscape(clientSecret))
	resp, err := m.deps.HTTPClient.Do(req)
	if err != nil {
		// url.Error repeats the method and URL, nothing of the body.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return tokenAnswer{}, m.fail(0, "calling the token endpoint %s: %v", m.r.TokenURL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenAnswer))
	if err != nil {
		return tokenAnswer{}, m.fail(resp.StatusCode, "reading the token endpoint's answer: %v", err)
	}
	var a struct {
		AccessToken  string          `json:"access_token"`
		RefreshToken string          `json:"refresh_token"`
		ExpiresIn    json.RawMessage `json:"expires_in"`
		Error        string          `json:"error"`
	}
	decodeErr := json.Unmarshal(body, &a)
	clear(body)
	if resp.StatusCode != http.StatusOK {
		code := "no error code"
		if errorCode.MatchString(a.Error) {
			code = a.Error
		}
		if code == "invalid_grant" && fromSeed {
			return tokenAnswer{}, m.fail(resp.StatusCode, "the token endpoint refused the refresh token of refreshTokenSecret %s (invalid_grant): store a new one there", m.r.RefreshTokenSecret)
		}
		if code == "invalid_grant" {
			return tokenAnswer{}, m.fail(resp.StatusCode, "the token endpoint refused the stored refresh token (invalid_grant: revoked, or used by another client): store a new one in refreshTokenSecret %s", m.r.RefreshTokenSecret)
		}
		return tokenAnswer{}, m.fail(resp.StatusCode, "the token endpoint refused the refresh (%s)", code)
	}
	switch {
	case decodeErr != nil:
		return tokenAnswer{}, m.lost("the token endpoint's answer is not JSON")
	case a.AccessToken == "":
		return tokenAnswer{}, m.lost("the token endpoint answered no access_token")
	}
	return tokenAnswer{accessToken: a.AccessToken, refreshToken: a.RefreshToken, lifetime: lifetime(a.ExpiresIn)}, nil
}

// lifetime reads expires_in: seconds, as a number or (some providers) a
// string; absent or not positive is defaultLifetime.
func lifetime(raw json.RawMessage) time.Duration {
	s := strings.Trim(string(raw), `"`)
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > int64(366*24*time.Hour/time.Second) {
		return defaultLifetime
	}
	return time.Duration(n) * time.Second
}

// release frees the lease; a failure is logged only, the lease expiring
// on its own.
func (m *oauth2Minter) release(ctx context.Context) {
	if err := m.deps.States.ReleaseBrokerLease(ctx, m.id, m.holder); err != nil {
		m.deps.Logger.Warn("broker: releasing the refresh lease", "key", m.id, "kind", KindOAuth2, "err", err)
	}
}

// fail makes the *Error of a failed mint of this key, and logs it.
func (m *oauth2Minter) fail(status int, format string, args ...any) *Error {
	project, key, _ := strings.Cut(m.id, "/")
	e := &Error{ProjectID: project, Key: key, Kind: KindOAuth2, ProviderStatus: status, Detail: fmt.Sprintf(format, args...)}
	m.deps.Logger.Warn("broker: oauth2 refresh failed", "key", m.id, "kind", KindOAuth2, "providerStatus", status, "detail", e.Detail)
	return e
}

// lost is a failure after the provider may have rotated the refresh
// token: if it did, the family is over and an operator must seed it again.
func (m *oauth2Minter) lost(format string, args ...any) *Error {
	e := m.fail(0, format, args...)
	e.Detail += "; the provider may have rotated the refresh token, in which case store a new one in refreshTokenSecret " + m.r.RefreshTokenSecret
	m.deps.Logger.Error("broker: a refreshed token may be lost", "key", m.id, "kind", KindOAuth2)
	return e
}
