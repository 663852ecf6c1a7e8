package secrets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
)

// FileSource reads a JSON map {"<project>/<KEY>": "<value>"}. It checks the
// file's identity, size and modification time on every read and re-reads it
// when any changed. A file that does not parse fails every read (closed)
// until it is fixed: serving stale values could keep a revoked key alive.
type FileSource struct {
	path string

	mu     sync.Mutex
	stamp  fileStamp
	values map[string]string
	err    error
}

var _ Source = (*FileSource)(nil)

type fileStamp struct {
	dev, ino uint64
	size     int64
	mtime    time.Time
}

// NewFileSource reads path now, so a missing or malformed file stops edge
// at start instead of at the first request.
func NewFileSource(path string) (*FileSource, error) {
	f := &FileSource{path: path}
	if _, err := f.current(); err != nil {
		return nil, err
	}
	return f, nil
}

// Value returns the value of project/key.
func (f *FileSource) Value(_ context.Context, project, key string) (string, error) {
	values, err := f.current()
	if err != nil {
		return "", err
	}
	v, ok := values[ID(project, key)]
	if !ok {
		return "", fmt.Errorf("secrets file: %s: %w", ID(project, key), ErrNotFound)
	}
	return v, nil
}

func (f *FileSource) current() (map[string]string, error) {
	fi, err := os.Stat(f.path)
	if err != nil {
		return nil, fmt.Errorf("secrets file: %w", err)
	}
	stamp := fileStamp{size: fi.Size(), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		stamp.dev, stamp.ino = uint64(st.Dev), st.Ino
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if stamp == f.stamp && (f.values != nil || f.err != nil) {
		return f.values, f.err
	}
	f.stamp = stamp
	f.values, f.err = readValues(f.path)
	return f.values, f.err
}

func readValues(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("secrets file: %w", err)
	}
	var values map[string]string
	if err := json.Unmarshal(b, &values); err != nil {
		// The JSON error may quote file content, i.e. a value: say only where.
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return nil, fmt.Errorf("secrets file %s: not a JSON object of strings (syntax error at byte %d)", path, syn.Offset)
		}
		return nil, fmt.Errorf("secrets file %s: not a JSON object of strings", path)
	}
	if values == nil {
		values = map[string]string{}
	}
	return values, nil
}
