package secrets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/runfleet/runfleet/shared/filewatch"
	"github.com/runfleet/runfleet/shared/jsonstrict"
)

// FileSource reads a JSON map {"<project>/<KEY>": "<value>"} and re-reads it
// when it changes: a read that follows a change sees it. On Linux a change
// watch (inotify on the file and every directory of its path, and the mount
// table) says whether anything changed, for one non-blocking poll per read
// and no lock: the proxy reads a value per request, and a lock there stalls
// every request behind a holder the machine has descheduled. When the watch
// reports something, the file is re-read under the lock whatever its stamp:
// a stamp cannot prove a file unchanged. Only where no watch can see
// everything (a symlink on the path, a network filesystem) does every read
// check the file's stamp (filewatch: its identity, size and modification
// time) under the lock, and re-read it when it differs. A file that does
// not parse fails every read (closed) until it is fixed: serving stale
// values could keep a revoked key alive.
type FileSource struct {
	path string
	// poll is the epoll instance the armed watch reports to. It lives as
	// long as the source (runtime.AddCleanup), so a read may poll it while
	// a check replaces the watch.
	poll *poller
	// found is what the last check found; a read returns it without the
	// lock when its poll saw nothing and state says no check, no report
	// and no other poll was under way (see readState).
	found atomic.Pointer[checked]
	state atomic.Uint64

	mu    sync.Mutex
	watch *changeWatch // nil when none is armed
	// watchable: a watch could be armed for the path once, so one is
	// armed again after each change it reports.
	watchable bool
	// file holds the last reading: the values, or why the file does not
	// parse.
	file *filewatch.File[map[string]Value]
}

// The read state: the polls in flight in its low 32 bits, and two flags.
// A poll may be the only one to see a change (the mount table reports one
// to the first poll only), so such a poll sets reported before it leaves,
// and a read trusts its own quiet poll only if no other was in flight
// beside it and nothing is reported or being checked. A read that does not
// trust it checks under the lock, where the watch has its own report of the
// mount table: the poll that took the change may not have said so yet (a
// descheduled thread can hold it for as long as the machine likes).
// checking is set while a check runs, from before it drains the watch's
// events until it has stored found.
const (
	inFlight = 1
	reported = 1 << 32
	checking = 1 << 33
)

// checked is one check's result; watched says a watch was armed for the
// next reads, so a quiet poll means it still holds.
type checked struct {
	values  map[string]Value
	err     error
	watched bool
}

var _ Source = (*FileSource)(nil)

// NewFileSource reads path now, so a missing or malformed file stops edge
// at start instead of at the first request.
func NewFileSource(path string) (*FileSource, error) {
	f := &FileSource{path: path, file: filewatch.New(path, readValues)}
	f.poll, _ = newPoller()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.arm() // before the first read
	f.watchable = f.watch != nil
	if _, err := f.checkLocked(); err != nil {
		f.disarm()
		f.poll.close()
		return nil, err
	}
	runtime.AddCleanup(f, func(p *poller) { p.close() }, f.poll)
	return f, nil
}

// Close releases the change watch; reads go on, checking the file each time.
func (f *FileSource) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.disarm()
	f.watchable = false
	f.found.Store(nil)
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
	if c := f.found.Load(); c != nil && c.watched {
		f.state.Add(inFlight)
		ready, only := f.poll.poll()
		if only {
			f.state.Or(reported)
		}
		if f.state.Add(^uint64(inFlight-1)) == 0 && !ready {
			if c := f.found.Load(); c != nil {
				return c.values, c.err
			}
		}
	}
	return f.check()
}

// check is the locked path: it takes in what the watch (or a read's poll)
// reported, or checks the file when no watch is armed.
func (f *FileSource) check() (map[string]Value, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state.Or(checking)
	defer f.state.And(^uint64(checking))
	wasReported := f.state.And(^uint64(reported))&reported != 0
	if f.watch != nil && !wasReported && !f.watch.changed() {
		return f.file.Reading()
	}
	f.disarm()
	if f.watchable {
		f.arm() // before the check, so a change during it is seen next time
	}
	return f.checkLocked()
}

// arm arms a change watch for the path, if one can be.
func (f *FileSource) arm() {
	if f.poll != nil {
		f.watch, _ = newChangeWatch(f.path, f.poll)
	}
}

func (f *FileSource) disarm() {
	if f.watch != nil {
		f.watch.close()
		f.watch = nil
	}
}

// checkLocked re-reads the file: with a watch armed always, for it is
// called then only for the first reading or a change the watch reported,
// which the stamp may not show (content of the same size written in place
// with its modification time put back, as cp -p and rsync -t do, or within
// one timestamp tick where the kernel keeps coarse timestamps); with none,
// when its stamp changed since the last read (filewatch decides).
func (f *FileSource) checkLocked() (map[string]Value, error) {
	if f.watch != nil {
		f.file.Reload()
	} else if _, err := f.file.Check(); err != nil {
		f.found.Store(nil) // so the next read checks again
		return nil, fmt.Errorf("secrets file: %w", err)
	}
	values, err := f.file.Reading()
	f.found.Store(&checked{values: values, err: err, watched: f.watch != nil})
	return values, err
}

// readValues reads the file, each value wrapped once (a read per request
// allocates nothing).
func readValues(path string) (map[string]Value, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("secrets file: %w", err)
	}
	// A key given twice would mean whichever value encoding/json keeps;
	// the error names the key alone, never a value.
	if err := jsonstrict.CheckDuplicateKeys(b); err != nil {
		return nil, fmt.Errorf("secrets file %s: %w", path, err)
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
