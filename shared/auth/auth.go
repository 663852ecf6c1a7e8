// Package auth owns who is calling Fleet: a bearer token becomes a caller
// (looked up by the token's SHA-256, compared in constant time; the bootstrap
// admin from RUNFLEET_ADMIN_TOKEN or its secret, as an AdminTokenSource says
// it is now), tokens are minted here, and the scope checks (hosts, projects,
// run ownership) are answered here.
//
// A token is never stored, logged or put in an error: only its hash is kept.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/runfleet/runfleet/shared/store"
)

// AdminOwnerID is the bootstrap admin's ownerId; no minted caller may take it.
const AdminOwnerID = "admin"

// TokenPrefix marks runfleet caller tokens, so a leaked one is recognisable
// by secret scanners.
const TokenPrefix = "rft_"

// maxTokenLength bounds what is hashed from an Authorization header.
const maxTokenLength = 512

// ErrUnauthenticated: no token, a malformed header, or a token no caller has.
// Authenticate's errors match it with errors.Is; their messages say which
// of the three it was, and nothing more (a revoked token and one never
// minted read the same: nothing of either is kept).
var ErrUnauthenticated = errors.New("a valid bearer token is required")

// unauthenticated is one of ErrUnauthenticated's cases, with its message.
type unauthenticated string

func (e unauthenticated) Error() string        { return string(e) }
func (e unauthenticated) Is(target error) bool { return target == ErrUnauthenticated }

const (
	errNoToken        = unauthenticated(`no bearer token: send the header "Authorization: Bearer <token>"`)
	errMalformedToken = unauthenticated(`the Authorization header is not "Bearer <token>" (one space, a token of 1-512 characters)`)
	errUnknownToken   = unauthenticated("the bearer token is unknown or revoked")
)

// CallerLookup finds a caller by token hash: the one read authentication
// makes of the store's callers (store.Callers, whose contract it keeps:
// strongly consistent, so a revoked token stops working at once).
type CallerLookup interface {
	// CallerByTokenHash returns the caller, or an error wrapping
	// store.ErrNotFound.
	CallerByTokenHash(ctx context.Context, tokenHash string) (store.Caller, error)
}

// AdminTokenSource says what the bootstrap admin token is now, so that a
// rotated token stops authenticating in a process that keeps running (a
// warm Lambda container). Authenticate asks it once per authentication:
// implementations cache (a TTL bounds how long a rotated token still
// works), honour ctx and are safe for concurrent use. "" means there is no
// bootstrap admin. An error is a fault (the token cannot be known), never
// "no admin"; neither it nor anything logged carries the token.
type AdminTokenSource interface {
	AdminToken(ctx context.Context) (string, error)
}

// StaticAdminToken is an admin token fixed for the life of the process
// (RUNFLEET_ADMIN_TOKEN: changing it means a new configuration, so new
// processes). Empty is no bootstrap admin.
type StaticAdminToken string

// AdminToken returns the token.
func (s StaticAdminToken) AdminToken(context.Context) (string, error) { return string(s), nil }

// Authenticator turns Authorization headers into callers. It is safe for
// concurrent use.
type Authenticator struct {
	lookup CallerLookup
	admin  AdminTokenSource
}

// NewAuthenticator authenticates minted callers through lookup, and adminToken
// (when not empty) as the bootstrap admin, for the life of the process.
func NewAuthenticator(lookup CallerLookup, adminToken string) *Authenticator {
	return NewAuthenticatorWithSource(lookup, StaticAdminToken(adminToken))
}

// NewAuthenticatorWithSource authenticates minted callers through lookup,
// and as the bootstrap admin whatever token admin says is current.
func NewAuthenticatorWithSource(lookup CallerLookup, admin AdminTokenSource) *Authenticator {
	return &Authenticator{lookup: lookup, admin: admin}
}

// BootstrapAdmin is the caller RUNFLEET_ADMIN_TOKEN authenticates as.
func BootstrapAdmin() store.Caller {
	return store.Caller{
		OwnerID:         AdminOwnerID,
		Admin:           true,
		AllowedHosts:    store.Scope{All: true},
		AllowedProjects: store.Scope{All: true},
	}
}

// Authenticate reads "Bearer <token>" from the Authorization header value.
// It returns an error matching ErrUnauthenticated for a missing, malformed
// or unknown token, its message saying which (never quoting the header);
// any other error is a fault: of the store, or of the admin token's source
// when the token is no minted caller's (a minted caller still gets in while
// the admin token cannot be read; an admin gets a fault, not a 401, so a
// client retries rather than drops a good token).
func (a *Authenticator) Authenticate(ctx context.Context, authorization string) (store.Caller, error) {
	if strings.TrimSpace(authorization) == "" {
		return store.Caller{}, errNoToken
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(authorization), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" || len(token) > maxTokenLength {
		return store.Caller{}, errMalformedToken
	}
	hash := HashToken(token)
	adminToken, adminErr := a.admin.AdminToken(ctx)
	if adminErr == nil && adminToken != "" && subtle.ConstantTimeCompare([]byte(hash), []byte(HashToken(adminToken))) == 1 {
		return BootstrapAdmin(), nil
	}
	c, err := a.lookup.CallerByTokenHash(ctx, hash)
	if errors.Is(err, store.ErrNotFound) {
		if adminErr != nil {
			return store.Caller{}, fmt.Errorf("auth: reading the admin token: %w", adminErr)
		}
		return store.Caller{}, errUnknownToken
	}
	if err != nil {
		return store.Caller{}, fmt.Errorf("auth: looking up a caller: %w", err)
	}
	// The store found the item by this hash; comparing again in constant
	// time keeps a store that matched loosely from letting anyone in.
	if subtle.ConstantTimeCompare([]byte(c.TokenHash), []byte(hash)) != 1 {
		return store.Caller{}, errUnknownToken
	}
	return c, nil
}

// HashToken is the lowercase hex SHA-256 of a token: what is stored.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// MintToken makes a new token from 32 bytes of random (nil: crypto/rand) and
// returns it with its hash. The token is shown once and never stored.
func MintToken(random io.Reader) (token, hash string, err error) {
	if random == nil {
		random = rand.Reader
	}
	var b [32]byte
	if _, err := io.ReadFull(random, b[:]); err != nil {
		return "", "", fmt.Errorf("auth: minting a token: %w", err)
	}
	token = TokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	return token, HashToken(token), nil
}

var ownerIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// ErrReservedOwner: a mint asked for the bootstrap admin's ownerId.
var ErrReservedOwner = errors.New(`ownerId "admin" is reserved for the bootstrap admin`)

// WellFormedOwnerID reports whether id has an ownerId's shape (the
// reserved "admin" included): a path naming anything else names no caller.
func WellFormedOwnerID(id string) bool { return ownerIDPattern.MatchString(id) }

// CheckOwnerID validates an ownerId for minting: 1-64 of letters, digits and
// ._- starting with a letter or digit, and not the reserved "admin" (in any
// case, so that "Admin" cannot pass for it in a listing).
func CheckOwnerID(id string) error {
	if !ownerIDPattern.MatchString(id) {
		return fmt.Errorf("ownerId %q: want 1-64 letters, digits and ._- starting with a letter or digit", id)
	}
	if strings.EqualFold(id, AdminOwnerID) {
		return ErrReservedOwner
	}
	return nil
}

// CanUseHost reports whether c may see and dispatch to the host.
func CanUseHost(c store.Caller, hostID string) bool { return c.Admin || c.AllowedHosts.Allows(hostID) }

// CanUseProject reports whether c may declare secrets of the project.
func CanUseProject(c store.Caller, projectID string) bool {
	return c.Admin || c.AllowedProjects.Allows(projectID)
}

// CanSeeRun reports whether c may see and act on the run: its owner, or an admin.
func CanSeeRun(c store.Caller, r store.Run) bool { return c.Admin || r.OwnerID == c.OwnerID }
