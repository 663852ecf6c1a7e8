package credentials

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"
)

// File is a JSON file mapping ref -> credential. It is re-read when its
// modification time or size changes, so a credential added for a new host
// works without a restart.
type File struct {
	path string

	mu      sync.Mutex
	modTime time.Time
	size    int64
	secrets map[string]string
}

var _ Source = (*File)(nil)

// NewFile reads path once, so a missing or malformed file fails at start.
func NewFile(path string) (*File, error) {
	f := &File{path: path}
	if err := f.refresh(); err != nil {
		return nil, err
	}
	return f, nil
}

// Secret returns the credential for ref.
func (f *File) Secret(_ context.Context, ref string) (string, error) {
	if err := CheckRef(ref); err != nil {
		return "", fmt.Errorf("credentials: %w: %w", ErrUnknownRef, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.refreshLocked(); err != nil {
		return "", err
	}
	s, ok := f.secrets[ref]
	if !ok {
		return "", fmt.Errorf("credentials: %q: %w (not in %s)", ref, ErrUnknownRef, f.path)
	}
	return s, nil
}

func (f *File) refresh() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refreshLocked()
}

func (f *File) refreshLocked() error {
	st, err := os.Stat(f.path)
	if err != nil {
		return fmt.Errorf("credentials: reading %s: %w", f.path, err)
	}
	if f.secrets != nil && st.ModTime().Equal(f.modTime) && st.Size() == f.size {
		return nil
	}
	raw, err := os.ReadFile(f.path)
	if err != nil {
		return fmt.Errorf("credentials: reading %s: %w", f.path, err)
	}
	var m map[string]string
	if err := json.Unmarshal(raw, &m); err != nil {
		// The decoder's message quotes no values for a type mismatch, but a
		// syntax error's offset is all that is safe to show.
		return fmt.Errorf("credentials: %s is not a JSON object of strings", f.path)
	}
	if m == nil {
		m = map[string]string{}
	}
	f.secrets, f.modTime, f.size = m, st.ModTime(), st.Size()
	return nil
}
