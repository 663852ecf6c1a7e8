package ca

import (
	"context"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
)

// memoryStorage is a certmagic.Storage in memory (certmagic ships none):
// leaves and their keys live exactly as long as the signer's leaf cache and
// never touch disk. Keys are slash-separated paths; a key with keys below it
// acts as a directory. Safe for concurrent use.
type memoryStorage struct {
	now func() time.Time

	mu    sync.Mutex
	items map[string]memoryItem
	// locks maps a held lock's name to a channel closed on its release.
	locks map[string]chan struct{}
}

type memoryItem struct {
	value    []byte
	modified time.Time
}

var _ certmagic.Storage = (*memoryStorage)(nil)

func newMemoryStorage(now func() time.Time) *memoryStorage {
	return &memoryStorage{now: now, items: map[string]memoryItem{}, locks: map[string]chan struct{}{}}
}

func cleanKey(key string) string { return strings.Trim(key, "/") }

// below reports whether key lies under the directory dir ("" is the root).
func below(key, dir string) bool {
	return dir == "" || strings.HasPrefix(key, dir+"/")
}

// Lock blocks until name is free or ctx ends.
func (s *memoryStorage) Lock(ctx context.Context, name string) error {
	for {
		s.mu.Lock()
		held, ok := s.locks[name]
		if !ok {
			s.locks[name] = make(chan struct{})
			s.mu.Unlock()
			return nil
		}
		s.mu.Unlock()
		select {
		case <-held:
		case <-ctx.Done():
			return fmt.Errorf("ca: waiting for lock %q: %w", name, ctx.Err())
		}
	}
}

// Unlock releases name, which the caller holds.
func (s *memoryStorage) Unlock(_ context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	held, ok := s.locks[name]
	if !ok {
		return fmt.Errorf("ca: unlocking %q, which is not locked", name)
	}
	delete(s.locks, name)
	close(held)
	return nil
}

// Store puts a copy of value at key.
func (s *memoryStorage) Store(_ context.Context, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.items[cleanKey(key)] = memoryItem{value: append([]byte(nil), value...), modified: s.now()}
	return nil
}

// Load returns a copy of the value at key, or fs.ErrNotExist.
func (s *memoryStorage) Load(_ context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	item, ok := s.items[cleanKey(key)]
	if !ok {
		return nil, fmt.Errorf("ca: leaf storage: %s: %w", key, fs.ErrNotExist)
	}
	return append([]byte(nil), item.value...), nil
}

// Delete removes key and everything below it; a missing key is no error.
func (s *memoryStorage) Delete(_ context.Context, key string) error {
	key = cleanKey(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.items {
		if k == key || below(k, key) {
			delete(s.items, k)
		}
	}
	return nil
}

// Exists reports whether key is a value or has values below it.
func (s *memoryStorage) Exists(_ context.Context, key string) bool {
	key = cleanKey(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.items[key]; ok {
		return true
	}
	for k := range s.items {
		if below(k, key) {
			return true
		}
	}
	return false
}

// List returns the keys directly below dir, or, if recursive, every key
// below it (values and directories alike), sorted; fs.ErrNotExist when
// nothing is below dir.
func (s *memoryStorage) List(_ context.Context, dir string, recursive bool) ([]string, error) {
	dir = cleanKey(dir)
	s.mu.Lock()
	defer s.mu.Unlock()
	found := map[string]bool{}
	for k := range s.items {
		if !below(k, dir) {
			continue
		}
		rest := strings.TrimPrefix(k, dir+"/")
		if dir == "" {
			rest = k
		}
		parts := strings.Split(rest, "/")
		if !recursive {
			parts = parts[:1]
		}
		for i := range parts {
			found[joinKey(dir, strings.Join(parts[:i+1], "/"))] = true
		}
	}
	if len(found) == 0 {
		return nil, fmt.Errorf("ca: leaf storage: %s: %w", dir, fs.ErrNotExist)
	}
	keys := make([]string, 0, len(found))
	for k := range found {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys, nil
}

func joinKey(dir, rest string) string {
	if dir == "" {
		return rest
	}
	return dir + "/" + rest
}

// Stat describes key, or returns fs.ErrNotExist.
func (s *memoryStorage) Stat(_ context.Context, key string) (certmagic.KeyInfo, error) {
	key = cleanKey(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if item, ok := s.items[key]; ok {
		return certmagic.KeyInfo{Key: key, Modified: item.modified, Size: int64(len(item.value)), IsTerminal: true}, nil
	}
	for k := range s.items {
		if below(k, key) {
			return certmagic.KeyInfo{Key: key, IsTerminal: false}, nil
		}
	}
	return certmagic.KeyInfo{}, fmt.Errorf("ca: leaf storage: %s: %w", key, fs.ErrNotExist)
}

// String names the storage in certmagic's logs.
func (s *memoryStorage) String() string { return "runfleet edge CA leaf memory" }
