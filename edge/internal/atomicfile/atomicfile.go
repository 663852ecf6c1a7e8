// Package atomicfile owns how edge replaces a file so that a crash leaves
// the old content or the new, never a mix or an empty file: the data goes to
// a temp file beside it, written and fsynced, which is renamed over it (or,
// to create without replacing, linked to it), and then the directory is
// fsynced so that the rename itself survives a crash. The CA store and the
// seal key, the proxy's placeholders and the tasks' trust files are written
// this way.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Write replaces path with data, with mode perm (whatever the umask).
func Write(path string, data []byte, perm fs.FileMode) error {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

// Create is Write that never replaces an existing file: it fails with an
// error satisfying errors.Is(err, fs.ErrExist) instead, and the file stays
// as it was.
func Create(path string, data []byte, perm fs.FileMode) error {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

// RemoveTemps removes the temp files a crash between a write and its rename
// left beside path; nothing reads them. Errors are ignored: a temp file left
// is only clutter.
func RemoveTemps(path string) {
	dir := filepath.Dir(path)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	prefix := tempPrefix(path)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// IsTemp reports whether a directory entry's name is a temp file of this
// package's (of any file), for a caller that lists the directory.
func IsTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, tempMark)
}

const tempMark = ".tmp-"

// tempPrefix names path's temp files.
func tempPrefix(path string) string { return "." + filepath.Base(path) + tempMark }

func writeTemp(path string, data []byte, perm fs.FileMode) (string, error) {
	f, err := os.CreateTemp(filepath.Dir(path), tempPrefix(path)+"*")
	if err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	name := f.Name()
	err = f.Chmod(perm)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	err = errors.Join(err, f.Close())
	if err != nil {
		os.Remove(name)
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	return name, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}
