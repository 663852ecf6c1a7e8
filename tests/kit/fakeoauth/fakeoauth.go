// Package fakeoauth is an OAuth2 token endpoint on loopback over TLS that
// behaves as the providers with rotating refresh tokens do (Google,
// Atlassian, Auth0, Okta with rotation on): every refresh (RFC 6749
// section 6) answers a new refresh token and retires the one presented;
// presenting a retired one again is taken as theft, answered invalid_grant,
// and revokes its whole family, the newest refresh token and every access
// token included (OAuth 2.0 Security BCP, RFC 9700 section 4.14.2). It
// checks the client's authentication (client_secret_basic), counts
// refreshes and invalid_grant answers, and tells whether an access token is
// honoured, so tests assert what the provider saw.
package fakeoauth

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
)

// Token prefixes, so a leak test can grep for any token this server
// issued.
const (
	RefreshPrefix = "fo_rt_"
	AccessPrefix  = "fo_at_"
)

// Config configures a Server.
type Config struct {
	// ClientID and ClientSecret are the one client the server knows.
	ClientID, ClientSecret string
	// ExpiresIn is the access tokens' lifetime (expires_in); zero is one
	// hour.
	ExpiresIn time.Duration
	// Scopes are what a family is granted; a refresh may ask for these
	// or fewer. Nil grants any scope asked.
	Scopes []string
	// NoRotation answers refreshes without a new refresh token, the
	// presented one staying valid (providers without rotation).
	NoRotation bool
	// Clock times access tokens' expiry; nil is the real clock.
	Clock clock.Clock
}

// Server is a running token endpoint. Its methods are safe for concurrent
// use.
type Server struct {
	// URL is the token endpoint (https://127.0.0.1:port/token).
	URL string
	// Client trusts the server's certificate.
	Client *http.Client

	cfg Config
	srv *httptest.Server

	mu            sync.Mutex
	refresh       map[string]*refreshToken
	access        map[string]*accessToken
	revoked       map[int]bool // families
	families      int
	refreshes     int
	invalidGrants int
	badClients    int
	lastScope     string
	hold          *gate // non-nil: token requests wait for it to open
	arrived       chan struct{}
}

// gate holds token requests until opened.
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

type refreshToken struct {
	family  int
	retired bool
}

type accessToken struct {
	family  int
	expires time.Time
}

// Start serves a token endpoint until the test ends.
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	if cfg.ExpiresIn == 0 {
		cfg.ExpiresIn = time.Hour
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	s := &Server{
		cfg: cfg, refresh: map[string]*refreshToken{}, access: map[string]*accessToken{},
		revoked: map[int]bool{}, arrived: make(chan struct{}, 1024),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /token", s.token)
	s.srv = httptest.NewTLSServer(mux)
	t.Cleanup(s.srv.Close)
	// Before Close (cleanups run last first), which waits for every
	// request: a test that failed while holding must not hang there.
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.hold != nil {
			s.hold.open()
		}
	})
	s.URL = s.srv.URL + "/token"
	s.Client = s.srv.Client()
	return s
}

// Seed starts a new family, as a person's consent would, and returns its
// first refresh token: what an operator stores as refreshTokenSecret.
func (s *Server) Seed() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.families++
	rt := RefreshPrefix + random()
	s.refresh[rt] = &refreshToken{family: s.families}
	return rt
}

// Refreshes counts the refreshes answered with a token.
func (s *Server) Refreshes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refreshes
}

// InvalidGrants counts the refreshes answered invalid_grant.
func (s *Server) InvalidGrants() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.invalidGrants
}

// BadClients counts the requests whose client authentication failed.
func (s *Server) BadClients() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.badClients
}

// LastScope is the scope parameter of the last refresh answered.
func (s *Server) LastScope() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastScope
}

// Honoured reports whether an API would accept accessToken now: issued
// here, not expired, its family not revoked.
func (s *Server) Honoured(accessToken string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.access[accessToken]
	return ok && !s.revoked[a.family] && s.cfg.Clock.Now().Before(a.expires)
}

// Retired reports whether refreshToken was issued here and presented
// already: a refresher started from it.
func (s *Server) Retired(refreshToken string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	rt, ok := s.refresh[refreshToken]
	return ok && rt.retired
}

// SetExpiresIn changes the lifetime of the access tokens issued next.
func (s *Server) SetExpiresIn(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.ExpiresIn = d
}

// Hold makes token requests wait, once they arrived (Arrived), until the
// returned release is called: a refresh in flight, for a test to look at
// who waits for it.
func (s *Server) Hold() (release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := &gate{ch: make(chan struct{})}
	s.hold = g
	return func() {
		s.mu.Lock()
		if s.hold == g {
			s.hold = nil
		}
		s.mu.Unlock()
		g.open()
	}
}

// Arrived delivers one value per token request received while held.
func (s *Server) Arrived() <-chan struct{} { return s.arrived }

func (s *Server) token(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	hold := s.hold
	s.mu.Unlock()
	if hold != nil {
		s.arrived <- struct{}{}
		select {
		case <-hold.ch:
		case <-r.Context().Done():
			return
		}
	}
	if !s.clientOK(r) {
		s.mu.Lock()
		s.badClients++
		s.mu.Unlock()
		w.Header().Set("WWW-Authenticate", `Basic realm="token"`)
		oauthError(w, http.StatusUnauthorized, "invalid_client")
		return
	}
	if err := r.ParseForm(); err != nil || r.PostForm.Get("grant_type") == "" {
		oauthError(w, http.StatusBadRequest, "invalid_request")
		return
	}
	if r.PostForm.Get("grant_type") != "refresh_token" {
		oauthError(w, http.StatusBadRequest, "unsupported_grant_type")
		return
	}
	scope := r.PostForm.Get("scope")
	if s.cfg.Scopes != nil {
		for _, sc := range strings.Fields(scope) {
			if !slices.Contains(s.cfg.Scopes, sc) {
				oauthError(w, http.StatusBadRequest, "invalid_scope")
				return
			}
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	presented := s.refresh[r.PostForm.Get("refresh_token")]
	switch {
	case presented == nil || s.revoked[presented.family]:
		s.invalidGrants++
		oauthError(w, http.StatusBadRequest, "invalid_grant")
		return
	case presented.retired:
		// Reuse: one of two holders is a thief; the family ends.
		s.revoked[presented.family] = true
		s.invalidGrants++
		oauthError(w, http.StatusBadRequest, "invalid_grant")
		return
	}
	answer := map[string]any{"token_type": "Bearer", "expires_in": int64(s.cfg.ExpiresIn / time.Second)}
	if !s.cfg.NoRotation {
		presented.retired = true
		next := RefreshPrefix + random()
		s.refresh[next] = &refreshToken{family: presented.family}
		answer["refresh_token"] = next
	}
	at := AccessPrefix + random()
	s.access[at] = &accessToken{family: presented.family, expires: s.cfg.Clock.Now().Add(s.cfg.ExpiresIn)}
	answer["access_token"] = at
	if scope != "" {
		answer["scope"] = scope
	}
	s.refreshes++
	s.lastScope = scope
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(answer)
}

// clientOK checks client_secret_basic: both parts form-urlencoded, then
// Basic (RFC 6749 section 2.3.1).
func (s *Server) clientOK(r *http.Request) bool {
	scheme, cred, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return false
	}
	raw, err := base64.StdEncoding.DecodeString(cred)
	if err != nil {
		return false
	}
	id, secret, ok := strings.Cut(string(raw), ":")
	if !ok {
		return false
	}
	id, err1 := url.QueryUnescape(id)
	secret, err2 := url.QueryUnescape(secret)
	return err1 == nil && err2 == nil &&
		subtle.ConstantTimeCompare([]byte(id), []byte(s.cfg.ClientID)) == 1 &&
		subtle.ConstantTimeCompare([]byte(secret), []byte(s.cfg.ClientSecret)) == 1
}

func oauthError(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code})
}

func random() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
