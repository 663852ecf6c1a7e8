package secrets

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// watchedSource starts a FileSource on root/a/b/secrets.json holding v, and
// checks that a change watch is armed (so the tests below exercise it, not
// the stat fallback).
func watchedSource(t *testing.T, v string) (*FileSource, string) {
	t.Helper()
	root := t.TempDir()
	path := filepath.Join(root, "a", "b", "secrets.json")
	writeValue(t, path, v)
	src, err := NewFileSource(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	if src.watch == nil {
		t.Fatal("no change watch armed on a plain path on a local filesystem")
	}
	return src, path
}

func writeValue(t *testing.T, path, v string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(`{"acme/K": "`+v+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
}

func expectValue(t *testing.T, src *FileSource, want string) {
	t.Helper()
	v, err := src.Value(context.Background(), "acme", "K")
	if err != nil || v.Reveal() != want {
		t.Fatalf("value %q, %v; want %q", v.Reveal(), err, want)
	}
}

// Every way the path's meaning can change is seen by the very next read:
// an in-place rewrite of the same size (within one timestamp tick, which a
// size-and-mtime check cannot see), a rename over the file, a write through
// a hard link elsewhere, the file removed, its directory or a directory
// above it replaced.
func TestFileSourceSeesEveryChangeAtOnce(t *testing.T) {
	src, path := watchedSource(t, "one")
	root := filepath.Dir(filepath.Dir(filepath.Dir(path)))
	expectValue(t, src, "one")

	writeValue(t, path, "two") // in place, same size
	expectValue(t, src, "two")

	tmp := path + ".tmp"
	writeValue(t, tmp, "333")
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	expectValue(t, src, "333")

	link := filepath.Join(root, "elsewhere")
	if err := os.Link(path, link); err != nil {
		t.Fatal(err)
	}
	writeValue(t, link, "via-link")
	expectValue(t, src, "via-link")

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Value(context.Background(), "acme", "K"); err == nil {
		t.Fatal("a removed file still gives its value")
	}
	writeValue(t, path, "back")
	expectValue(t, src, "back")

	for _, dir := range []string{filepath.Dir(path), filepath.Join(root, "a")} {
		if err := os.Rename(dir, dir+".old"); err != nil {
			t.Fatal(err)
		}
		writeValue(t, path, "new-"+filepath.Base(dir))
		expectValue(t, src, "new-"+filepath.Base(dir))
	}
}

// Churn beside the path (other entries of its directories created and
// removed) is not a change: the watch stays armed and the value cached.
func TestFileSourceIgnoresItsNeighbours(t *testing.T) {
	src, path := watchedSource(t, "one")
	expectValue(t, src, "one")
	armed := src.watch
	for _, dir := range []string{filepath.Dir(path), filepath.Dir(filepath.Dir(path))} {
		other := filepath.Join(dir, "neighbour")
		if err := os.WriteFile(other, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(other); err != nil {
			t.Fatal(err)
		}
	}
	expectValue(t, src, "one")
	if src.watch != armed {
		t.Fatal("a neighbour's churn was taken for a change of the file")
	}
}

// A path through a symlink is not watched (re-pointing the link changes
// the path's meaning where no watch of the path sees it): every read checks
// the file, and re-pointing is seen.
func TestFileSourceThroughASymlinkChecksEveryRead(t *testing.T) {
	root := t.TempDir()
	writeValue(t, filepath.Join(root, "v1", "secrets.json"), "one")
	writeValue(t, filepath.Join(root, "v2", "secrets.json"), "two")
	current := filepath.Join(root, "current")
	if err := os.Symlink("v1", current); err != nil {
		t.Fatal(err)
	}
	src, err := NewFileSource(filepath.Join(current, "secrets.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if src.watch != nil {
		t.Fatal("a change watch was armed on a path through a symlink")
	}
	expectValue(t, src, "one")
	if err := os.Symlink("v2", current+".new"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(current+".new", current); err != nil {
		t.Fatal(err)
	}
	expectValue(t, src, "two")

	// The file itself a symlink: its target is written in place.
	link := filepath.Join(root, "link.json")
	if err := os.Symlink(filepath.Join(root, "v1", "secrets.json"), link); err != nil {
		t.Fatal(err)
	}
	viaLink, err := NewFileSource(link)
	if err != nil {
		t.Fatal(err)
	}
	defer viaLink.Close()
	if viaLink.watch != nil {
		t.Fatal("a change watch was armed on a symlink")
	}
	expectValue(t, viaLink, "one")
	writeValue(t, filepath.Join(root, "v1", "secrets.json"), "uno")
	expectValue(t, viaLink, "uno")
}

// A filesystem mounted over a directory of the path changes what the path
// names without any inotify event: the mount table's change is seen.
func TestFileSourceSeesAMountOverItsPath(t *testing.T) {
	src, path := watchedSource(t, "one")
	expectValue(t, src, "one")
	mountTmpfs(t, filepath.Dir(path))
	writeValue(t, path, "mounted")
	expectValue(t, src, "mounted")
}

// mountTmpfs mounts a tmpfs over dir until the test ends.
func mountTmpfs(t *testing.T, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts a tmpfs over a temporary directory: run it as root (as in CI)")
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
}

// Reads racing each other share what one check found, without the lock,
// yet a read that starts after a change has completed never returns what
// came before it, whichever read's poll saw the change (the mount table
// reports a mount to one poll only).
func TestFileSourceConcurrentReadsFollowEveryChange(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts a tmpfs over a temporary directory: run it as root (as in CI)")
	}
	src, path := watchedSource(t, "v0")
	dir := filepath.Dir(path)
	var (
		begun   atomic.Int64 // the number of the last change begun
		changed atomic.Int64 // the number of the last change completed
		stale   atomic.Int64
		stop    atomic.Bool
		wg      sync.WaitGroup
	)
	for range 8 {
		wg.Go(func() {
			for !stop.Load() {
				n := changed.Load()
				v, err := src.Value(context.Background(), "acme", "K")
				if err != nil {
					// The file is missing while a tmpfs is mounted and
					// not yet written: only then may a read fail.
					if begun.Load() == n {
						t.Errorf("a read failed with no change under way: %v", err)
					}
					continue
				}
				got, _ := strconv.Atoi(strings.TrimPrefix(v.Reveal(), "v"))
				// Once the next change has begun, its unmount may show an
				// older file for a moment: only a read that no change
				// overlapped must see the last one.
				if int64(got) < n && begun.Load() == n {
					stale.Add(1)
				}
			}
		})
	}
	change := func(n int, do func(v string)) {
		begun.Store(int64(n))
		do("v" + strconv.Itoa(n))
		changed.Store(int64(n))
		for range 2000 { // let the readers race the next change
			if _, err := src.Value(context.Background(), "acme", "K"); err != nil {
				t.Error(err)
			}
		}
	}
	n := 0
	for range 20 {
		n++
		change(n, func(v string) { // a rename over the file
			writeValue(t, path+".tmp", v)
			if err := os.Rename(path+".tmp", path); err != nil {
				t.Fatal(err)
			}
		})
		n++
		change(n, func(v string) { // a tmpfs over its directory, then gone again
			if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
				t.Fatal(err)
			}
			writeValue(t, path, v)
		})
		n++
		change(n, func(v string) {
			if err := unix.Unmount(dir, 0); err != nil {
				t.Fatal(err)
			}
			writeValue(t, path, v)
		})
	}
	stop.Store(true)
	wg.Wait()
	if s := stale.Load(); s != 0 {
		t.Fatalf("%d reads that started after a change returned a value from before it", s)
	}
}

// BenchmarkFileSourceValueParallel: what a value read costs the proxy,
// which makes one per request from every connection at once.
func BenchmarkFileSourceValueParallel(b *testing.B) {
	root := b.TempDir()
	path := filepath.Join(root, "secrets.json")
	if err := os.WriteFile(path, []byte(`{"acme/K": "v"}`), 0o600); err != nil {
		b.Fatal(err)
	}
	src, err := NewFileSource(path)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := src.Value(context.Background(), "acme", "K"); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// A read's poll may be the only one to see a mount (the mount table reports
// it to one poll) and then be descheduled before it says so: a read that
// starts after the mount and its write have completed must still see them,
// though its own poll is quiet and no report is published yet.
func TestFileSourceSeesAMountAnotherPollTookUnreported(t *testing.T) {
	src, path := watchedSource(t, "one")
	expectValue(t, src, "one")

	// The descheduled read: in flight, its poll taken after the mount.
	src.state.Add(inFlight)
	mountTmpfs(t, filepath.Dir(path))
	if ready, only := src.poll.poll(); !ready || !only {
		t.Fatalf("the mount was not reported to the first poll (ready %v, only %v)", ready, only)
	}
	writeValue(t, path, "mounted")
	expectValue(t, src, "mounted")

	// The read resumes: it reports what it saw, and the watch holds again.
	src.state.Or(reported)
	src.state.Add(^uint64(inFlight - 1))
	expectValue(t, src, "mounted")
}

// A file rewritten in place with content of the same size and its old
// modification time put back (cp -p, rsync -t, a rotated key of the same
// length) keeps its stamp: the change the watch reports is still read.
func TestFileSourceSeesARewriteThatKeepsTheStamp(t *testing.T) {
	src, path := watchedSource(t, "old-key")
	expectValue(t, src, "old-key")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	writeValue(t, path, "new-key")
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	expectValue(t, src, "new-key")
}
