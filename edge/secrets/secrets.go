// Package secrets owns where the secrets proxy reads real values: the
// Source interface, a JSON file re-read when it changes, and AWS Secrets
// Manager behind a short cache. A value is read per request, so a rotation
// applies to the next request (within the cache's TTL for Secrets Manager).
package secrets

import (
	"context"
	"errors"
)

// ErrNotFound is a value the source does not have: the proxy withholds the
// key (403), never sending the placeholder in its place.
var ErrNotFound = errors.New("secrets: no value")

// Source gives a key's current real value. Value honours ctx, is safe for
// concurrent use, returns an error wrapping ErrNotFound when the value is
// absent, and never puts a value in an error.
type Source interface {
	Value(ctx context.Context, project, key string) (string, error)
}

// ID is how both sources name a value: "<project>/<KEY>".
func ID(project, key string) string { return project + "/" + key }
