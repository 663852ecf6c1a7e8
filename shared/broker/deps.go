package broker

import (
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
)

// SecretReader reads a recipe's secret reference (a *Secret field:
// `file:<path>` or a Secrets Manager id or ARN) to its value. The value is
// never logged nor put in an error; errors name the reference. Safe for
// concurrent use; honours ctx.
type SecretReader interface {
	Read(ctx context.Context, ref string) (string, error)
}

// Deps are what a Broker and each of its minters use. New fills the
// defaults, so a minter is handed Deps with Clock, HTTPClient, Logger,
// Random and OnEvent never nil.
type Deps struct {
	// Secrets reads the recipes' secret references. Required when there
	// is any recipe.
	Secrets SecretReader
	// Sealer seals what Fleet keeps of a value (RUNFLEET_BROKER_KEY).
	// Required when there is any recipe.
	Sealer Sealer
	// States keeps the oauth2 recipes' fleet-wide tokens and leases.
	// Required when there is an oauth2 recipe.
	States store.BrokerStates
	// Clock is read for every expiry, lease and wait; nil is the real
	// clock.
	Clock clock.Clock
	// HTTPClient calls the providers (GitHub, token endpoints); nil is
	// a client with DefaultHTTPTimeout and no redirects followed (a
	// token endpoint that redirects would carry the client's credentials
	// elsewhere).
	HTTPClient *http.Client
	// Logger receives one line per refresh, revocation and failure,
	// never a value; nil discards.
	Logger *slog.Logger
	// Random is read for lease holder ids and the local sealer's nonces;
	// nil is crypto/rand.
	Random io.Reader
	// OnEvent, when set, is called once per event (EventMint,
	// EventRefresh, EventFailure, EventRevocation) with the recipe kind,
	// synchronously on the goroutine that caused it: Fleet counts them
	// (EMF metrics). It must not block. Broker reports every mint,
	// revocation and failure of its calls; a minter reports only what
	// Broker cannot see (an oauth2 refresh).
	OnEvent func(kind, event string)
}

// Events OnEvent reports.
const (
	// EventMint: a value handed out for a run (a fresh GitHub token, or
	// the current OAuth2 access token).
	EventMint = "mint"
	// EventRefresh: a refresh token exchanged at the provider.
	EventRefresh = "refresh"
	// EventFailure: a mint, refresh or revocation that failed.
	EventFailure = "failure"
	// EventRevocation: a GitHub token revoked.
	EventRevocation = "revocation"
)

// DefaultHTTPTimeout bounds one call to a provider when Deps.HTTPClient is
// nil: Fleet mints inside a dispatch, which must answer well within its own
// deadline.
const DefaultHTTPTimeout = 10 * time.Second

// withDefaults returns d with every nil optional field filled.
func (d Deps) withDefaults() Deps {
	if d.Clock == nil {
		d.Clock = clock.Real{}
	}
	if d.HTTPClient == nil {
		d.HTTPClient = defaultHTTPClient()
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Random == nil {
		d.Random = rand.Reader
	}
	if d.OnEvent == nil {
		d.OnEvent = func(string, string) {}
	}
	return d
}

func defaultHTTPClient() *http.Client {
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Client{
		Timeout: DefaultHTTPTimeout,
		Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           dialer.DialContext,
			TLSHandshakeTimeout:   5 * time.Second,
			ResponseHeaderTimeout: DefaultHTTPTimeout,
			MaxIdleConnsPerHost:   4,
			IdleConnTimeout:       90 * time.Second,
			ForceAttemptHTTP2:     true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
