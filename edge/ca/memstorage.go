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
// leaves and their keys pass through it on their way into the signer's
// leaf cache (leafIssuer.get deletes them once cached) and never touch
// disk. Keys are slash-separated paths kept as a tree, so a
// lookup or a delete costs the same with ten names as with ten thousand; a
// key with keys below it acts as a directory. Safe for concurrent use.
type memoryStorage struct {
	now func() time.Time

	mu sync.Mutex
	// nodes holds every value and every directory that has something
	// below it, by full key; "" is the root.
	nodes map[string]*memoryNode
	// locks maps a held lock's name to a channel closed on its release.
	locks map[string]chan struct{}
}

type memoryNode struct {
	terminal bool // holds a value
	value    []byte
	modified time.Time
	children map[string]struct{} // full keys directly below
}

var _ certmagic.Storage = (*memoryStorage)(nil)

func newMemoryStorage(now func() time.Time) *memoryStorage {
	return &memoryStorage{
		now:   now,
		nodes: map[string]*memoryNode{"": {children: map[string]struct{}{}}},
		locks: map[string]chan struct{}{},
	}
}

func cleanKey(key string) string { return strings.Trim(key, "/") }

// parentKey is the directory holding key ("" for the root).
func parentKey(key string) string {
	if i := strings.LastIndexByte(key, '/'); i >= 0 {
		return key[:i]
	}
	return ""
}

// node returns key's node, making it and its ancestors as needed; the
// caller holds mu.
func (s *memoryStorage) node(key string) *memoryNode {
	if n, ok := s.nodes[key]; ok {
		return n
	}
	n := &memoryNode{children: map[string]struct{}{}}
	s.nodes[key] = n
	s.node(parentKey(key)).children[key] = struct{}{}
	return n
}

// remove deletes key's node and everything below it, then every ancestor
// left empty; the caller holds mu.
func (s *memoryStorage) remove(key string) {
	if _, ok := s.nodes[key]; !ok || key == "" {
		return
	}
	s.dropSubtree(key)
	for parent := parentKey(key); ; key, parent = parent, parentKey(parent) {
		p := s.nodes[parent]
		delete(p.children, key)
		if parent == "" || p.terminal || len(p.children) > 0 {
			return
		}
		delete(s.nodes, parent)
	}
}

func (s *memoryStorage) dropSubtree(key string) {
	for child := range s.nodes[key].children {
		s.dropSubtree(child)
	}
	delete(s.nodes, key)
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
	key = cleanKey(key)
	if key == "" {
		return fmt.Errorf("ca: leaf storage: an empty key")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.node(key)
	n.terminal, n.value, n.modified = true, append([]byte(nil), value...), s.now()
	return nil
}

// Load returns a copy of the value at key, or fs.ErrNotExist.
func (s *memoryStorage) Load(_ context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[cleanKey(key)]
	if !ok || !n.terminal {
		return nil, fmt.Errorf("ca: leaf storage: %s: %w", key, fs.ErrNotExist)
	}
	return append([]byte(nil), n.value...), nil
}

// Delete removes key and everything below it; a missing key is no error.
func (s *memoryStorage) Delete(_ context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.remove(cleanKey(key))
	return nil
}

// Exists reports whether key is a value or has values below it.
func (s *memoryStorage) Exists(_ context.Context, key string) bool {
	key = cleanKey(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.nodes[key]
	return ok && key != ""
}

// List returns the keys directly below dir, or, if recursive, every key
// below it (values and directories alike), sorted; fs.ErrNotExist when
// nothing is below dir.
func (s *memoryStorage) List(_ context.Context, dir string, recursive bool) ([]string, error) {
	dir = cleanKey(dir)
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[dir]
	if !ok || len(n.children) == 0 {
		return nil, fmt.Errorf("ca: leaf storage: %s: %w", dir, fs.ErrNotExist)
	}
	var keys []string
	var walk func(*memoryNode)
	walk = func(n *memoryNode) {
		for child := range n.children {
			keys = append(keys, child)
			if recursive {
				walk(s.nodes[child])
			}
		}
	}
	walk(n)
	sort.Strings(keys)
	return keys, nil
}

// Stat describes key, or returns fs.ErrNotExist.
func (s *memoryStorage) Stat(_ context.Context, key string) (certmagic.KeyInfo, error) {
	key = cleanKey(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[key]
	switch {
	case !ok || key == "":
		return certmagic.KeyInfo{}, fmt.Errorf("ca: leaf storage: %s: %w", key, fs.ErrNotExist)
	case n.terminal:
		return certmagic.KeyInfo{Key: key, Modified: n.modified, Size: int64(len(n.value)), IsTerminal: true}, nil
	default:
		return certmagic.KeyInfo{Key: key, IsTerminal: false}, nil
	}
}

// String names the storage in certmagic's logs.
func (s *memoryStorage) String() string { return "runfleet edge CA leaf memory" }
