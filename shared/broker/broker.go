// Package broker mints the credentials Fleet hands a run instead of a host's
// long-lived secret (DESIGN.md, "Credentials Fleet mints"): per
// "<project>/<KEY>" one recipe from RUNFLEET_BROKER. A githubApp recipe
// mints an installation token limited to the run's repository and the
// recipe's permissions, for the run alone, and revokes it at the run's end;
// the App's private key never leaves Fleet. An oauth2 recipe keeps one
// fleet-wide access token fresh from a rotating refresh token, with one
// refresher at a time across every Fleet invocation (a lease in
// store.BrokerStates), the tokens sealed at rest.
//
// No value, refresh token, private key or JWT ever reaches a log line or an
// error: errors name the key, the recipe's field and the provider's status.
package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
)

// Recipe kinds.
const (
	KindGitHubApp = "githubApp"
	KindOAuth2    = "oauth2"
)

// MintRequest is one brokered key of one run.
type MintRequest struct {
	FleetRunID string
	ProjectID  string
	Key        string
	// Repository is the run's repository as the caller named it ("owner/
	// name", or a clone URL whose path ends owner/name[.git]); a githubApp
	// key needs one.
	Repository string
}

// Minted is a value for one key of one run.
type Minted struct {
	Kind      string
	Value     hostproto.SecretString
	ExpiresAt time.Time
	// Sealed is Value sealed for Fleet's own later use (a githubApp token,
	// revoked at the run's end: pass it to Revoke); nil for a fleet-wide
	// value (oauth2), which is never revoked per run.
	Sealed []byte
}

// Error is a mint or revoke that failed: the dispatch is refused 409
// credential_unavailable with these facts. It never holds a value.
type Error struct {
	ProjectID string
	Key       string
	Kind      string
	// ProviderStatus is the provider's HTTP status; 0 when it was not
	// reached (or the failure was Fleet's own, such as a secret it could
	// not read).
	ProviderStatus int
	// Detail says what failed, for a person (no value).
	Detail string
}

func (e *Error) Error() string {
	s := fmt.Sprintf("broker: %s/%s (%s): %s", e.ProjectID, e.Key, e.Kind, e.Detail)
	if e.ProviderStatus != 0 {
		s += fmt.Sprintf(" (provider answered %d)", e.ProviderStatus)
	}
	return s
}

// Sealer encrypts what the broker keeps at rest, bound to a context
// string (the item or key it belongs to): KMS in AWS, a local key file
// for the local stack. Safe for concurrent use.
type Sealer interface {
	Seal(ctx context.Context, plaintext []byte, bindTo string) ([]byte, error)
	Open(ctx context.Context, sealed []byte, bindTo string) ([]byte, error)
}

// RefreshMargin: a value with less left than this is replaced (minted
// again, or refreshed) before it is handed out or while a run holds it.
const RefreshMargin = 10 * time.Minute

// Recipe is one key's recipe: exactly one of its kinds is set.
type Recipe struct {
	GitHubApp *GitHubApp `json:"githubApp,omitempty"`
	OAuth2    *OAuth2    `json:"oauth2,omitempty"`
}

// GitHubApp mints installation tokens of a GitHub App.
type GitHubApp struct {
	AppID int64 `json:"appId"`
	// PrivateKeySecret is a secret reference to the App's PEM private key.
	PrivateKeySecret string `json:"privateKeySecret"`
	// InstallationID is the installation's id, or ByRepository (the JSON
	// string "byRepository"): looked up for each run's repository.
	InstallationID InstallationID `json:"installationId"`
	// Permissions are what each token may do (name -> read|write); a
	// token never has more.
	Permissions map[string]string `json:"permissions"`
	// APIURL is GitHub's API (GitHub Enterprise: https://HOST/api/v3);
	// empty is https://api.github.com.
	APIURL string `json:"apiUrl,omitempty"`
}

// InstallationID is an installation's id; zero with ByRepository set
// means "look it up for the run's repository".
type InstallationID struct {
	ID           int64
	ByRepository bool
}

// OAuth2 keeps one access token fresh from a rotating refresh token.
type OAuth2 struct {
	TokenURL           string   `json:"tokenUrl"`
	ClientID           string   `json:"clientId"`
	ClientSecretSecret string   `json:"clientSecretSecret"`
	RefreshTokenSecret string   `json:"refreshTokenSecret"`
	Scopes             []string `json:"scopes,omitempty"`
}

// Broker mints the values of brokered keys by their recipes. Safe for
// concurrent use; one per Fleet process (its oauth2 minters share refreshes
// among the process's goroutines and keep opened tokens in memory).
type Broker struct {
	recipes map[string]Recipe
	deps    Deps
	github  map[string]*githubMinter
	oauth2  map[string]*oauth2Minter
}

// New returns a Broker for recipes (Parse's). It refuses recipes it cannot
// serve: without deps.Secrets or deps.Sealer, or oauth2 ones without
// deps.States. No recipe is a Broker that knows no key.
func New(recipes map[string]Recipe, deps Deps) (*Broker, error) {
	deps = deps.withDefaults()
	b := &Broker{recipes: recipes, deps: deps, github: map[string]*githubMinter{}, oauth2: map[string]*oauth2Minter{}}
	if len(recipes) == 0 {
		return b, nil
	}
	switch {
	case deps.Sealer == nil:
		return nil, fmt.Errorf("broker: %s is required when %s has a recipe", KeyEnvName, EnvName)
	case deps.Secrets == nil:
		return nil, errors.New("broker: no reader of the recipes' secret references")
	}
	for key, r := range recipes {
		switch {
		case r.GitHubApp != nil && r.OAuth2 == nil:
			m, err := newGitHubMinter(key, *r.GitHubApp, deps)
			if err != nil {
				return nil, err
			}
			b.github[key] = m
		case r.OAuth2 != nil && r.GitHubApp == nil:
			if deps.States == nil {
				return nil, fmt.Errorf("broker: %s: an oauth2 recipe needs the broker's store", key)
			}
			m, err := newOAuth2Minter(key, *r.OAuth2, deps)
			if err != nil {
				return nil, err
			}
			b.oauth2[key] = m
		default:
			return nil, fmt.Errorf("broker: %s: want one of githubApp or oauth2", key)
		}
	}
	return b, nil
}

// Kind reports the recipe kind of projectID/key; ok false when there is
// no recipe for it.
func (b *Broker) Kind(projectID, key string) (kind string, ok bool) {
	r, ok := b.recipes[projectID+"/"+key]
	if !ok {
		return "", false
	}
	return r.Kind(), true
}

// Mint returns a value for req's key: a GitHub installation token for the
// run's repository, with Sealed set (bound to the run; pass it to Revoke
// at the run's end), or the fleet-wide OAuth2 access token. Errors are
// *Error; each mint and failure is reported to OnEvent.
func (b *Broker) Mint(ctx context.Context, req MintRequest) (Minted, error) {
	id := req.ProjectID + "/" + req.Key
	var minted Minted
	var err error
	var kind string
	if m, ok := b.github[id]; ok {
		kind = KindGitHubApp
		minted, err = b.mintGitHub(ctx, m, req)
	} else if m, ok := b.oauth2[id]; ok {
		kind = KindOAuth2
		minted, err = m.mint(ctx)
	} else {
		return Minted{}, &Error{ProjectID: req.ProjectID, Key: req.Key, Detail: "no recipe for this key"}
	}
	if err != nil {
		b.deps.OnEvent(kind, EventFailure)
		return Minted{}, asError(err, req.ProjectID, req.Key, kind)
	}
	b.deps.OnEvent(kind, EventMint)
	return minted, nil
}

// bindRun is what a run's own value is sealed bound to.
func bindRun(req MintRequest) string {
	return req.ProjectID + "/" + req.Key + "#" + req.FleetRunID
}

func (b *Broker) mintGitHub(ctx context.Context, m *githubMinter, req MintRequest) (Minted, error) {
	if req.FleetRunID == "" {
		return Minted{}, errors.New("a GitHub token is minted for a run: no FleetRunID")
	}
	minted, err := m.mint(ctx, req)
	if err != nil {
		return Minted{}, err
	}
	minted.Kind = KindGitHubApp
	minted.Sealed, err = b.deps.Sealer.Seal(ctx, []byte(minted.Value), bindRun(req))
	if err != nil {
		// Fleet could not revoke a token it cannot keep: revoke it now.
		if rerr := m.revoke(context.WithoutCancel(ctx), string(minted.Value)); rerr != nil {
			b.deps.Logger.Error("broker: revoking a token that could not be sealed", "key", req.ProjectID+"/"+req.Key,
				"kind", KindGitHubApp, "err", rerr)
		}
		return Minted{}, fmt.Errorf("sealing the token: %w", err)
	}
	return minted, nil
}

// Revoke revokes a run's own value: sealed is Minted.Sealed of the Mint of
// req (same run, project and key). Only githubApp values are revoked; an
// oauth2 key's value is the fleet's and is not.
func (b *Broker) Revoke(ctx context.Context, req MintRequest, sealed []byte) error {
	id := req.ProjectID + "/" + req.Key
	m, ok := b.github[id]
	if !ok {
		if _, ok := b.oauth2[id]; ok {
			return &Error{ProjectID: req.ProjectID, Key: req.Key, Kind: KindOAuth2, Detail: "an oauth2 value is shared by the fleet: not revoked per run"}
		}
		return &Error{ProjectID: req.ProjectID, Key: req.Key, Detail: "no recipe for this key"}
	}
	plain, err := b.deps.Sealer.Open(ctx, sealed, bindRun(req))
	if err == nil {
		err = m.revoke(ctx, string(plain))
		clear(plain)
	} else {
		err = fmt.Errorf("opening the run's token: %w", err)
	}
	if err != nil {
		b.deps.OnEvent(KindGitHubApp, EventFailure)
		return asError(err, req.ProjectID, req.Key, KindGitHubApp)
	}
	b.deps.OnEvent(KindGitHubApp, EventRevocation)
	b.deps.Logger.Info("broker: revoked", "key", id, "kind", KindGitHubApp, "fleetRunId", req.FleetRunID)
	return nil
}

// asError returns err as an *Error of this key: a minter's own, or one
// made of a failure that is Fleet's (ProviderStatus 0).
func asError(err error, projectID, key, kind string) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{ProjectID: projectID, Key: key, Kind: kind, Detail: err.Error()}
}
