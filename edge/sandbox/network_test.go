package sandbox

import (
	"bufio"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/tests/kit/await"
)

// runIn runs a shell command in the network and returns its combined
// output and exit error.
func runIn(t *testing.T, n *Network, script string) (string, error) {
	t.Helper()
	cmd := exec.Command("/bin/bash", "-c", script)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := n.Start(cmd.Start); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	return out.String(), err
}

// answerHTTP answers every connection l accepts with body, after sending
// the connection's original destination (or its error) to dsts.
func answerHTTP(l net.Listener, body string, dsts chan<- string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			if dsts != nil {
				dst, err := OriginalDestination(c)
				if err != nil {
					dsts <- err.Error()
				} else {
					dsts <- dst.String()
				}
			}
			if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
				return
			}
			c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\nConnection: close\r\n\r\n" + body))
		}()
	}
}

func threadsOutsideHome(t *testing.T) []string {
	t.Helper()
	home, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	tasks, _ := filepath.Glob("/proc/self/task/*/ns/net")
	var away []string
	for _, p := range tasks {
		if ns, err := os.Readlink(p); err == nil && ns != home {
			away = append(away, p+" -> "+ns)
		}
	}
	return away
}

func TestServingNetworkSendsEverythingOffItsLoopbackToEdge(t *testing.T) {
	requireRoot(t)
	// A service of the host on its loopback, which the task must not reach.
	hostSvc, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostSvc.Close()
	go answerHTTP(hostSvc, "host service", nil)

	n, err := NewNetwork(NetworkConfig{Serve: true, ExplicitPort: 7071})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ls := n.Listeners
	if ls.Explicit == nil || len(ls.Transparent) == 0 || len(ls.DNSPackets) != len(ls.Transparent) || len(ls.DNSStreams) != len(ls.Transparent) {
		t.Fatalf("listeners: %+v", ls)
	}
	dsts := make(chan string, 8)
	for _, l := range ls.Transparent {
		go answerHTTP(l, "transparent", dsts)
	}
	go answerHTTP(ls.Explicit, "explicit", nil)

	out, err := runIn(t, n, `curl -sS --max-time 20 http://203.0.113.7:8080/x`)
	if err != nil || out != "transparent" {
		t.Fatalf("a connection to an address off the loopback: %v %q", err, out)
	}
	if got := await.Recv(t, "the transparent listener's original destination", dsts); got != "203.0.113.7:8080" {
		t.Fatalf("its original destination = %q", got)
	}
	if len(ls.Transparent) > 1 {
		out, err := runIn(t, n, `curl -sS --max-time 20 -g 'http://[2001:db8::7]:443/'`)
		if err != nil || out != "transparent" {
			t.Fatalf("an IPv6 connection: %v %q", err, out)
		}
		if got := await.Recv(t, "the transparent listener's original destination", dsts); got != "[2001:db8::7]:443" {
			t.Fatalf("its original destination = %q", got)
		}
	}
	out, err = runIn(t, n, `curl -sS --max-time 20 http://127.0.0.1:7071/`)
	if err != nil || out != "explicit" {
		t.Fatalf("the explicit proxy's port: %v %q", err, out)
	}
	// The host's loopback is not the task's: its service is not there.
	hostPort := hostSvc.Addr().(*net.TCPAddr).Port
	out, err = runIn(t, n, `curl -sS --max-time 20 http://127.0.0.1:`+strconv.Itoa(hostPort)+`/`)
	if err == nil || strings.Contains(out, "host service") {
		t.Fatalf("the task reached the host's loopback service: %q", out)
	}
	// The task's own loopback works: a server of its own on it.
	out, err = runIn(t, n, `python3 -m http.server --bind 127.0.0.1 8000 >/dev/null 2>&1 & pid=$!
		for i in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:8000/ && break; sleep 0.1; done
		curl -sS -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/; kill $pid`)
	if err != nil || out != "200" {
		t.Fatalf("the task's own loopback server: %v %q", err, out)
	}

	// DNS to any address reaches edge's DNS socket; other UDP is dropped.
	if _, err := runIn(t, n, `echo query > /dev/udp/8.8.8.8/53`); err != nil {
		t.Fatalf("sending a DNS query: %v", err)
	}
	ls.DNSPackets[0].SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 64)
	k, from, err := ls.DNSPackets[0].ReadFrom(buf)
	if err != nil || string(buf[:k]) != "query\n" {
		t.Fatalf("the DNS socket read %q from %v: %v", buf[:k], from, err)
	}
	out, err = runIn(t, n, `echo data > /dev/udp/203.0.113.7/9`)
	if err == nil || !strings.Contains(out, "not permitted") {
		t.Fatalf("UDP off the loopback: %v %q", err, out)
	}

	if away := threadsOutsideHome(t); len(away) > 0 {
		t.Fatalf("threads of edge left in a task's network: %v", away)
	}
}

func TestBareNetworkIsALoopbackAlone(t *testing.T) {
	requireRoot(t)
	n, err := NewNetwork(NetworkConfig{})
	if err != nil {
		t.Fatal(err)
	}
	out, err := runIn(t, n, `curl -sS --max-time 20 http://203.0.113.7/ 2>&1; echo " exit=$?"`)
	if err != nil || !strings.Contains(out, "exit=7") {
		t.Fatalf("a connection off the loopback: %v %q", err, out)
	}
	mine, _ := os.Readlink("/proc/self/ns/net")
	out, _ = runIn(t, n, `readlink /proc/self/ns/net`)
	if strings.TrimSpace(out) == mine || !strings.HasPrefix(out, "net:[") {
		t.Fatalf("the process's network is %q, edge's %q", out, mine)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("closing twice: %v", err)
	}
	if err := n.Start(func() error { return nil }); err == nil {
		t.Fatal("Start on a closed network succeeded")
	}
}

func TestNetworkRefusesPortsItOwns(t *testing.T) {
	for _, port := range []int{TransparentPort, DNSPort, -1, 70000} {
		if _, err := NewNetwork(NetworkConfig{Serve: true, ExplicitPort: port}); err == nil || !strings.Contains(err.Error(), "explicit proxy port") {
			t.Errorf("port %d: %v", port, err)
		}
	}
}

// BenchmarkNewNetwork is what a task's network adds to its start: the
// namespace, its loopback and route, the nftables ruleset (an nft run) and
// edge's sockets in it; bare is the loopback alone (a task without secrets).
func BenchmarkNewNetwork(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	for _, bc := range []struct {
		name string
		cfg  NetworkConfig
	}{{"served", NetworkConfig{Serve: true, ExplicitPort: 7071}}, {"bare", NetworkConfig{}}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				n, err := NewNetwork(bc.cfg)
				if err != nil {
					b.Fatal(err)
				}
				n.Close()
			}
		})
	}
}
