package sandbox_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/sandbox"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// edgeKnownHosts is the content of edge's ssh_known_hosts in these tests.
const edgeKnownHosts = "[edge.test]:22 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEdgeTestKeyEdgeTestKeyEdgeTestKey\n"

// makeSSHDir makes a directory standing for the host's /etc/ssh (outside
// /tmp, so the task sees it at its own path): a config file, a drop-in
// directory with a file, a private key only root reads, a relative link
// to the config and a dangling absolute link, all root's.
func makeSSHDir(t *testing.T) string {
	t.Helper()
	dir := edgetest.HostDir(t)
	for _, f := range []struct {
		name, content string
		mode          os.FileMode
	}{
		{"ssh_config", "Host *\n    SendEnv LANG LC_*\n", 0o644},
		{"ssh_host_ed25519_key", "PRIVATE\n", 0o600},
	} {
		if err := os.WriteFile(filepath.Join(dir, f.name), []byte(f.content), f.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "ssh_config.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ssh_config.d", "10-local.conf"), []byte("Compression yes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("ssh_config", filepath.Join(dir, "ssh_config.link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/nonexistent/known_hosts", filepath.Join(dir, "ssh_known_hosts2")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// edgeFile writes a file of edge's in the run's trust dir (edge's own,
// which the task reaches but cannot write), world-writable: only the
// read-only mount keeps the task from writing it.
func edgeFile(t *testing.T, d runDirs, name, content string) string {
	t.Helper()
	path := filepath.Join(d.Trust, name)
	if err := os.WriteFile(path, []byte(content), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	return path
}

// describeDir prints what a directory holds: for each entry its name,
// kind, mode, owner, group and size (times aside), each link's target,
// and then the directory's own mode and owner, between markers.
func describeDir(dir string) string {
	return `echo "<<<"
cd ` + dir + ` && for f in $(ls -A); do
	stat -c '%n|%F|%a|%u|%g|%s' "$f"
	[ -L "$f" ] && echo "$f -> $(readlink "$f")"
done
stat -c 'dir|%a|%u|%g' .
cd /
echo ">>>"
`
}

// between is what out holds between the first "<<<\n" and the ">>>\n"
// after it.
func between(t *testing.T, out string) string {
	t.Helper()
	_, rest, ok := strings.Cut(out, "<<<\n")
	if !ok {
		t.Fatalf("no description in the output:\n%s", out)
	}
	desc, _, ok := strings.Cut(rest, ">>>\n")
	if !ok {
		t.Fatalf("the description does not end:\n%s", out)
	}
	return desc
}

// hostMountsUnder lists the host's mounts at or under dir.
func hostMountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	var under []string
	for _, line := range strings.Split(string(readFile(t, "/proc/self/mounts")), "\n") {
		if f := strings.Fields(line); len(f) > 1 && (f[1] == dir || strings.HasPrefix(f[1], dir+"/")) {
			under = append(under, line)
		}
	}
	return under
}

// writeAttempts tries, as the task, to change file and to add to dir,
// printing what each attempt's error was, or WROTE.
func writeAttempts(dir, file string) string {
	return `try() { name=$1; shift; if err=$("$@" 2>&1); then echo "$name: WROTE"; else echo "$name: $err"; fi; }
try append sh -c 'echo x >> ` + file + `'
try truncate sh -c ': > ` + file + `'
try remove rm -f ` + file + `
try rename mv ` + file + ` ` + dir + `/moved
try create touch ` + dir + `/added
try mkdir mkdir ` + dir + `/added.d
try link ln -s /etc/passwd ` + dir + `/added.link
`
}

// Where the host has no ssh_known_hosts but has its directory, a Make
// file is made there for the task: the directory is rebuilt read-only,
// holding edge's file, read-only, and every entry of the host's as it
// was (files, with their owners and modes, the drop-in directory, links
// as they point); the task changes nothing there, and the host's
// directory neither gets the file nor changes, nor keeps a mount.
func TestFilesMakeAddsTheFileToARebuiltDirectory(t *testing.T) {
	dir := makeSSHDir(t)
	target := filepath.Join(dir, "ssh_known_hosts")
	hostDescribed := between(t, hostShell(t, describeDir(dir)))
	d := newRunDirs(t)
	ours := edgeFile(t, d, "ssh_known_hosts", edgeKnownHosts)

	spec := d.spec(describeDir(dir) + `
echo "known=$(cat ` + target + `)"
echo "known-mode=$(stat -c '%F %a %u' ` + target + `)"
echo "config=$(cat ` + dir + `/ssh_config.link | tr '\n' ' ')"
echo "dropin=$(ls -A ` + dir + `/ssh_config.d) $(cat ` + dir + `/ssh_config.d/10-local.conf)"
cat ` + dir + `/ssh_host_ed25519_key >/dev/null 2>&1 && echo READ-THE-KEY
awk '$2 == "` + dir + `" { print "dir-mount=" $3 " " $4 } $2 == "` + target + `" { print "file-mount=" $4 }' /proc/self/mounts
` + writeAttempts(dir, target) + `
echo "after=$(cat ` + target + `)"
`)
	spec.Files = []sandbox.Mount{{Target: target, Source: ours, Make: true}}
	out := run(t, spec)

	for _, want := range []string{
		"known=" + strings.TrimSuffix(edgeKnownHosts, "\n") + "\n",
		"known-mode=regular file 666 0\n",
		"config=Host *     SendEnv LANG LC_* \n",
		"dropin=10-local.conf Compression yes\n",
		"dir-mount=tmpfs ro,nosuid,nodev",
		"file-mount=ro,nosuid,nodev",
		"after=" + strings.TrimSuffix(edgeKnownHosts, "\n") + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the task's output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "READ-THE-KEY") {
		t.Errorf("the task read the host's root-only key through the rebuilt directory:\n%s", out)
	}
	// The task's directory is the host's plus the file, the file's line
	// aside (the host has none).
	var taskLines []string
	for _, line := range strings.Split(between(t, out), "\n") {
		if !strings.HasPrefix(line, "ssh_known_hosts|") {
			taskLines = append(taskLines, line)
		}
	}
	if got := strings.Join(taskLines, "\n"); got != hostDescribed {
		t.Errorf("the directory in the task differs from the host's:\nhost:\n%s\ntask:\n%s", hostDescribed, got)
	}
	if !strings.Contains(between(t, out), "ssh_known_hosts|regular file|666|0|0|") {
		t.Errorf("the task's directory does not list the made file:\n%s", between(t, out))
	}
	checkNothingWritten(t, out)

	if hostShell(t, describeDir(dir)) != "<<<\n"+hostDescribed+">>>\n" {
		t.Errorf("the host's directory changed:\nbefore:\n%s\nafter:\n%s", hostDescribed, hostShell(t, describeDir(dir)))
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Errorf("the host got %s: %v", target, err)
	}
	if b := readFile(t, ours); string(b) != edgeKnownHosts {
		t.Errorf("edge's file changed: %q", b)
	}
	if m := hostMountsUnder(t, dir); len(m) > 0 {
		t.Errorf("the task's mounts reached the host: %q", m)
	}
}

// checkNothingWritten checks writeAttempts' output: every attempt failed,
// on the read-only file system (not for want of permission: edge's file
// is world-writable, and the directory's permission is checked after).
func checkNothingWritten(t *testing.T, out string) {
	t.Helper()
	for _, name := range []string{"append", "truncate", "remove", "rename", "create", "mkdir", "link"} {
		line := name + ": "
		i := strings.Index(out, "\n"+line)
		if i < 0 {
			t.Errorf("the task did not report its %s attempt:\n%s", name, out)
			continue
		}
		result, _, _ := strings.Cut(out[i+1+len(line):], "\n")
		switch {
		case result == "WROTE":
			t.Errorf("the task's %s attempt succeeded:\n%s", name, out)
		case !strings.Contains(result, "Read-only file system"):
			t.Errorf("the task's %s attempt failed other than on a read-only file system: %s", name, result)
		}
	}
}

// Where the host has the file, Make or not, edge's is mounted over it
// read-only, as before Make: the directory is not rebuilt, and the host's
// file is unchanged.
func TestFilesReplaceTheHostsFileReadOnly(t *testing.T) {
	for _, mk := range []bool{false, true} {
		name := "without Make"
		if mk {
			name = "with Make"
		}
		t.Run(name, func(t *testing.T) {
			dir := makeSSHDir(t)
			target := filepath.Join(dir, "ssh_known_hosts")
			const hosts = "github.com ssh-ed25519 AAAAhostsown\n"
			if err := os.WriteFile(target, []byte(hosts), 0o644); err != nil {
				t.Fatal(err)
			}
			hostDescribed := hostShell(t, describeDir(dir))
			d := newRunDirs(t)
			ours := edgeFile(t, d, "ssh_known_hosts", edgeKnownHosts)
			spec := d.spec(`echo "known=$(cat ` + target + `)"
echo "names=$(ls -A ` + dir + ` | tr '\n' ' ')"
awk '$2 == "` + dir + `" { print "DIR-MOUNTED" } $2 == "` + target + `" { print "file-mount=" $4 }' /proc/self/mounts
try() { name=$1; shift; if err=$("$@" 2>&1); then echo "$name: WROTE"; else echo "$name: $err"; fi; }
try append sh -c 'echo x >> ` + target + `'
try truncate sh -c ': > ` + target + `'
`)
			spec.Files = []sandbox.Mount{{Target: target, Source: ours, Make: mk}}
			out := run(t, spec)
			for _, want := range []string{
				"known=" + strings.TrimSuffix(edgeKnownHosts, "\n") + "\n",
				"names=ssh_config ssh_config.d ssh_config.link ssh_host_ed25519_key ssh_known_hosts ssh_known_hosts2 \n",
				"file-mount=ro,nosuid,nodev",
				"append: sh: 1: cannot create " + target + ": Read-only file system\n",
				"truncate: sh: 1: cannot create " + target + ": Read-only file system\n",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("the task's output lacks %q:\n%s", want, out)
				}
			}
			if strings.Contains(out, "DIR-MOUNTED") {
				t.Errorf("the directory was rebuilt though the host has the file:\n%s", out)
			}
			if b := readFile(t, target); string(b) != hosts {
				t.Errorf("the host's file changed: %q", b)
			}
			if got := hostShell(t, describeDir(dir)); got != hostDescribed {
				t.Errorf("the host's directory changed:\nbefore:\n%s\nafter:\n%s", hostDescribed, got)
			}
		})
	}
}

// A Make file whose directory the host lacks too is left out: the task
// starts, without it, and nothing is made on the host.
func TestFilesMakeWithoutTheDirectoryIsSkipped(t *testing.T) {
	base := edgetest.HostDir(t)
	dir := filepath.Join(base, "ssh")
	target := filepath.Join(dir, "ssh_known_hosts")
	d := newRunDirs(t)
	ours := edgeFile(t, d, "ssh_known_hosts", edgeKnownHosts)
	spec := d.spec(`echo started
[ -e ` + dir + ` ] && echo DIR-THERE
[ -e ` + target + ` ] && echo FILE-THERE
echo "entries=$(ls -A ` + base + ` | wc -l)"
`)
	spec.Files = []sandbox.Mount{{Target: target, Source: ours, Make: true}}
	out := run(t, spec)
	if !strings.Contains(out, "started\n") || !strings.Contains(out, "entries=0\n") {
		t.Errorf("the task did not start, or found something made:\n%s", out)
	}
	for _, bad := range []string{"DIR-THERE", "FILE-THERE"} {
		if strings.Contains(out, bad) {
			t.Errorf("the task found %s:\n%s", bad, out)
		}
	}
	if ents, err := os.ReadDir(base); err != nil || len(ents) != 0 {
		t.Errorf("the host's directory got %v (%v)", ents, err)
	}
}

// Without Make, a file the host lacks is not made, though its directory
// is there: the directory stays the host's, not rebuilt.
func TestFilesWithoutMakeMakeNothing(t *testing.T) {
	dir := makeSSHDir(t)
	target := filepath.Join(dir, "ssh_known_hosts")
	hostDescribed := between(t, hostShell(t, describeDir(dir)))
	d := newRunDirs(t)
	ours := edgeFile(t, d, "ssh_known_hosts", edgeKnownHosts)
	spec := d.spec(describeDir(dir) + `
[ -e ` + target + ` ] && echo FILE-THERE
awk '$2 == "` + dir + `" || $2 == "` + target + `" { print "MOUNTED " $2 }' /proc/self/mounts
echo done
`)
	spec.Files = []sandbox.Mount{{Target: target, Source: ours}}
	out := run(t, spec)
	if !strings.Contains(out, "done\n") {
		t.Fatalf("the task did not run through:\n%s", out)
	}
	for _, bad := range []string{"FILE-THERE", "MOUNTED"} {
		if strings.Contains(out, bad) {
			t.Errorf("without Make, the task found %s:\n%s", bad, out)
		}
	}
	if got := between(t, out); got != hostDescribed {
		t.Errorf("the directory in the task differs from the host's:\nhost:\n%s\ntask:\n%s", hostDescribed, got)
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Errorf("the host got %s: %v", target, err)
	}
}

// A Make file and the trust store rebuilt in one spec (a task with ssh
// keys behind edge's proxy): the trust store reads as the trust file,
// and edge's file is made, both in a directory of its own and in the
// trust store's directory itself, rebuilt once for the trust store and
// again for the file.
func TestFilesMakeWithTheTrustStore(t *testing.T) {
	hostStore := readFile(t, debianStore)
	hostCerts := hostShell(t, describeCerts)
	dir := makeSSHDir(t)
	target := filepath.Join(dir, "ssh_known_hosts")
	// /etc/ssl/certs has no such file on this host or any.
	certsTarget := "/etc/ssl/certs/runfleet-test-known-hosts"
	if _, err := os.Lstat(certsTarget); !os.IsNotExist(err) {
		t.Fatalf("%s is there on the host: %v", certsTarget, err)
	}
	d := newRunDirs(t)
	trust := writeTrust(t, d, hostStore, edgetest.NewCA(t).PEM)
	ours := edgeFile(t, d, "ssh_known_hosts", edgeKnownHosts)
	certsOurs := edgeFile(t, d, "certs-known-hosts", "certs "+edgeKnownHosts)

	spec := withTrust(d.spec(describeCerts+`
echo "store=$(sum < /etc/ssl/certs/ca-certificates.crt)"
h=$(ls /etc/ssl/certs/*.0 | head -n 1)
openssl verify -no-CAfile -CApath /etc/ssl/certs "$h" >/dev/null && echo HASH-LINK-VERIFIES
echo "known=$(cat `+target+`)"
echo "certs-known=$(cat `+certsTarget+`)"
echo "config=$(cat `+dir+`/ssh_config.link | tr '\n' ' ')"
`+writeAttempts(dir, target)), d)
	spec.Files = []sandbox.Mount{
		{Target: target, Source: ours, Make: true},
		{Target: certsTarget, Source: certsOurs, Make: true},
	}
	out := run(t, spec)
	for _, want := range []string{
		"store=" + sum(trust) + "\n",
		"HASH-LINK-VERIFIES\n",
		"known=" + strings.TrimSuffix(edgeKnownHosts, "\n") + "\n",
		"certs-known=certs " + strings.TrimSuffix(edgeKnownHosts, "\n") + "\n",
		"config=Host *     SendEnv LANG LC_* \n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the task's output lacks %q:\n%s", want, out)
		}
	}
	// /etc/ssl/certs reads as on the host, the bundle (a link in the task)
	// and the made file aside.
	certs := func(described string) string {
		var lines []string
		for _, line := range strings.Split(described, "\n") {
			if (strings.HasPrefix(line, "file:") || strings.HasPrefix(line, "dir:")) &&
				!strings.HasPrefix(line, "file:ca-certificates.crt=") && !strings.HasPrefix(line, "file:"+filepath.Base(certsTarget)+"=") {
				lines = append(lines, line)
			}
		}
		return strings.Join(lines, "\n")
	}
	if certs(out) != certs(hostCerts) {
		t.Errorf("/etc/ssl/certs in the task differs from the host's:\nhost:\n%s\ntask:\n%s", hostCerts, out)
	}
	if !strings.Contains(out, "file:"+filepath.Base(certsTarget)+"="+sum([]byte("certs "+edgeKnownHosts))+"\n") {
		t.Errorf("/etc/ssl/certs in the task does not list the made file:\n%s", out)
	}
	checkNothingWritten(t, out)

	if sum(readFile(t, debianStore)) != sum(hostStore) || hostShell(t, describeCerts) != hostCerts {
		t.Error("the host's /etc/ssl/certs changed")
	}
	for _, p := range []string{target, certsTarget} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("the host got %s: %v", p, err)
		}
	}
}

// Where the Target's directory is a link (an /etc/ssh linking elsewhere),
// the directory it leads to is rebuilt, and the file read at the Target.
func TestFilesMakeThroughALinkedDirectory(t *testing.T) {
	dir := makeSSHDir(t)
	base := edgetest.HostDir(t)
	linked := filepath.Join(base, "ssh")
	if err := os.Symlink(dir, linked); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(linked, "ssh_known_hosts")
	d := newRunDirs(t)
	ours := edgeFile(t, d, "ssh_known_hosts", edgeKnownHosts)
	spec := d.spec(`echo "known=$(cat ` + target + `)"
echo "real=$(cat ` + dir + `/ssh_known_hosts)"
echo "config=$(cat ` + linked + `/ssh_config | tr '\n' ' ')"
[ -L ` + linked + ` ] && echo STILL-A-LINK
`)
	spec.Files = []sandbox.Mount{{Target: target, Source: ours, Make: true}}
	out := run(t, spec)
	for _, want := range []string{
		"known=" + strings.TrimSuffix(edgeKnownHosts, "\n") + "\n",
		"real=" + strings.TrimSuffix(edgeKnownHosts, "\n") + "\n",
		"config=Host *     SendEnv LANG LC_* \n",
		"STILL-A-LINK\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the task's output lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "ssh_known_hosts")); !os.IsNotExist(err) {
		t.Errorf("the host got the file: %v", err)
	}
}

// Two files of edge's in one directory: one the host has (bound over
// first), one it lacks (made, the directory rebuilt after, binding the
// first back), and two it lacks (the directory rebuilt twice). Each reads
// as edge's and stays read-only.
func TestFilesMakeTwoInOneDirectory(t *testing.T) {
	for _, tc := range []struct {
		name      string
		hostHasA  bool
		makeFirst bool
	}{
		{"the host's file, then a made one", true, false},
		{"a made file, then the host's", true, true},
		{"two made files", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := makeSSHDir(t)
			a, b := filepath.Join(dir, "a_known_hosts"), filepath.Join(dir, "ssh_known_hosts")
			if tc.hostHasA {
				if err := os.WriteFile(a, []byte("host's a\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			d := newRunDirs(t)
			oursA := edgeFile(t, d, "a", "edge's a\n")
			oursB := edgeFile(t, d, "b", "edge's b\n")
			spec := d.spec(`echo "a=$(cat ` + a + `)"
echo "b=$(cat ` + b + `)"
try() { name=$1; shift; if err=$("$@" 2>&1); then echo "$name: WROTE"; else echo "$name: $err"; fi; }
try append-a sh -c 'echo x >> ` + a + `'
try append-b sh -c 'echo x >> ` + b + `'
`)
			spec.Files = []sandbox.Mount{{Target: a, Source: oursA, Make: true}, {Target: b, Source: oursB, Make: true}}
			if tc.makeFirst {
				spec.Files[0], spec.Files[1] = spec.Files[1], spec.Files[0]
			}
			out := run(t, spec)
			for _, want := range []string{
				"a=edge's a\n", "b=edge's b\n",
				"append-a: sh: 1: cannot create " + a + ": Read-only file system\n",
				"append-b: sh: 1: cannot create " + b + ": Read-only file system\n",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("the task's output lacks %q:\n%s", want, out)
				}
			}
			for path, want := range map[string]string{oursA: "edge's a\n", oursB: "edge's b\n"} {
				if got := string(readFile(t, path)); got != want {
					t.Errorf("edge's %s changed: %q", path, got)
				}
			}
			if _, err := os.Lstat(b); !os.IsNotExist(err) {
				t.Errorf("the host got %s: %v", b, err)
			}
		})
	}
}

// A host whose ssh_known_hosts is a dangling link has no such file: with
// Make the task still starts, reading edge's file there.
func TestFilesMakeOverADanglingLink(t *testing.T) {
	dir := makeSSHDir(t)
	target := filepath.Join(dir, "ssh_known_hosts")
	if err := os.Symlink("/nonexistent/ssh_known_hosts", target); err != nil {
		t.Fatal(err)
	}
	d := newRunDirs(t)
	ours := edgeFile(t, d, "ssh_known_hosts", edgeKnownHosts)
	spec := d.spec(`echo "known=$(cat ` + target + `)"`)
	spec.Files = []sandbox.Mount{{Target: target, Source: ours, Make: true}}
	out := run(t, spec)
	if !strings.Contains(out, "known="+strings.TrimSuffix(edgeKnownHosts, "\n")+"\n") {
		t.Errorf("the task's output lacks edge's file:\n%s", out)
	}
	if l, err := os.Readlink(target); err != nil || l != "/nonexistent/ssh_known_hosts" {
		t.Errorf("the host's link changed: %q %v", l, err)
	}
}
