// Package credentials resolves a host's credentialRef to the host credential
// Fleet sends as its bearer token, from where RUNFLEET_CREDENTIALS says they
// live: a JSON file (`file:<path>`, a map ref -> secret) or AWS Secrets
// Manager (`secretsmanager:<prefix>`, secret id `<prefix><ref>`).
//
// A credential is never logged or put in an error; a ref is not secret and
// errors name it.
package credentials

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
)

// ErrUnknownRef: the source has no credential under that ref. The API maps it
// to 400 at registration.
var ErrUnknownRef = errors.New("unknown credentialRef")

// Source resolves refs. Implementations are safe for concurrent use and
// honour ctx.
type Source interface {
	// Secret returns the credential for ref, or an error wrapping
	// ErrUnknownRef when there is none.
	Secret(ctx context.Context, ref string) (string, error)
}

// refPattern is what a ref may look like: the characters a Secrets Manager
// name allows, so that `<prefix><ref>` is always a valid secret id.
var refPattern = regexp.MustCompile(`^[A-Za-z0-9/_+=.@-]{1,256}$`)

// CheckRef reports whether ref has a valid shape.
func CheckRef(ref string) error {
	if !refPattern.MatchString(ref) {
		return fmt.Errorf("credentialRef %q: want 1-256 of letters, digits and /_+=.@-", ref)
	}
	return nil
}

// Spec is a parsed RUNFLEET_CREDENTIALS value.
type Spec struct {
	// Kind is "file", "secretsmanager", or "" when unset.
	Kind string
	// Arg is the file path or the secret id prefix.
	Arg string
}

// ParseSpec parses RUNFLEET_CREDENTIALS; empty is valid and resolves nothing.
func ParseSpec(s string) (Spec, error) {
	if s == "" {
		return Spec{}, nil
	}
	kind, arg, ok := strings.Cut(s, ":")
	switch {
	case ok && kind == "file" && arg != "":
		return Spec{Kind: kind, Arg: arg}, nil
	case ok && kind == "secretsmanager":
		// An empty prefix is allowed: refs are then whole secret ids.
		return Spec{Kind: kind, Arg: arg}, nil
	}
	return Spec{}, fmt.Errorf("RUNFLEET_CREDENTIALS %q: want file:<path> or secretsmanager:<prefix>", s)
}

// NeedsAWS reports whether Open needs a Secrets Manager client.
func (s Spec) NeedsAWS() bool { return s.Kind == "secretsmanager" }

// Options are what Open may need besides the spec.
type Options struct {
	// SecretsManager is the client for a secretsmanager spec.
	SecretsManager SecretsManagerAPI
	// Clock times the Secrets Manager cache; nil is the real clock.
	Clock clock.Clock
	// CacheTTL is how long a Secrets Manager value is reused; zero means
	// DefaultCacheTTL.
	CacheTTL time.Duration
}

// Open builds the source the spec names.
func (s Spec) Open(opts Options) (Source, error) {
	switch s.Kind {
	case "":
		return none{}, nil
	case "file":
		return NewFile(s.Arg)
	case "secretsmanager":
		if opts.SecretsManager == nil {
			return nil, errors.New("credentials: secretsmanager source needs a Secrets Manager client")
		}
		return NewSecretsManager(opts.SecretsManager, s.Arg, opts.Clock, opts.CacheTTL), nil
	}
	return nil, fmt.Errorf("credentials: unknown source kind %q", s.Kind)
}

// none resolves nothing: RUNFLEET_CREDENTIALS is unset.
type none struct{}

func (none) Secret(_ context.Context, ref string) (string, error) {
	return "", fmt.Errorf("credentials: %q: %w (RUNFLEET_CREDENTIALS is not set)", ref, ErrUnknownRef)
}
