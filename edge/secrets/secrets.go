// Package secrets owns where the secrets proxy reads real values: the
// Source interface, a JSON file re-read when it changes, and AWS Secrets
// Manager behind a short cache. A value is read per request, so a rotation
// applies to the next request (within the cache's TTL for Secrets Manager).
// A real value is a Value from the source to the moment its bytes are
// written upstream: it prints, logs and encodes as [redacted].
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
	Value(ctx context.Context, project, key string) (Value, error)
}

// Observed returns a Source that hands every value src returns to seen
// before returning it: edge's log and audit writers learn each real value
// the proxy holds (their last-line redactor). seen runs on the reading
// goroutine, on every read, so it must be cheap and safe for concurrent
// use.
func Observed(src Source, seen func(Value)) Source { return observed{src, seen} }

type observed struct {
	src  Source
	seen func(Value)
}

func (o observed) Value(ctx context.Context, project, key string) (Value, error) {
	v, err := o.src.Value(ctx, project, key)
	if err == nil {
		o.seen(v)
	}
	return v, err
}

// ID is how both sources name a value: "<project>/<KEY>".
func ID(project, key string) string { return project + "/" + key }
