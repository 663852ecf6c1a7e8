package credentials

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"github.com/runfleet/runfleet/shared/filewatch"
)

// File is a JSON file mapping ref -> credential. It is re-read when its
// stamp changes (filewatch: identity, size or modification time, so a
// replacement by rename counts even at the same size and time), so a
// credential added for a new host works without a restart. A file that
// does not parse fails every lookup until it is fixed.
type File struct {
	mu   sync.Mutex
	file *filewatch.File[map[string]string]
}

var _ Source = (*File)(nil)

// NewFile reads path once, so a missing or malformed file fails at start.
func NewFile(path string) (*File, error) {
	f := &File{file: filewatch.New(path, readCredentials)}
	if _, err := f.current(); err != nil {
		return nil, err
	}
	return f, nil
}

// Secret returns the credential for ref.
func (f *File) Secret(_ context.Context, ref string) (string, error) {
	if err := CheckRef(ref); err != nil {
		return "", fmt.Errorf("credentials: %w: %w", ErrUnknownRef, err)
	}
	secrets, err := f.current()
	if err != nil {
		return "", err
	}
	s, ok := secrets[ref]
	if !ok {
		return "", fmt.Errorf("credentials: %q: %w (not in %s)", ref, ErrUnknownRef, f.file.Path())
	}
	return s, nil
}

// current is the file's map as it stands now, re-read if it changed.
func (f *File) current() (map[string]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.file.Check(); err != nil {
		return nil, fmt.Errorf("credentials: reading %s: %w", f.file.Path(), err)
	}
	return f.file.Reading()
}

func readCredentials(path string) (map[string]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("credentials: reading %s: %w", path, err)
	}
	var m map[string]string
	if err := json.Unmarshal(raw, &m); err != nil {
		// The decoder's message quotes no values for a type mismatch, but a
		// syntax error's offset is all that is safe to show.
		return nil, fmt.Errorf("credentials: %s is not a JSON object of strings", path)
	}
	if m == nil {
		m = map[string]string{}
	}
	return m, nil
}
