package sandbox_test

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/internal/atomicfile"
	"github.com/runfleet/runfleet/edge/sandbox"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// debianStore is this machine's: the tests read it as the system roots.
const debianStore = "/etc/ssl/certs/ca-certificates.crt"

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeTrust writes the run's trust file as edge does (edge/runner's
// writeTrustFiles): the system roots, then the bundle, renamed in place.
func writeTrust(t *testing.T, d runDirs, systemRoots []byte, bundle ...[]byte) []byte {
	t.Helper()
	trust := append([]byte{}, systemRoots...)
	for _, b := range bundle {
		trust = append(trust, b...)
	}
	if err := atomicfile.Write(d.trustFile(), trust, 0o644); err != nil {
		t.Fatal(err)
	}
	return trust
}

func withTrust(spec sandbox.Spec, d runDirs) sandbox.Spec {
	spec.Trust = &sandbox.Trust{File: d.trustFile(), Replace: sandbox.TrustStoreFiles}
	return spec
}

// describeCerts prints, for /etc/ssl/certs, each directory's listing and
// each regular file's digest (links aside: the bundle is one in a task).
const describeCerts = `sum() { sha256sum | cut -d' ' -f1; }
for f in /etc/ssl/certs/*; do
	[ -L "$f" ] && continue
	if [ -d "$f" ]; then echo "dir:${f##*/}=$(ls -A "$f" | sum)"; elif [ -f "$f" ]; then echo "file:${f##*/}=$(sum < "$f")"; fi
done
echo "names=$(ls -A /etc/ssl/certs | sum)"
`

func hostShell(t *testing.T, script string) string {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = []string{"PATH=" + taskPath, "LANG=C.UTF-8"}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	return string(out)
}

// Inside a task, the system trust store is the task's trust file: the
// Debian bundle and OpenSSL's cert.pem read as it, and go on reading as
// it when edge renames a new one in (the CA's successor) while the task
// runs. Everything else in /etc/ssl/certs is as on the host (OpenSSL's
// hash links resolve, java/cacerts is there); the task can change nothing
// there, and the host's files are untouched.
func TestTrustStoreReadsTheLiveTrustFile(t *testing.T) {
	hostStore := readFile(t, debianStore)
	hostDescribed := hostShell(t, describeCerts)
	d := newRunDirs(t)
	first := writeTrust(t, d, hostStore, edgetest.NewCA(t).PEM)
	tk := startTask(t, withTrust(d.spec(describeCerts+`
echo "store=$(sum < /etc/ssl/certs/ca-certificates.crt)"
echo "openssl-default=$(sum < /usr/lib/ssl/cert.pem)"
h=$(ls /etc/ssl/certs/*.0 | head -n 1)
openssl verify -no-CAfile -CApath /etc/ssl/certs "$h" >/dev/null && echo HASH-LINK-VERIFIES
awk '$2 == "/etc/ssl/certs" { print "mount=" $4 }' /proc/self/mounts
echo x > /etc/ssl/certs/added.pem 2>/dev/null && echo ADDED
echo x >> /etc/ssl/certs/ca-certificates.crt 2>/dev/null && echo APPENDED
rm -f /etc/ssl/certs/ca-certificates.crt 2>/dev/null && echo REMOVED
echo x > "$(readlink -f /etc/ssl/certs/ca-certificates.crt)" 2>/dev/null && echo WROTE-THE-TRUST-FILE
echo ready; read line
echo "again=$(sum < /etc/ssl/certs/ca-certificates.crt)"
`), d))
	out := tk.waitOutput("ready")
	for _, want := range []string{"store=" + sum(first), "openssl-default=" + sum(first), "HASH-LINK-VERIFIES"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("the task's output lacks %q: %s", want, out)
		}
	}
	// The bundle is a regular file on the host and a link in the task:
	// every other entry describes the same.
	var wantDescribed []string
	for _, line := range strings.Split(hostDescribed, "\n") {
		if line != "" && !strings.HasPrefix(line, "file:ca-certificates.crt=") {
			wantDescribed = append(wantDescribed, line)
		}
	}
	if !strings.Contains(out, strings.Join(wantDescribed, "\n")+"\n") {
		t.Errorf("/etc/ssl/certs in the task differs from the host's:\nhost:\n%s\ntask:\n%s", hostDescribed, out)
	}
	if !strings.Contains(out, "mount=ro,nosuid,nodev") {
		t.Errorf("the task's /etc/ssl/certs is not mounted read-only, nosuid, nodev: %s", out)
	}
	for _, bad := range []string{"ADDED", "APPENDED", "REMOVED", "WROTE-THE-TRUST-FILE"} {
		if strings.Contains(out, bad+"\n") {
			t.Errorf("the task changed its trust store (%s): %s", bad, out)
		}
	}

	// Edge renames in the trust file of a two-certificate bundle.
	second := writeTrust(t, d, hostStore, edgetest.NewCA(t).PEM, edgetest.NewCA(t).PEM)
	tk.input("go")
	if out := tk.waitOutput("again="); !strings.Contains(out, "again="+sum(second)+"\n") {
		t.Errorf("after edge replaced the trust file, the task read %s, want %s", out[strings.LastIndex(out, "again="):], sum(second))
	}
	tk.wait()

	if sum(readFile(t, debianStore)) != sum(hostStore) || hostShell(t, describeCerts) != hostDescribed {
		t.Fatal("the host's /etc/ssl/certs changed")
	}
}

// Clients that read only the system trust store (wget's GnuTLS, OpenSSL,
// Python's default context, Go's default roots), with no CA variable
// set, verify a server whose CA only the trust file holds; on the host's
// store alone, none does.
func TestClientsVerifyWithTheTrustFileAsTheSystemStore(t *testing.T) {
	ca := edgetest.NewCA(t)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello-over-tls")
	}))
	// The handshakes refused on the host's store are expected.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Certificate(t, "127.0.0.1")}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	// Outside /tmp, which a task has its own of.
	dir := edgetest.HostDir(t)
	goClient := filepath.Join(dir, "go-client")
	if err := os.WriteFile(goClient, readFile(t, os.Args[0]), 0o755); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`wget --no-hsts -q -O - %[1]s/; echo " wget=$?"
/usr/bin/python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' %[1]s/ 2>/dev/null; echo " python=$?"
openssl s_client -connect %[2]s -verify_return_error -verify_ip 127.0.0.1 </dev/null >/dev/null 2>&1; echo " openssl=$?"
%[3]s %[4]s %[1]s/; echo " go=$?"
`, srv.URL, srv.Listener.Addr(), goClient, goClientArg)
	clients := []string{"wget", "python", "openssl", "go"}
	d := newRunDirs(t)
	writeTrust(t, d, readFile(t, debianStore), ca.PEM)

	out := run(t, d.spec(script))
	for _, c := range clients {
		if strings.Contains(out, " "+c+"=0\n") {
			t.Errorf("%s verified the server with the host's store alone: %s", c, out)
		}
	}
	if strings.Contains(out, "hello-over-tls") {
		t.Fatalf("a client verified the server with the host's store alone: %s", out)
	}

	out = run(t, withTrust(d.spec(script), d))
	for _, c := range clients {
		if !strings.Contains(out, " "+c+"=0\n") {
			t.Errorf("%s failed with the trust file as the system store: %s", c, out)
		}
	}
	if n := strings.Count(out, "hello-over-tls"); n != 3 {
		t.Errorf("wget, python and go got the answer %d times in all, want 3: %s", n, out)
	}
}

// What a task's start costs (the init's setup to the agent's exit), with
// and without its trust store rebuilt.
func BenchmarkTaskStart(b *testing.B) {
	d := newRunDirs(b)
	hostStore, err := os.ReadFile(debianStore)
	if err != nil {
		b.Fatal(err)
	}
	if err := atomicfile.Write(d.trustFile(), hostStore, 0o644); err != nil {
		b.Fatal(err)
	}
	for name, spec := range map[string]sandbox.Spec{"host store": d.spec("true"), "trust file": withTrust(d.spec("true"), d)} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				startTask(b, spec).wait()
			}
		})
	}
}
