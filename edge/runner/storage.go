package runner

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
)

// Disk reports the free space where the runner records runs: the run log
// and the tasks' work dirs.
type Disk interface {
	// FreeBytes is the space edge may still write there now, the least over
	// the filesystems involved. Safe for concurrent use; cheap enough to
	// call for every chunk of output.
	FreeBytes() (int64, error)
}

// StatFS is the Disk of the filesystems holding Paths: statfs's available
// blocks (f_bavail, what is left once a filesystem's root-only blocks are
// set aside) times their size.
type StatFS struct{ Paths []string }

var _ Disk = StatFS{}

// FreeBytes implements Disk.
func (s StatFS) FreeBytes() (int64, error) {
	least := int64(-1)
	for _, p := range s.Paths {
		var st syscall.Statfs_t
		if err := syscall.Statfs(p, &st); err != nil {
			return 0, fmt.Errorf("runner: reading the free space of %s: %w", p, err)
		}
		if free := int64(st.Bavail) * st.Bsize; least < 0 || free < least {
			least = free
		}
	}
	return max(least, 0), nil
}

// FreeInodes is the least count of free files (inodes) over the
// filesystems holding Paths; -1 where none of them counts files (btrfs
// reports none).
func (s StatFS) FreeInodes() (int64, error) {
	least := int64(-1)
	for _, p := range s.Paths {
		var st syscall.Statfs_t
		if err := syscall.Statfs(p, &st); err != nil {
			return 0, fmt.Errorf("runner: reading the free inodes of %s: %w", p, err)
		}
		if st.Files == 0 {
			continue
		}
		if free := int64(st.Ffree); least < 0 || free < least {
			least = free
		}
	}
	return least, nil
}

// inodeCounter is a Disk that also counts free files (StatFS does).
type inodeCounter interface {
	FreeInodes() (int64, error)
}

// minFreeInodes: with fewer free files (inodes) where runs are recorded,
// a new run could not make its directories whatever the free bytes say (a
// task that made files without end leaves the bytes free), so admission
// refuses host_storage_low, and /healthz says storage is low, as under the
// reserve of bytes. A floor: a clone takes a file per file it checks out.
const minFreeInodes = 1024

// How the reserve (runner.minFreeBytes) is shared out. Under the reserve
// admission refuses new runs; running runs go on recording their output
// until free space would fall under the part of the reserve kept for ends
// (endReserveBytes), where their output stops being recorded and they end
// storage_full. What remains records those ends and their notices. The
// ballast is a file holding space of its own for the same records, given
// up when a write fails for want of space anyway (something else filled
// the disk: a task's own files, another program) and made again once
// space returns.
func endReserveBytes(minFree int64) int64 { return minFree / 4 }

func ballastBytes(minFree int64) int64 { return min(minFree/16, 8<<20) }

// ballastName is the ballast file's name, beside the run log.
const ballastName = "storage.reserve"

// ballast is a file whose blocks are allocated (fallocate) so that
// releasing it frees space on a full filesystem. Safe for concurrent use.
type ballast struct {
	path string
	size int64

	mu   sync.Mutex
	held bool
}

// fill makes the ballast unless it is held.
func (b *ballast) fill() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held || b.size <= 0 {
		return nil
	}
	f, err := os.OpenFile(b.path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("runner: making the storage ballast: %w", err)
	}
	// A file a previous edge left keeps its blocks: allocating them again
	// needs no space, and a larger one is cut to size.
	err = syscall.Fallocate(int(f.Fd()), 0, 0, b.size)
	if err == nil {
		err = f.Truncate(b.size)
	}
	f.Close()
	if err != nil {
		os.Remove(b.path)
		return fmt.Errorf("runner: allocating the storage ballast %s (%s): %w", b.path, humanBytes(b.size), err)
	}
	b.held = true
	return nil
}

// release gives the ballast's space back, reporting whether it was held.
func (b *ballast) release() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.held {
		return false
	}
	b.held = false
	os.Remove(b.path)
	return true
}

func (b *ballast) isHeld() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

// noSpace reports whether err is a write refused for want of space.
func noSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// Log keys of rate-limited conditions (package throttle).
const (
	condStorageRead     = "storage.read"
	condStorageLow      = "storage.low"
	condStorageInodes   = "storage.inodes"
	condReclaim         = "storage.reclaim"
	condBallast         = "storage.ballast"
	condOutputStopped   = "storage.output"
	condRecordOutput    = "runlog.output"
	condRecordEnd       = "runlog.end"
	condRecordAdmission = "runlog.admission"
	condLimitsRead      = "limits.read"
	condLimitsRemove    = "limits.remove"
)

// freeBytes reads the free space for admission. Space having returned (the
// host is over its reserve with room for the ballast too), it remakes a
// ballast given up earlier.
func (r *Runner) freeBytes() (int64, error) {
	free, err := r.cfg.Disk.FreeBytes()
	if err != nil {
		r.logs.Error(condStorageRead, "reading the data dir's free space", fieldError, err.Error())
		return 0, err
	}
	if d, ok := r.cfg.Disk.(inodeCounter); ok {
		n, err := d.FreeInodes()
		if err == nil && n >= 0 && n < minFreeInodes {
			err = fmt.Errorf("it has %d free inodes (files), under the %d a run needs to make its directories: it admits runs again once files are removed", n, minFreeInodes)
		}
		if err != nil {
			r.logs.Warn(condStorageInodes, "the data dir cannot take new runs: they are refused host_storage_low", fieldError, err.Error())
			return free, err
		}
	}
	if !r.ballast.isHeld() && free >= r.cfg.MinFreeBytes+r.ballast.size {
		if err := r.ballast.fill(); err != nil {
			r.logs.Error(condBallast, "making the storage ballast", fieldError, err.Error())
		} else {
			free -= r.ballast.size
		}
	}
	return free, nil
}

// storageFacts adds the data dir's free space to admission's facts.
func (r *Runner) storageFacts(f *Facts) {
	f.FreeBytes, f.Storage = r.freeBytes()
	f.MinFreeBytes = r.cfg.MinFreeBytes
	if f.Storage == nil && f.FreeBytes < f.MinFreeBytes {
		r.logs.Warn(condStorageLow, "the data dir is under its reserve: runs are refused host_storage_low",
			fieldFree, f.FreeBytes, fieldMinFree, f.MinFreeBytes)
	}
}

// Storage is the data dir's free space against its reserve, for /healthz.
// A reading that fails, or free inodes under minFreeInodes, counts as low:
// admission refuses on it too.
func (r *Runner) Storage() StorageReport {
	free, err := r.freeBytes()
	return StorageReport{FreeBytes: free, MinFreeBytes: r.cfg.MinFreeBytes, Low: err != nil || free < r.cfg.MinFreeBytes}
}

// StorageReport is the free space where runs are recorded against its
// reserve (runner.minFreeBytes). Low: admission refuses host_storage_low.
type StorageReport struct {
	FreeBytes    int64
	MinFreeBytes int64
	Low          bool
}

// record writes to the run log through write; a write refused for want of
// space is tried once more after giving up the ballast, which is there for
// exactly the records of runs' ends.
func (r *Runner) record(runID string, write func() error) error {
	err := write()
	if err == nil || !noSpace(err) || !r.ballast.release() {
		return err
	}
	r.logs.Warn(condBallast, "the data dir is full: released the storage ballast to record runs' ends",
		fieldRun, runID, "ballastBytes", r.ballast.size)
	return write()
}

// humanBytes writes n in binary units, as an operator reads a disk's size.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}

// reclaimDirs removes an ended attempt's directories where the data dir is
// under its reserve (bytes or inodes). What a task wrote there, not its
// output (the run log holds that), would otherwise keep the host refusing
// every run host_storage_low until the run is purged (runner.retention,
// a week by default): one task filling the disk would take the host out
// of service that long. A retry then starts afresh, cloning again. It runs
// before the end is recorded, so no retry of the run begins meanwhile.
func (r *Runner) reclaimDirs(t *task) {
	if t.dirs.Run == "" {
		return
	}
	if _, err := os.Lstat(t.dirs.Run); err != nil {
		return // none made (a start refused at admission), or gone already
	}
	free, err := r.freeBytes()
	if err == nil && free >= r.cfg.MinFreeBytes {
		return
	}
	if err := os.RemoveAll(t.dirs.Run); err != nil {
		r.logs.Error(condReclaim, "removing an ended run's directories to free the data dir", fieldRun, t.runID, fieldError, err.Error())
		return
	}
	r.logs.Warn(condReclaim, "the data dir is under its reserve: removed an ended run's directories (a retry starts afresh)", fieldRun, t.runID, fieldFree, free, fieldMinFree, r.cfg.MinFreeBytes)
}
