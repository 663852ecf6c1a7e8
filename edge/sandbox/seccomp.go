package sandbox

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Where seccomp_data keeps a system call's number, its architecture and
// the low half of its first argument (little-endian).
const (
	seccompNr   = 0
	seccompArch = 4
	seccompArg0 = 16
)

// seccompFilter is the filter every task runs under, as Docker's default
// profile does for the same calls:
//   - the kernel's key management (add_key, request_key, keyctl) fails
//     EPERM: tasks share runner.user's uid, so its user keyrings would be
//     a store one task writes and a later one reads;
//   - a new user namespace (unshare or clone with CLONE_NEWUSER) fails
//     EPERM: nothing a task needs, and the kernel's largest surface for
//     an unprivileged process; clone3, whose flags a filter cannot read,
//     fails ENOSYS, which makes libc fall back to clone;
//   - a call of another architecture (a 32-bit binary, x32) fails EPERM,
//     since its numbers differ and would slip past the rules above.
//
// Everything else is allowed.
func seccompFilter() ([]bpf.RawInstruction, error) {
	errno := func(e unix.Errno) bpf.RetConstant {
		return bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(e)}
	}
	allow := bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW}
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: seccompArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: auditArch, SkipTrue: 1},
		errno(unix.EPERM),
		bpf.LoadAbsolute{Off: seccompNr, Size: 4},
	}
	prog = append(prog, foreignCalls()...)
	deny := func(nr uintptr, e unix.Errno) []bpf.Instruction {
		return []bpf.Instruction{bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(nr), SkipFalse: 1}, errno(e)}
	}
	for _, nr := range []uintptr{unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY, unix.SYS_KEYCTL} {
		prog = append(prog, deny(nr, unix.EPERM)...)
	}
	prog = append(prog, deny(unix.SYS_CLONE3, unix.ENOSYS)...)
	// unshare's and clone's flags are their first argument (clone's on
	// the architectures built here).
	prog = append(prog,
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(unix.SYS_UNSHARE), SkipTrue: 2},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(unix.SYS_CLONE), SkipTrue: 1},
		allow,
		bpf.LoadAbsolute{Off: seccompArg0, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: unix.CLONE_NEWUSER, SkipFalse: 1},
		errno(unix.EPERM),
		allow,
	)
	return bpf.Assemble(prog)
}

// installSeccomp puts the calling thread, and every process it forks, under
// seccompFilter. The thread must have no_new_privs set (an unprivileged
// thread may install a filter only then).
func installSeccomp() error {
	raw, err := seccompFilter()
	if err != nil {
		return fmt.Errorf("assembling the seccomp filter: %w", err)
	}
	if len(raw) == 0 {
		return errors.New("the seccomp filter is empty")
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&prog)), 0, 0); err != nil {
		return fmt.Errorf("installing the seccomp filter: %w", err)
	}
	return nil
}
