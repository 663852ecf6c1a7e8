package sandbox

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// Every descriptor from 3 on ends up close-on-exec, whether close_range(2)
// sets the flag or, where it cannot, the descriptors are marked one by
// one; 0-2 keep theirs.
func TestCloseExtraFilesOnExecMarksEveryDescriptorFrom3On(t *testing.T) {
	for name, closeRange := range map[string]func(first, last, flags uint) error{
		"close_range":                  unix.CloseRange,
		"a kernel without its flag":    func(uint, uint, uint) error { return unix.EINVAL },
		"a seccomp filter refusing it": func(uint, uint, uint) error { return unix.EPERM },
	} {
		t.Run(name, func(t *testing.T) {
			stdio := make([]int, 3)
			for fd := range stdio {
				stdio[fd], _ = unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
			}
			var inherited []*os.File
			for range 2 {
				f, err := os.Open(os.DevNull)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if _, err := unix.FcntlInt(f.Fd(), unix.F_SETFD, 0); err != nil {
					t.Fatal(err)
				}
				inherited = append(inherited, f)
			}
			if err := closeExtraFilesOnExec(closeRange); err != nil {
				t.Fatal(err)
			}
			for _, f := range inherited {
				if flags, err := unix.FcntlInt(f.Fd(), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC == 0 {
					t.Errorf("descriptor %d: flags %#x %v, want close-on-exec", f.Fd(), flags, err)
				}
			}
			for fd, want := range stdio {
				if flags, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); flags != want {
					t.Errorf("descriptor %d's flags went from %#x to %#x", fd, want, flags)
				}
			}
		})
	}
}
