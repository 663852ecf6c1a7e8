// Package secretcache owns how runfleet reads AWS Secrets Manager: each
// secret id's answer, its value or its absence, is kept for a TTL and
// fetched by one call however many readers want it at once. Fleet's host
// credentials and admin token and edge's real values are read through it.
//
// A miss is kept like a value, for the same TTL. Not keeping it would let a
// flood of lookups for an absent name (a task whose granted key has no
// secret yet, requests routed to a host whose credential was deleted) each
// cost a Secrets Manager call, and would let a task tell an absent secret
// from a present one by how long its request takes (a miss a round trip
// every time, a value a map lookup). Keeping it costs this much: a secret
// created after a miss is seen once the miss is TTL old, at the latest, as
// a rotated value is. A failure that is not an answer (throttling, a
// network error, a cancelled context) is not kept: the next read asks
// again.
package secretcache

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

// API is the one Secrets Manager call made; *secretsmanager.Client
// satisfies it.
type API interface {
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, opts ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
}

var _ API = (*secretsmanager.Client)(nil)

// The answers that are kept, besides a value. Errors wrapping them name
// the secret id, never a value.
var (
	// ErrNotFound: no secret has that id (or it is deleted).
	ErrNotFound = errors.New("no such secret")
	// ErrNoString: the secret holds no SecretString (a binary secret).
	ErrNoString = errors.New("the secret holds no SecretString")
)

// Config configures a Cache.
type Config struct {
	// Client calls Secrets Manager. Required: without one every Get fails.
	Client API
	// TTL is how long an answer is kept; zero keeps none (every Get asks,
	// though concurrent Gets of one id still share one call). Each user
	// has its own default.
	TTL time.Duration
	// Clock times the TTL; nil means the real clock.
	Clock clock.Clock
}

// Cache keeps Secrets Manager's answers per secret id. V is what a value
// is held as (edge wraps it in a type that cannot print itself), made once
// per fetch by wrap. Safe for concurrent use.
type Cache[V any] struct {
	cfg  Config
	wrap func(string) V

	mu      sync.Mutex
	entries map[string]*entry[V]
}

// entry is one fetch of an id and, once done is closed, its answer.
type entry[V any] struct {
	done    chan struct{}
	fetched time.Time // when the fetch began, on the cache's clock
	value   V
	err     error // nil, an answer (ErrNotFound, ErrNoString) or a failure
}

// New returns a cache over cfg.Client; wrap turns a SecretString into V.
func New[V any](cfg Config, wrap func(string) V) *Cache[V] {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	return &Cache[V]{cfg: cfg, wrap: wrap, entries: map[string]*entry[V]{}}
}

// Get returns the SecretString of id as Secrets Manager answered at most
// TTL ago, or an error wrapping ErrNotFound or ErrNoString (an answer,
// kept as long), or any other failure (not kept). It honours ctx, also
// while it waits for another reader's fetch of the same id.
func (c *Cache[V]) Get(ctx context.Context, id string) (V, error) {
	for {
		e, leader := c.entry(id)
		if leader {
			c.fetch(ctx, id, e)
		}
		select {
		case <-e.done:
		case <-ctx.Done():
			var zero V
			return zero, fmt.Errorf("secretcache: reading %s: %w", id, ctx.Err())
		}
		// A fetch that failed because its reader gave up says nothing of
		// the secret: a reader still waiting asks again itself.
		if !leader && isContextErr(e.err) && ctx.Err() == nil {
			continue
		}
		return e.value, e.err
	}
}

// entry returns id's entry that is being fetched or is still fresh, or a
// new one for the caller to fetch (leader).
func (c *Cache[V]) entry(id string) (e *entry[V], leader bool) {
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[id]; ok {
		select {
		case <-e.done:
			if now.Sub(e.fetched) < c.cfg.TTL {
				return e, false
			}
		default:
			return e, false
		}
	}
	e = &entry[V]{done: make(chan struct{}), fetched: now}
	c.entries[id] = e
	return e, true
}

// fetch asks Secrets Manager for id, records the answer in e and closes
// its done; a failure leaves the cache, so the next Get asks again.
func (c *Cache[V]) fetch(ctx context.Context, id string, e *entry[V]) {
	defer close(e.done)
	e.err = c.ask(ctx, id, e)
	if e.err != nil && !errors.Is(e.err, ErrNotFound) && !errors.Is(e.err, ErrNoString) {
		c.mu.Lock()
		if c.entries[id] == e {
			delete(c.entries, id)
		}
		c.mu.Unlock()
	}
}

func (c *Cache[V]) ask(ctx context.Context, id string, e *entry[V]) error {
	if c.cfg.Client == nil {
		return errors.New("secretcache: no Secrets Manager client")
	}
	out, err := c.cfg.Client.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: &id})
	var notFound *types.ResourceNotFoundException
	switch {
	case errors.As(err, &notFound):
		return fmt.Errorf("secretcache: %s: %w", id, ErrNotFound)
	case err != nil:
		return fmt.Errorf("secretcache: reading %s: %w", id, err)
	case out.SecretString == nil:
		return fmt.Errorf("secretcache: %s: %w", id, ErrNoString)
	}
	e.value = c.wrap(*out.SecretString)
	return nil
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
