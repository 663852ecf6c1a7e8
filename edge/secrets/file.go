package secrets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"

	"github.com/runfleet/runfleet/edge/internal/filestamp"
)

// FileSource reads a JSON map {"<project>/<KEY>": "<value>"} and re-reads it
// when it changes: a read that follows a change sees it. On Linux a change
// watch (inotify on the file and every directory of its path, and the mount
// table) says whether anything changed, for one non-blocking poll per read;
// only then, or where no watch can see everything (a symlink on the path, a
// network filesystem), the file's identity, size and modification time are
// checked, and it is re-read when any differ. A file that does not parse
// fails every read (closed) until it is fixed: serving stale values could
// keep a revoked key alive.
type FileSource struct {
	path string

	mu    sync.Mutex
	watch *watchSlot
	// watchable: a watch could be armed for the path once, so one is
	// armed again after each change it reports.
	watchable bool
	stamp     filestamp.Stamp
	values    map[string]Value
	err       error
}

// watchSlot holds the armed change watch, nil when there is none; its own
// object, so the watch's descriptors can be closed when the source is
// collected (runtime.AddCleanup).
type watchSlot struct{ w *changeWatch }

func (s *watchSlot) close() {
	if s.w != nil {
		s.w.close()
		s.w = nil
	}
}

var _ Source = (*FileSource)(nil)

// NewFileSource reads path now, so a missing or malformed file stops edge
// at start instead of at the first request.
func NewFileSource(path string) (*FileSource, error) {
	f := &FileSource{path: path, watch: &watchSlot{}}
	f.mu.Lock()
	f.watch.w, _ = newChangeWatch(path) // armed before the first read
	f.watchable = f.watch.w != nil
	_, err := f.checkLocked()
	f.mu.Unlock()
	if err != nil {
		f.watch.close()
		return nil, err
	}
	runtime.AddCleanup(f, (*watchSlot).close, f.watch)
	return f, nil
}

// Close releases the change watch; reads go on, checking the file each time.
func (f *FileSource) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.watch.close()
	f.watchable = false
	return nil
}

// Value returns the value of project/key.
func (f *FileSource) Value(_ context.Context, project, key string) (Value, error) {
	values, err := f.current()
	if err != nil {
		return Value{}, err
	}
	v, ok := values[ID(project, key)]
	if !ok {
		return Value{}, fmt.Errorf("secrets file: %s: %w", ID(project, key), ErrNotFound)
	}
	return v, nil
}

func (f *FileSource) current() (map[string]Value, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if w := f.watch.w; w != nil {
		if !w.changed() {
			return f.values, f.err
		}
		f.watch.close()
	}
	if f.watchable {
		// Armed before the check, so a change during it is seen next time.
		f.watch.w, _ = newChangeWatch(f.path)
	}
	return f.checkLocked()
}

// checkLocked compares the file's identity, size and modification time
// with the last read's and re-reads it when any differ.
func (f *FileSource) checkLocked() (map[string]Value, error) {
	fi, err := os.Stat(f.path)
	if err != nil {
		f.watch.close() // so the next read checks again
		return nil, fmt.Errorf("secrets file: %w", err)
	}
	stamp := filestamp.FromInfo(fi)
	if stamp == f.stamp && (f.values != nil || f.err != nil) {
		return f.values, f.err
	}
	f.stamp = stamp
	f.values, f.err = readValues(f.path)
	return f.values, f.err
}

// readValues reads the file, each value wrapped once (a read per request
// allocates nothing).
func readValues(path string) (map[string]Value, error) {
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
	out := make(map[string]Value, len(values))
	for id, v := range values {
		out[id] = NewValue(v)
	}
	return out, nil
}
