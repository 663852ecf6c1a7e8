package credentials

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/secretcache"
)

// DefaultCacheTTL is how long a Secrets Manager answer is reused: a rotated
// host credential (or one created after a lookup found none) reaches Fleet
// within this time.
const DefaultCacheTTL = 5 * time.Minute

// SecretsManagerAPI is the part of the Secrets Manager client used here.
type SecretsManagerAPI = secretcache.API

// SecretsManager reads the credential for ref from the secret `<prefix><ref>`
// (its SecretString) through secretcache, which keeps each answer, a value
// or its absence, for the TTL (the package says why a miss is kept): a
// secret created after a lookup found none is found once that miss is TTL
// old.
type SecretsManager struct {
	prefix string
	cache  *secretcache.Cache[string]
}

var _ Source = (*SecretsManager)(nil)

// NewSecretsManager returns a source over client; clk nil is the real clock,
// ttl zero is DefaultCacheTTL.
func NewSecretsManager(client SecretsManagerAPI, prefix string, clk clock.Clock, ttl time.Duration) *SecretsManager {
	if ttl <= 0 {
		ttl = DefaultCacheTTL
	}
	cache := secretcache.New(secretcache.Config{Client: client, TTL: ttl, Clock: clk}, func(s string) string { return s })
	return &SecretsManager{prefix: prefix, cache: cache}
}

// Secret returns the credential for ref.
func (s *SecretsManager) Secret(ctx context.Context, ref string) (string, error) {
	if err := CheckRef(ref); err != nil {
		return "", fmt.Errorf("credentials: %w: %w", ErrUnknownRef, err)
	}
	id := s.prefix + ref
	secret, err := s.cache.Get(ctx, id)
	switch {
	case errors.Is(err, secretcache.ErrNotFound):
		return "", fmt.Errorf("credentials: %q: %w (no secret %s)", ref, ErrUnknownRef, id)
	case err != nil && !errors.Is(err, secretcache.ErrNoString):
		return "", fmt.Errorf("credentials: %w", err)
	case err != nil || secret == "":
		return "", fmt.Errorf("credentials: secret %s has no SecretString", id)
	}
	return secret, nil
}
