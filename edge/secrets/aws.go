package secrets

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager/types"

	"github.com/runfleet/runfleet/shared/clock"
)

// DefaultCacheTTL is how long a Secrets Manager answer is reused: a rotation
// (or a deletion) applies to requests at most this long after it.
const DefaultCacheTTL = 30 * time.Second

// SecretsManagerAPI is the one call AWSSource makes; *secretsmanager.Client
// satisfies it.
type SecretsManagerAPI interface {
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, opts ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
}

var _ SecretsManagerAPI = (*secretsmanager.Client)(nil)

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
// Manager, caching each answer for CacheTTL. An absent or deleted secret is
// ErrNotFound; any other failure is an error (the proxy answers 500 and logs
// it), never a silent withhold.
type AWSSource struct {
	cfg AWSConfig

	mu    sync.Mutex
	cache map[string]cached
}

var _ Source = (*AWSSource)(nil)

type cached struct {
	value   Value
	found   bool
	fetched time.Time
}

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
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	return &AWSSource{cfg: cfg, cache: map[string]cached{}}, nil
}

// Value returns the value of project/key.
func (s *AWSSource) Value(ctx context.Context, project, key string) (Value, error) {
	id := s.cfg.Prefix + ID(project, key)
	now := s.cfg.Clock.Now()
	s.mu.Lock()
	c, ok := s.cache[id]
	s.mu.Unlock()
	if !ok || now.Sub(c.fetched) >= s.cfg.CacheTTL {
		var err error
		c, err = s.fetch(ctx, id, now)
		if err != nil {
			return Value{}, err
		}
		s.mu.Lock()
		s.cache[id] = c
		s.mu.Unlock()
	}
	if !c.found {
		return Value{}, fmt.Errorf("secrets manager: %s: %w", id, ErrNotFound)
	}
	return c.value, nil
}

func (s *AWSSource) fetch(ctx context.Context, id string, now time.Time) (cached, error) {
	out, err := s.cfg.Client.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(id)})
	var notFound *types.ResourceNotFoundException
	switch {
	case errors.As(err, &notFound):
		return cached{fetched: now}, nil
	case err != nil:
		return cached{}, fmt.Errorf("secrets manager: reading %s: %w", id, err)
	case out.SecretString == nil:
		// A binary secret has no string value to substitute.
		return cached{fetched: now}, nil
	}
	return cached{value: NewValue(*out.SecretString), found: true, fetched: now}, nil
}
