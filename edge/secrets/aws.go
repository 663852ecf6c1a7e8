package secrets

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/secretcache"
)

// DefaultCacheTTL is how long a Secrets Manager answer is reused: a rotation
// (or a deletion, or a secret created after a lookup found none) applies to
// requests at most this long after it.
const DefaultCacheTTL = 30 * time.Second

// SecretsManagerAPI is the one call AWSSource makes; *secretsmanager.Client
// satisfies it.
type SecretsManagerAPI = secretcache.API

// AWSConfig configures an AWSSource.
type AWSConfig struct {
	// Client calls Secrets Manager. Required.
	Client SecretsManagerAPI
	// Prefix starts every secret id: "<Prefix><project>/<KEY>".
	Prefix string
	// CacheTTL bounds how long an answer (a value or its absence) is
	// reused; zero means DefaultCacheTTL.
	CacheTTL time.Duration
	// Clock times the cache; nil means the real clock.
	Clock clock.Clock
}

// AWSSource reads SecretString of "<prefix><project>/<KEY>" from AWS Secrets
// Manager through secretcache, which keeps each answer, a value or its
// absence, for CacheTTL (the package says why a miss is kept). An absent,
// deleted or binary secret is ErrNotFound; any other failure is an error
// (the proxy answers 500 and logs it), never a silent withhold.
type AWSSource struct {
	prefix string
	cache  *secretcache.Cache[Value]
}

var _ Source = (*AWSSource)(nil)

// NewAWSSource checks cfg and fills its defaults.
func NewAWSSource(cfg AWSConfig) (*AWSSource, error) {
	if cfg.Client == nil {
		return nil, errors.New("secrets: AWSConfig.Client is required")
	}
	if cfg.CacheTTL == 0 {
		cfg.CacheTTL = DefaultCacheTTL
	}
	if cfg.CacheTTL < 0 {
		return nil, errors.New("secrets: AWSConfig.CacheTTL must not be negative")
	}
	// Each value is wrapped once per fetch, so a read per request
	// allocates nothing.
	cache := secretcache.New(secretcache.Config{Client: cfg.Client, TTL: cfg.CacheTTL, Clock: cfg.Clock}, NewValue)
	return &AWSSource{prefix: cfg.Prefix, cache: cache}, nil
}

// Value returns the value of project/key.
func (s *AWSSource) Value(ctx context.Context, project, key string) (Value, error) {
	id := s.prefix + ID(project, key)
	v, err := s.cache.Get(ctx, id)
	switch {
	case errors.Is(err, secretcache.ErrNotFound), errors.Is(err, secretcache.ErrNoString):
		// A binary secret has no string value to substitute.
		return Value{}, fmt.Errorf("secrets manager: %s: %w", id, ErrNotFound)
	case err != nil:
		return Value{}, fmt.Errorf("secrets manager: %w", err)
	}
	return v, nil
}
