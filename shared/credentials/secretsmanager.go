package credentials

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager/types"

	"github.com/runfleet/runfleet/shared/clock"
)

// DefaultCacheTTL is how long a credential read from Secrets Manager is
// reused: a rotated host credential reaches Fleet within this time.
const DefaultCacheTTL = 5 * time.Minute

// SecretsManagerAPI is the part of the Secrets Manager client used here.
type SecretsManagerAPI interface {
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, opts ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
}

var _ SecretsManagerAPI = (*secretsmanager.Client)(nil)

// SecretsManager reads the credential for ref from the secret `<prefix><ref>`
// (its SecretString), caching found values for a TTL. Misses are not cached,
// so a secret created just before a host's registration is found.
type SecretsManager struct {
	client SecretsManagerAPI
	prefix string
	clock  clock.Clock
	ttl    time.Duration

	mu    sync.Mutex
	cache map[string]cached
}

type cached struct {
	value   string
	expires time.Time
}

var _ Source = (*SecretsManager)(nil)

// NewSecretsManager returns a source over client; clk nil is the real clock,
// ttl zero is DefaultCacheTTL.
func NewSecretsManager(client SecretsManagerAPI, prefix string, clk clock.Clock, ttl time.Duration) *SecretsManager {
	if clk == nil {
		clk = clock.Real{}
	}
	if ttl <= 0 {
		ttl = DefaultCacheTTL
	}
	return &SecretsManager{client: client, prefix: prefix, clock: clk, ttl: ttl, cache: map[string]cached{}}
}

// Secret returns the credential for ref.
func (s *SecretsManager) Secret(ctx context.Context, ref string) (string, error) {
	if err := CheckRef(ref); err != nil {
		return "", fmt.Errorf("credentials: %w: %w", ErrUnknownRef, err)
	}
	now := s.clock.Now()
	s.mu.Lock()
	c, ok := s.cache[ref]
	s.mu.Unlock()
	if ok && now.Before(c.expires) {
		return c.value, nil
	}
	id := s.prefix + ref
	out, err := s.client.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: &id})
	if err != nil {
		var nf *types.ResourceNotFoundException
		if errors.As(err, &nf) {
			return "", fmt.Errorf("credentials: %q: %w (no secret %s)", ref, ErrUnknownRef, id)
		}
		return "", fmt.Errorf("credentials: reading secret %s: %w", id, err)
	}
	if out.SecretString == nil || *out.SecretString == "" {
		return "", fmt.Errorf("credentials: secret %s has no SecretString", id)
	}
	s.mu.Lock()
	s.cache[ref] = cached{value: *out.SecretString, expires: now.Add(s.ttl)}
	s.mu.Unlock()
	return *out.SecretString, nil
}
