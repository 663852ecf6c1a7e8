// Package filewatch owns how runfleet tells that a file it re-reads has
// changed, and the re-read that follows: edge's policy (edge.json) and
// secrets file, Fleet's credentials file. A file is judged by its stamp:
// its identity (device and inode), size and modification time, so a file
// replaced by a rename is another inode and counts as a change even with
// the same size and modification time. What prompts a check (a poll tick,
// SIGHUP, an inotify event, a read) stays with each user; whether the file
// changed, and reading it again, is decided here.
package filewatch

import (
	"io/fs"
	"os"
	"syscall"
	"time"
)

// Stamp is what Of saw of a file; two stamps are equal (==) when the file
// is unchanged as far as they can tell. The zero Stamp matches no file.
type Stamp struct {
	dev, ino uint64
	size     int64
	mtime    time.Time
}

// Of stamps the file at path (following symlinks).
func Of(path string) (Stamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Stamp{}, err
	}
	return FromInfo(fi), nil
}

// FromInfo stamps a file from what Stat returned.
func FromInfo(fi fs.FileInfo) Stamp {
	s := Stamp{size: fi.Size(), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.dev, s.ino = uint64(st.Dev), st.Ino
	}
	return s
}
