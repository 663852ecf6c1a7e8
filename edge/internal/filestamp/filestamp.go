// Package filestamp owns how edge tells that a file it re-reads (the
// policy in edge.json, the secrets file) has changed without reading it: by
// its identity (device and inode), size and modification time. A file
// replaced by a rename is another inode, so a replacement of the same size
// and modification time still counts as a change.
package filestamp

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
