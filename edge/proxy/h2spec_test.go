package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"encoding/xml"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// h2spec is pinned by a module of its own (h2spec has no go.mod, so that
// module's go.sum pins it and its dependencies, apart from runfleet's), and
// built into the repository's git-ignored .tools beside a copy of the go.sum
// it was built from (h2specTool + ".sum"): a change of the pin rebuilds it.
const (
	h2specTool    = ".tools/h2spec"
	h2specModule  = "infra/tools/h2spec"
	h2specPackage = "github.com/summerwind/h2spec/cmd/h2spec"
)

// h2specName is the authority h2spec tests, as the task's client would name it.
const h2specName = "h2spec.example.test"

// TestH2specAgainstTheInterceptingFront runs h2spec (HTTP/2 conformance,
// every case of RFC 7540/7541 it knows) against the intercepting front, the
// way a task's HTTP/2 client meets it: through a CONNECT with a live
// attempt's credential, TLS with the CA's leaf, ALPN h2. h2spec speaks TLS
// itself, so a loopback forwarder CONNECTs for each of its connections and
// relays. h2spec's -h is both the TLS server name and, with -p, the
// :authority, so both name the CONNECT's authority, h2spec.example.test:P:
// h2spec runs in a mount namespace of its own whose /etc/hosts maps that
// name to the forwarder (127.0.0.1:P), while the proxy has it pinned to the
// upstream (127.0.0.2:P). Hence root, as the host tests.
func TestH2specAgainstTheInterceptingFront(t *testing.T) {
	edgetest.RequireRoot(t)
	tool := h2specPath(t)
	uca := edgetest.NewCA(t)
	up, fwdLn := listenPair(t)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		// Longer than the 5 bytes h2spec needs to test flow control
		// (6.9.2/3 is skipped with less).
		io.WriteString(w, "hello from the upstream behind the intercepting front\n")
	}))
	srv.Listener.Close()
	// h2spec's cases that hang up mid-request cut the proxy's dials short.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Listener = up
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{uca.Certificate(t, h2specName)}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	port := up.Addr().(*net.TCPAddr).Port
	target := h2specName + ":" + strconv.Itoa(port)

	e := newEnv(t, envOptions{uca: uca, pins: map[string]string{h2specName: "127.0.0.2"},
		keys:    fmt.Sprintf(`{"acme": {"keys": {"A": {"domains": [%q], "in": ["header"]}}}}`, target),
		secrets: map[string]string{"acme/A": realA}, quiet: true})
	proxyURL, _ := e.task("run-h2spec", runspec.Secret{ProjectID: "acme", Key: "A"})
	go forwardThrough(fwdLn, proxyURL.Host, target, proxyURL.User.Username(), password(proxyURL.User))

	report := filepath.Join(t.TempDir(), "h2spec.xml")
	start := time.Now()
	hosts := filepath.Join(t.TempDir(), "hosts")
	must(t, os.WriteFile(hosts, []byte("127.0.0.1 "+h2specName+"\n"), 0o644))
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", `mount --bind "$0" /etc/hosts && exec "$@"`,
		hosts, tool, "-t", "-k", "-h", h2specName, "-p", strconv.Itoa(port), "-o", "3", "-j", report)
	// H2SPEC_ARGS adds arguments, to chase one case: "-v http2/6.5.3".
	if extra := os.Getenv("H2SPEC_ARGS"); extra != "" {
		cmd.Args = append(cmd.Args, strings.Fields(extra)...)
	}
	out, err := cmd.CombinedOutput()
	summary := strings.TrimSpace(string(out))
	if i := strings.LastIndexByte(summary, '\n'); i >= 0 {
		summary = summary[i+1:]
	}
	t.Logf("h2spec, in %s: %s", time.Since(start).Round(time.Millisecond), summary)
	failed := junitFailures(t, report)
	if err != nil || len(failed) > 0 {
		t.Fatalf("h2spec: %v; failed cases:\n  %s\nreport:\n%s", err, strings.Join(failed, "\n  "), out)
	}
}

// h2specPath is the pinned h2spec, built first (from the Go module cache,
// else the module proxy) when .tools lacks it or holds another pin's, so
// `go test` on a fresh clone needs no step before. A build that fails fails
// the test with the command it ran, so a conformance regression can never
// pass as a skip.
func h2specPath(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	must(t, err)
	path := filepath.Join(root, h2specTool)
	pin, err := os.ReadFile(filepath.Join(root, h2specModule, "go.sum"))
	must(t, err)
	if built, err := os.ReadFile(path + ".sum"); err == nil && bytes.Equal(built, pin) {
		if _, err := os.Stat(path); err == nil {
			return path
		}
	}
	must(t, os.MkdirAll(filepath.Dir(path), 0o755))
	// Built beside its place and renamed into it, the stamp after it: a
	// test binary running at the same time never runs half a file, and at
	// worst builds it again.
	tmp := fmt.Sprintf("%s.%d.new", path, os.Getpid())
	defer os.Remove(tmp)
	cmd := exec.Command("go", "build", "-trimpath", "-o", tmp, h2specPackage)
	cmd.Dir = filepath.Join(root, h2specModule)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the pinned h2spec (cd %s && CGO_ENABLED=0 go build -trimpath -o %s %s): %v\n%s", cmd.Dir, path, h2specPackage, err, out)
	}
	must(t, os.Rename(tmp, path))
	must(t, os.WriteFile(tmp, pin, 0o644))
	must(t, os.Rename(tmp, path+".sum"))
	t.Logf("built h2spec from %s into %s in %s", h2specModule, path, time.Since(start).Round(time.Millisecond))
	return path
}

// listenPair binds 127.0.0.2:P for the upstream and 127.0.0.1:P for the
// forwarder, the same port P.
func listenPair(t *testing.T) (up, fwd net.Listener) {
	t.Helper()
	for try := 0; try < 20; try++ {
		up, err := net.Listen("tcp", "127.0.0.2:0")
		must(t, err)
		fwd, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(up.Addr().(*net.TCPAddr).Port))
		if err == nil {
			t.Cleanup(func() { fwd.Close() })
			return up, fwd
		}
		up.Close()
	}
	t.Fatal("no port free on both 127.0.0.1 and 127.0.0.2")
	return nil, nil
}

func password(u *url.Userinfo) string {
	pw, _ := u.Password()
	return pw
}

// forwardThrough CONNECTs to target through the proxy at proxyAddr for each
// connection ln accepts, and relays both ways: what a task's client does.
func forwardThrough(ln net.Listener, proxyAddr, target, user, pass string) {
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			p, err := net.Dial("tcp", proxyAddr)
			if err != nil {
				return
			}
			defer p.Close()
			fmt.Fprintf(p, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", target, target, auth)
			br := bufio.NewReader(p)
			res, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
			if err != nil || res.StatusCode != http.StatusOK {
				return
			}
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				io.Copy(p, c)
				closeWrite(p)
			}()
			io.Copy(c, br)
			closeWrite(c)
			wg.Wait()
		}()
	}
}

// junitFailures names each case of h2spec's JUnit report that did not
// pass: a skipped one too (h2spec skips a case when the server lacks what
// it tests, such as a limit on concurrent streams).
func junitFailures(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return []string{"no report: " + err.Error()}
	}
	var report struct {
		Suites []struct {
			Name  string `xml:"name,attr"`
			Cases []struct {
				Name    string    `xml:"name,attr"`
				Failure *struct{} `xml:"failure"`
				Error   *struct{} `xml:"error"`
				Skipped *struct{} `xml:"skipped"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	must(t, xml.Unmarshal(b, &report))
	var failed []string
	total := 0
	for _, s := range report.Suites {
		for _, c := range s.Cases {
			total++
			switch {
			case c.Failure != nil || c.Error != nil:
				failed = append(failed, s.Name+": "+c.Name)
			case c.Skipped != nil:
				failed = append(failed, "skipped: "+s.Name+": "+c.Name)
			}
		}
	}
	if total == 0 {
		failed = append(failed, "the report holds no case")
	}
	return failed
}
