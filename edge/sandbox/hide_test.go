package sandbox_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/sandbox"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// A hidden directory is empty in the task and the task cannot add to it:
// a service of the host's listening on a Unix socket there cannot be
// reached. What the task must still find under it is made afresh: a
// private tmpfs (/run/lock), and a file of edge's bound where the host's
// file a link leads to lay (the resolv.conf of a host whose
// /etc/resolv.conf links to its stub resolver's under /run). The host's
// directory is untouched.
func TestHiddenDirectoryHidesTheHostsSockets(t *testing.T) {
	edgetest.RequireRoot(t)
	hostRun, err := os.MkdirTemp("/run", "runfleet-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(hostRun) })
	if err := os.Chmod(hostRun, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(hostRun, "service.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := os.Chmod(sock, 0o777); err != nil {
		t.Fatal(err)
	}
	stub := filepath.Join(hostRun, "stub-resolv.conf")
	if err := os.WriteFile(stub, []byte("nameserver 10.9.9.9\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	etc := edgetest.HostDir(t)
	link := filepath.Join(etc, "resolv.conf")
	if err := os.Symlink(stub, link); err != nil {
		t.Fatal(err)
	}
	d := newRunDirs(t)
	ours := filepath.Join(d.Trust, "resolv.conf")
	if err := os.WriteFile(ours, []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := d.spec(`/usr/bin/python3 -c 'import socket, sys
try:
    socket.socket(socket.AF_UNIX).connect(sys.argv[1]); print("CONNECTED")
except OSError as e:
    print("connect:", e.strerror)' ` + sock + `
echo "run=$(stat -c '%a %U' /run) entries=$(ls -A /run | tr '\n' ' ')"
echo "lock=$(stat -c '%a' /run/lock) $(awk '$2 == "/run/lock" { print $3 }' /proc/self/mounts)"
echo "resolv=$(cat ` + link + `)"
touch /run/added 2>/dev/null && echo ADDED
echo x >> ` + link + ` 2>/dev/null && echo APPENDED
`)
	spec.Hide = []string{"/run", "/var/run"}
	spec.Files = []sandbox.Mount{{Target: link, Source: ours}}
	out := strings.ReplaceAll(run(t, spec), "\r\n", "\n")
	for _, want := range []string{
		"connect: No such file or directory\n",
		"run=755 root entries=lock " + filepath.Base(hostRun) + " \n",
		"lock=1777 tmpfs\n",
		"resolv=nameserver 127.0.0.1\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the task's output lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{"CONNECTED", "ADDED", "APPENDED"} {
		if strings.Contains(out, bad+"\n") {
			t.Errorf("the task %s:\n%s", bad, out)
		}
	}
	if b, err := os.ReadFile(stub); err != nil || string(b) != "nameserver 10.9.9.9\n" {
		t.Errorf("the host's file under /run changed: %q %v", b, err)
	}
	if ents, _ := os.ReadDir(hostRun); len(ents) != 2 {
		t.Errorf("the host's directory under /run holds %d entries, want its 2", len(ents))
	}
}
