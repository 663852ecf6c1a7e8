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
