package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// TrustStoreFiles are where Linux distributions keep the system roots, in
// the order Go's crypto/x509 looks: what a task's Trust replaces, and where
// edge reads the system roots its trust files start with.
var TrustStoreFiles = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/ca-bundle.pem",
	"/etc/pki/tls/cacert.pem",
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
	"/etc/ssl/cert.pem",
}

// replaceTrustStore makes each of trust.Replace that exists on the host
// read as trust.File in the task's mount namespace, for the whole task:
// programs that read only the system store (wget's GnuTLS, OpenSSL's
// default paths, Go's and Python's default roots) then trust the proxy's
// CA, its successor included, with no variable set.
//
// Edge replaces trust.File by renaming a new file over it, and a bind
// mount of a file pins the inode it found: the bundle is a symbolic link
// to trust.File instead, which every open resolves afresh. Its directory
// is rebuilt on a tmpfs of its own for that, since the host's must not
// change (see rebuildDir).
func replaceTrustStore(trust Trust) error {
	var st unix.Stat_t
	if err := unix.Stat(trust.File, &st); err != nil {
		return fmt.Errorf("the trust file: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("the trust file %s is not a regular file", trust.File)
	}
	// Each directory that holds a bundle, with the bundles' names in it.
	bundles := map[string]map[string]bool{}
	for _, p := range trust.Replace {
		real, err := filepath.EvalSymlinks(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("resolving %s: %w", p, err)
		}
		fi, err := os.Stat(real)
		if err != nil {
			return fmt.Errorf("resolving %s: %w", p, err)
		}
		if !fi.Mode().IsRegular() || real == trust.File {
			continue
		}
		dir := filepath.Dir(real)
		if dir == "/" {
			return fmt.Errorf("the trust store %s lies in /, which cannot be rebuilt", p)
		}
		if bundles[dir] == nil {
			bundles[dir] = map[string]bool{}
		}
		bundles[dir][filepath.Base(real)] = true
	}
	// A directory before those inside it (a prefix sorts first): rebuilt,
	// it binds them back, and they are rebuilt over that.
	for _, dir := range slices.Sorted(maps.Keys(bundles)) {
		links := map[string]string{}
		for name := range bundles[dir] {
			links[name] = trust.File
		}
		if err := rebuildDir(dir, links, nil); err != nil {
			return err
		}
	}
	return nil
}

// dirEntry is an entry of a directory as rebuilt: a symbolic link to
// link, the file or directory open as fd bound back, or an empty file.
type dirEntry struct {
	name  string
	link  string
	fd    int // -1 for a link or an empty file
	dir   bool
	empty bool
}

// rebuildDir mounts a fresh tmpfs over dir holding what dir holds: each
// name of links a symbolic link to its target (a trust store's bundles,
// to the task's trust file), every other symbolic link as it is
// (OpenSSL's hash links, /etc/ssl/certs' links into
// /usr/share/ca-certificates), every file and directory bound back from
// the original, opened before the tmpfs hides it (java/cacerts, a local
// CA's file, ssh_config), and each of add an empty file, a mount point
// for a file of the task's (Spec.Files' Make). Other kinds of file (a
// socket, a device), which none of these directories holds, are left out.
// The tmpfs is then read-only, nosuid and nodev: the task changes nothing
// there, and the host's directory is never written.
func rebuildDir(dir string, links map[string]string, add []string) error {
	if dir == "/" {
		// A tmpfs over / hides the root the entries would be bound back
		// from.
		return errors.New("/ cannot be rebuilt")
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("opening %s to rebuild it: %w", dir, err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("listing %s: %w", dir, err)
	}
	dfd := int(d.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(dfd, &st); err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	entries := make([]dirEntry, 0, len(names))
	defer func() {
		for _, e := range entries {
			if e.fd >= 0 {
				unix.Close(e.fd)
			}
		}
	}()
	for _, name := range names {
		var est unix.Stat_t
		if err := unix.Fstatat(dfd, name, &est, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("%s/%s: %w", dir, name, err)
		}
		if slices.Contains(add, name) {
			// A dangling link where a file is added (the host's points
			// nowhere): the file takes its place.
			entries = append(entries, dirEntry{name: name, fd: -1, empty: true})
			continue
		}
		if target, ok := links[name]; ok {
			entries = append(entries, dirEntry{name: name, link: target, fd: -1})
			continue
		}
		switch kind := est.Mode & unix.S_IFMT; {
		case kind == unix.S_IFLNK:
			link, err := readlinkat(dfd, name)
			if err != nil {
				return fmt.Errorf("%s/%s: %w", dir, name, err)
			}
			entries = append(entries, dirEntry{name: name, link: link, fd: -1})
		case kind == unix.S_IFREG || kind == unix.S_IFDIR:
			fd, err := unix.Openat(dfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("%s/%s: %w", dir, name, err)
			}
			entries = append(entries, dirEntry{name: name, fd: fd, dir: kind == unix.S_IFDIR})
		}
	}
	for _, name := range add {
		if !slices.ContainsFunc(entries, func(e dirEntry) bool { return e.name == name }) {
			entries = append(entries, dirEntry{name: name, fd: -1, empty: true})
		}
	}

	// Room for every entry to take a page (a long link's target does) and
	// an inode, and no more: the tmpfs is read-only once populated.
	page := os.Getpagesize()
	opts := fmt.Sprintf("mode=%o,uid=%d,gid=%d,size=%d,nr_inodes=%d",
		st.Mode&0o7777, st.Uid, st.Gid, (len(entries)+1)*page, len(entries)+16)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mounting over %s: %w", dir, err)
	}
	fresh, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the rebuilt %s: %w", dir, err)
	}
	defer unix.Close(fresh)
	for _, e := range entries {
		if err := rebuildEntry(fresh, dir, e); err != nil {
			return fmt.Errorf("rebuilding %s/%s: %w", dir, e.name, err)
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("making the rebuilt %s read-only: %w", dir, err)
	}
	return nil
}

// rebuildEntry makes e in the fresh directory fresh (dir's path).
func rebuildEntry(fresh int, dir string, e dirEntry) error {
	if e.empty {
		fd, err := unix.Openat(fresh, e.name, unix.O_CREAT|unix.O_EXCL|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return err
		}
		return unix.Close(fd)
	}
	if e.fd < 0 {
		return unix.Symlinkat(e.link, fresh, e.name)
	}
	// A mount point of the entry's kind, which the bind then covers.
	if e.dir {
		if err := unix.Mkdirat(fresh, e.name, 0o700); err != nil {
			return err
		}
	} else {
		fd, err := unix.Openat(fresh, e.name, unix.O_CREAT|unix.O_EXCL|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		unix.Close(fd)
	}
	source := "/proc/self/fd/" + strconv.Itoa(e.fd)
	return unix.Mount(source, filepath.Join(dir, e.name), "", unix.MS_BIND|unix.MS_REC, "")
}

// readlinkat is readlinkat(2) of any length.
func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}
