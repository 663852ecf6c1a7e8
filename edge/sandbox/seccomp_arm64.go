package sandbox

import (
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

const auditArch = unix.AUDIT_ARCH_AARCH64

// foreignCalls: 32-bit ARM calls carry their own architecture, refused
// already.
func foreignCalls() []bpf.Instruction { return nil }
