package broker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/secretcache"
)

// DefaultSecretTTL is how long a Secrets Manager answer is reused when
// SecretsConfig.TTL is zero. The references are read when a token is minted
// or refreshed, not per dispatch of a fresh oauth2 token, so a minute costs
// little and an operator's new seed or rotated key is seen within it.
const DefaultSecretTTL = time.Minute

// SecretsConfig configures Secrets.
type SecretsConfig struct {
	// BaseDir resolves a relative `file:` reference: the directory of
	// RUNFLEET_BROKER's file. Empty: a relative one is refused (the
	// document came from Secrets Manager, so relative to nothing).
	BaseDir string
	// SecretsManager reads the references that are not files; nil: they
	// fail.
	SecretsManager secretcache.API
	// TTL is how long a Secrets Manager answer is kept; zero is
	// DefaultSecretTTL.
	TTL time.Duration
	// Clock times the TTL; nil is the real clock.
	Clock clock.Clock
}

// Secrets reads secret references: a file on every read (so a replaced
// file is seen at once), a Secrets Manager secret through secretcache.
// Values have surrounding white space trimmed (a file's final newline, a
// console paste's). Errors name the reference, never a value.
type Secrets struct {
	baseDir string
	cache   *secretcache.Cache[string]
}

var _ SecretReader = (*Secrets)(nil)

// NewSecrets returns a reader configured by cfg.
func NewSecrets(cfg SecretsConfig) *Secrets {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultSecretTTL
	}
	cache := secretcache.New(secretcache.Config{Client: cfg.SecretsManager, TTL: cfg.TTL, Clock: cfg.Clock},
		func(s string) string { return s })
	return &Secrets{baseDir: cfg.BaseDir, cache: cache}
}

// Read returns the value ref names.
func (s *Secrets) Read(ctx context.Context, ref string) (string, error) {
	if err := CheckRef(ref); err != nil {
		return "", fmt.Errorf("broker: secret %q: %w", ref, err)
	}
	var v string
	if path, ok := strings.CutPrefix(ref, refFilePrefix); ok {
		b, err := s.readFile(path)
		if err != nil {
			return "", fmt.Errorf("broker: secret %q: %w", ref, err)
		}
		v = string(b)
		clear(b)
	} else {
		var err error
		if v, err = s.cache.Get(ctx, ref); err != nil {
			return "", fmt.Errorf("broker: secret %q: %w", ref, err)
		}
	}
	v = strings.TrimSpace(v)
	if v == "" {
		return "", fmt.Errorf("broker: secret %q is empty", ref)
	}
	return v, nil
}

func (s *Secrets) readFile(path string) ([]byte, error) {
	if !filepath.IsAbs(path) {
		if s.baseDir == "" {
			return nil, errors.New("a relative file: path needs RUNFLEET_BROKER to be a file (its directory is the base)")
		}
		path = filepath.Join(s.baseDir, path)
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	return os.ReadFile(path)
}

// Load reads RUNFLEET_BROKER: spec is `file:<path>` or a Secrets Manager
// secret id or ARN holding the document, or empty (no recipe: nil, and a
// nil reader). It returns the recipes (Parse) and the reader of their
// secret references, relative to the file's directory for a file.
func Load(ctx context.Context, spec string, cfg SecretsConfig) (map[string]Recipe, *Secrets, error) {
	if spec == "" {
		return nil, nil, nil
	}
	if err := CheckRef(spec); err != nil {
		return nil, nil, fmt.Errorf("%s %q: %w", EnvName, spec, err)
	}
	var doc []byte
	if path, ok := strings.CutPrefix(spec, refFilePrefix); ok {
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", EnvName, err)
		}
		if doc, err = os.ReadFile(abs); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", EnvName, err)
		}
		cfg.BaseDir = filepath.Dir(abs)
	} else {
		cfg.BaseDir = ""
		s, err := NewSecrets(cfg).cache.Get(ctx, spec)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", EnvName, err)
		}
		doc = []byte(s)
	}
	recipes, err := Parse(doc)
	if err != nil {
		return nil, nil, err
	}
	return recipes, NewSecrets(cfg), nil
}
