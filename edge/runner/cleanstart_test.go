package runner

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A task starts with the terminal on descriptors 0-2 and nothing else,
// though the process that runs the runner holds a descriptor without
// close-on-exec (as one edge's parent passed down would be), which every
// process it starts inherits, the task's init included.
func TestTaskInheritsDescriptors0To2Alone(t *testing.T) {
	h := newHarness(t, nil)
	stray, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer stray.Close()
	if _, err := unix.FcntlInt(stray.Fd(), unix.F_SETFD, 0); err != nil {
		t.Fatal(err)
	}
	// ls, a child, lists the shell's descriptors while the shell waits.
	run := h.start(`ls -m /proc/$$/fd; true`, nil)
	h.waitEnd(run.RunID)
	if out := strings.TrimSpace(h.output(run.RunID)); out != "0, 1, 2" {
		t.Fatalf("the task's descriptors: %q, want 0, 1, 2 (the stray one is %d)", out, stray.Fd())
	}
}

// /run/lock is world-writable and shared on the host: a task gets an
// empty one of its own, where what it leaves reaches neither the host nor
// another task.
func TestRunLockIsPrivateToEachTask(t *testing.T) {
	h := newHarness(t, nil)
	name := fmt.Sprintf("runfleet-test-%x", rand.Uint64())
	a := h.start(fmt.Sprintf(`stat -c 'mode=%%a' /run/lock; echo a > /run/lock/%s && echo made; exec sleep 1001`, name), nil)
	if out := h.waitOutput(a.RunID, "made"); !strings.Contains(out, "mode=1777") {
		t.Errorf("the task's /run/lock: %q, want mode 1777", out)
	}
	if _, err := os.Lstat(filepath.Join("/run/lock", name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the task's /run/lock/%s is on the host: %v", name, err)
	}
	b := h.start(fmt.Sprintf(`[ -e /run/lock/%s ] && echo SEEN || echo UNSEEN; echo "entries=$(ls -A /run/lock | wc -l)"`, name), nil)
	h.waitEnd(b.RunID)
	if out := h.output(b.RunID); !strings.Contains(out, "UNSEEN") || !strings.Contains(out, "entries=0") {
		t.Errorf("another task's /run/lock: %q, want it empty", out)
	}
	if _, err := h.r.Cancel(a.RunID); err != nil {
		t.Fatal(err)
	}
	h.waitEnd(a.RunID)
}

// ipcObjects creates ("create"), looks up ("look") or removes ("remove")
// the System V shared memory segment and message queue of key argv[1] and
// the POSIX message queue named for it, printing whether each is there.
const ipcObjects = `
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
key, mode = int(sys.argv[1], 16), sys.argv[2]
flags = 0o1000 | 0o644 if mode == "create" else 0  # IPC_CREAT
name = b"/runfleet-" + sys.argv[1].encode()
for kind, call in (("shm", lambda: libc.shmget(key, 4096, flags)), ("msg", lambda: libc.msgget(key, flags)),
                   ("mq", lambda: libc.mq_open(name, (os.O_CREAT | os.O_RDWR) if mode == "create" else os.O_RDONLY, 0o644, None))):
    found = call()
    if found >= 0:
        print(kind + "=there")
        if mode == "remove":
            {"shm": lambda: libc.shmctl(found, 0, None), "msg": lambda: libc.msgctl(found, 0, None), "mq": lambda: libc.mq_unlink(name)}[kind]()  # IPC_RMID
    elif ctypes.get_errno() == errno.ENOENT:
        print(kind + "=absent")
    else:
        print(kind + "=" + os.strerror(ctypes.get_errno()))
`

// System V IPC objects and POSIX message queues exist in the IPC
// namespace they were made in alone: another task finds none of a task's,
// nor the host's, and the host none of a task's. Where the host mounts
// the message queues on /dev/mqueue, a task's shows its own.
func TestIPCObjectsArePrivateToEachTask(t *testing.T) {
	h := newHarness(t, nil)
	ipc := func(key, mode string) string {
		return fmt.Sprintf("/usr/bin/python3 -c '%s' %s %s", ipcObjects, key, mode)
	}
	onHost := func(key, mode string) string {
		out, err := exec.Command("/usr/bin/python3", "-c", ipcObjects, key, mode).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v", out, err)
		}
		return string(out)
	}
	const there, absent = "shm=there\nmsg=there\nmq=there\n", "shm=absent\nmsg=absent\nmq=absent\n"
	taskKey, hostKey := fmt.Sprintf("%08x", rand.Uint32()|0x10000000), fmt.Sprintf("%08x", rand.Uint32()|0x10000000)
	if out := onHost(hostKey, "create"); out != there {
		t.Fatalf("the host's IPC objects: %q", out)
	}
	t.Cleanup(func() { onHost(hostKey, "remove") })

	a := h.start(ipc(taskKey, "create")+"; echo made; exec sleep 1001", nil)
	if out := strings.ReplaceAll(h.waitOutput(a.RunID, "made"), "\r\n", "\n"); !strings.Contains(out, there) {
		t.Fatalf("the task could not create its IPC objects: %q", out)
	}
	b := h.start(ipc(taskKey, "look")+"; "+ipc(hostKey, "look")+`; [ -d /dev/mqueue ] && echo "mqueue=$(ls -A /dev/mqueue | wc -l)"`, nil)
	h.waitEnd(b.RunID)
	out := strings.ReplaceAll(h.output(b.RunID), "\r\n", "\n")
	if !strings.HasPrefix(out, absent+absent) {
		t.Errorf("another task found the task's or the host's IPC objects: %q", out)
	}
	if strings.Contains(out, "mqueue=") && !strings.Contains(out, "mqueue=0\n") {
		t.Errorf("another task's /dev/mqueue lists queues: %q", out)
	}
	if out := onHost(taskKey, "look"); out != absent {
		t.Errorf("the host found the task's IPC objects: %q", out)
	}
	if _, err := h.r.Cancel(a.RunID); err != nil {
		t.Fatal(err)
	}
	h.waitEnd(a.RunID)
}

// Tasks share runner.user's uid, so the kernel's user keyrings would be a
// store one task writes and another reads: a task's key management calls
// fail EPERM, as does a new user namespace (clone3, whose flags cannot be
// read, fails ENOSYS so libc falls back to clone). A PID namespace needs a
// capability the task lacks anyway; the task otherwise runs as before.
func TestTaskCannotUseKeyringsOrUserNamespaces(t *testing.T) {
	h := newHarness(t, nil)
	prompt := fmt.Sprintf(`python3 - <<'PY'
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    r = libc.syscall(*args)
    print(name, 'ok' if r >= 0 else errno.errorcode[ctypes.get_errno()])
call('add_key', %d, b'user', b'k', b'v', 1, -4)
call('keyctl', %d, 0, -4, 0)
call('clone3', %d, 0, 0)
PY
unshare -U true 2>/dev/null && echo 'userns ok' || echo 'userns refused'
unshare -Ur true 2>/dev/null && echo 'userns-root ok' || echo 'userns-root refused'
echo still-runs`, unix.SYS_ADD_KEY, unix.SYS_KEYCTL, unix.SYS_CLONE3)
	run := h.start(prompt, nil)
	h.waitEnd(run.RunID)
	out := h.output(run.RunID)
	for _, want := range []string{"add_key EPERM", "keyctl EPERM", "clone3 ENOSYS", "userns refused", "userns-root refused", "still-runs"} {
		if !strings.Contains(out, want) {
			t.Errorf("the task's output lacks %q:\n%s", want, out)
		}
	}
}
