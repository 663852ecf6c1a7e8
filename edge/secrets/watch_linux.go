package secrets

import (
	"fmt"
	"path/filepath"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// changeWatch tells whether what a path names may have changed since it was
// armed, for the price of one epoll_wait that does not block (a stat walks
// the whole path: about 1.3 µs against 0.2 µs here, and the proxy reads a
// value on every request). It sees every way the path's meaning can change:
//
//   - the file itself, through any of its links: written, truncated, its
//     attributes changed, removed or moved (an inotify watch on the inode);
//   - every directory from the root down to the file's: an entry named like
//     the next component created, removed or renamed, or the directory
//     itself removed or moved (an inotify watch on each);
//   - the mount table (a mount over any component): /proc/self/mountinfo
//     signals a change (proc(5)).
//
// It is armed only where that is the whole story: an absolute path with no
// symlink on it, every component on a local filesystem (a network
// filesystem changes without telling inotify). Anything noticed, and any
// error, reads as a change: the caller checks the file and arms a new
// watch.
type changeWatch struct {
	in int
	// mounts and mountsLocked are two opens of the mount table, each
	// reporting a change once (proc(5)): mounts to the first of the
	// lock-free polls, which may be descheduled before it says so;
	// mountsLocked only to changed, under the source's lock, so a check
	// sees a change whichever poll took the other report.
	mounts, mountsLocked int
	// next maps a directory's watch to the entry in it the path goes
	// through; the file's own watch maps to "".
	next map[int32]string
}

// localFilesystems are the filesystem types whose changes inotify reports
// wherever they are made from.
var localFilesystems = map[int64]bool{
	unix.EXT4_SUPER_MAGIC:      true, // also ext2 and ext3
	unix.XFS_SUPER_MAGIC:       true,
	unix.BTRFS_SUPER_MAGIC:     true,
	unix.TMPFS_MAGIC:           true,
	unix.RAMFS_MAGIC:           true,
	unix.F2FS_SUPER_MAGIC:      true,
	unix.OVERLAYFS_SUPER_MAGIC: true,
	0x2fc12fc1:                 true, // zfs
}

const (
	dirEvents  = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF
	fileEvents = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CLOSE_WRITE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF
	// selfEvents end a watch or make it blind: always a change.
	selfEvents = unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_IGNORED | unix.IN_UNMOUNT | unix.IN_Q_OVERFLOW
)

func newChangeWatch(path string, p *poller) (_ *changeWatch, err error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	w := &changeWatch{in: -1, mounts: -1, mountsLocked: -1, next: map[int32]string{}}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	// The mount table first: a mount made while the path is walked below is
	// then reported, and one made before is what the walk sees. mountsLocked
	// before mounts, so whatever mounts reports, mountsLocked does too.
	for _, fd := range []*int{&w.mountsLocked, &w.mounts} {
		if *fd, err = unix.Open("/proc/self/mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return nil, err
		}
	}
	if w.in, err = unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC); err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	dir := "/"
	for _, name := range strings.Split(strings.TrimPrefix(abs, "/"), "/") {
		if err := w.add(dir, name, dirEvents|unix.IN_ONLYDIR); err != nil {
			return nil, err
		}
		dir = filepath.Join(dir, name)
		var st unix.Stat_t
		if err := unix.Lstat(dir, &st); err != nil {
			return nil, err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return nil, fmt.Errorf("%s is a symlink", dir)
		}
	}
	if err := w.add(abs, "", fileEvents); err != nil {
		return nil, err
	}
	if err := unix.EpollCtl(p.ep, unix.EPOLL_CTL_ADD, w.in, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(w.in)}); err != nil {
		return nil, err
	}
	if err := unix.EpollCtl(p.ep, unix.EPOLL_CTL_ADD, w.mounts, &unix.EpollEvent{Events: unix.EPOLLPRI, Fd: int32(w.mounts), Pad: onePoll}); err != nil {
		return nil, err
	}
	return w, nil
}

// add watches one component: a directory (next names the entry the path
// goes through) or the file (next is "").
func (w *changeWatch) add(path, next string, events uint32) error {
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return err
	}
	if !localFilesystems[int64(fs.Type)] {
		return fmt.Errorf("%s: filesystem %#x may change unseen", path, fs.Type)
	}
	wd, err := unix.InotifyAddWatch(w.in, path, events|unix.IN_DONT_FOLLOW)
	if err != nil {
		return fmt.Errorf("watching %s: %w", path, err)
	}
	w.next[int32(wd)] = next
	return nil
}

// changed reports whether anything the path goes through may have changed
// since the watch was armed. It is called under the source's lock only.
// Once true, the watch is spent: the caller closes it and arms a new one.
func (w *changeWatch) changed() bool {
	fds := [2]unix.PollFd{
		{Fd: int32(w.mountsLocked), Events: unix.POLLPRI},
		{Fd: int32(w.in), Events: unix.POLLIN},
	}
	if _, err := unix.Poll(fds[:], 0); err != nil {
		return true
	}
	if fds[0].Revents != 0 {
		return true // the mount table
	}
	return fds[1].Revents != 0 && w.concerned()
}

// concerned drains the inotify events and reports whether one concerns
// the path (not another entry of a directory on it).
func (w *changeWatch) concerned() bool {
	var buf [4096]byte
	hit := false
	for {
		n, err := unix.Read(w.in, buf[:])
		if err == unix.EAGAIN {
			return hit
		}
		if err != nil || n < unix.SizeofInotifyEvent {
			return true
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			next, known := w.next[ev.Wd]
			switch {
			case ev.Mask&selfEvents != 0 || !known || next == "":
				hit = true
			case strings.TrimRight(string(name), "\x00") == next:
				hit = true
			}
		}
	}
}

// close closes the watch's descriptors, which takes them off its poller.
func (w *changeWatch) close() {
	for _, fd := range []int{w.in, w.mounts, w.mountsLocked} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	w.in, w.mounts, w.mountsLocked = -1, -1, -1
}

// poller is the epoll instance a source's change watches report to, one for
// the source's whole life: reads poll it while a check may be replacing the
// watch, so its descriptor is never closed (and its number reused) under
// them.
type poller struct{ ep int }

func newPoller() (*poller, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	return &poller{ep: ep}, nil
}

// onePoll marks a descriptor that reports a change to one poll only (the
// mount table: proc(5)); inotify's events stay until they are read.
const onePoll = 1

// poll reports whether the watches on p have anything to report, and
// whether the poll may have been the only one to see it (the caller must
// then say so). It does not block, so it is a raw system call, without the
// scheduler's bookkeeping for one that might.
func (p *poller) poll() (ready, only bool) {
	var ev unix.EpollEvent
	n, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(p.ep), uintptr(unsafe.Pointer(&ev)), 1, 0, 0, 0)
	if errno != 0 {
		return true, true
	}
	return n > 0, n > 0 && ev.Pad == onePoll
}

func (p *poller) close() {
	if p != nil {
		unix.Close(p.ep)
	}
}
