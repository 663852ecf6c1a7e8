// Command tlsrelay is the floor of any intercepting HTTPS proxy: a CONNECT
// relay that terminates the client's TLS with a leaf of its own CA, opens TLS
// to the upstream, and copies the bytes between the two, doing no other work.
// No HTTP is parsed and nothing is substituted, so a client must send the
// real secret itself. infra/bench/proxy-table.sh runs it beside edge's
// secrets proxy: what edge costs above it is the cost of its own work.
//
//	tlsrelay -addr 127.0.0.1:0 -addr-file F -ca-out CA.pem -upstream-ca UP.pem -resolve api.example.test=127.0.0.1
//
// It is bench code: it only listens on and dials loopback addresses (every
// dial is pinned by -resolve or refused), and it ignores proxy
// authentication.
package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

// handshakeTimeout bounds the CONNECT request and both TLS handshakes, so a
// stalled client or upstream never holds a goroutine for good.
const handshakeTimeout = 10 * time.Second

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "loopback listen address")
	addrFile := flag.String("addr-file", "", "write the bound address here once listening")
	caOut := flag.String("ca-out", "", "write the relay's generated CA (PEM) here")
	upstreamCA := flag.String("upstream-ca", "", "CA file that signs the upstream's certificate")
	resolve := flag.String("resolve", "", "name=loopback-ip pins for upstream dials (comma-separated)")
	flag.Parse()
	if err := run(*addr, *addrFile, *caOut, *upstreamCA, *resolve); err != nil {
		fmt.Fprintf(os.Stderr, "tlsrelay: %v\n", err)
		os.Exit(1)
	}
}

func run(addr, addrFile, caOut, upstreamCA, resolve string) error {
	if caOut == "" || upstreamCA == "" {
		return errors.New("-ca-out and -upstream-ca are required")
	}
	pins, err := parseResolve(resolve)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(upstreamCA)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(b) {
		return fmt.Errorf("%s: no PEM certificate", upstreamCA)
	}
	r, err := newRelay(roots, pins)
	if err != nil {
		return err
	}
	if err := writeCertPEM(caOut, r.ca.Raw); err != nil {
		return err
	}
	if host, _, err := net.SplitHostPort(addr); err != nil || !isLoopback(host) {
		return fmt.Errorf("-addr %q: want a loopback ip:port", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	if addrFile != "" { // written atomically, once the socket accepts connections
		if err := os.WriteFile(addrFile+".tmp", []byte(ln.Addr().String()+"\n"), 0o644); err != nil {
			return err
		}
		if err := os.Rename(addrFile+".tmp", addrFile); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); ln.Close() }()
	err = r.serve(ln)
	if ctx.Err() != nil {
		return nil // stopped by a signal
	}
	return err
}

// relay holds what every CONNECT shares: the CA, its leaves, the upstream's
// roots and the name pins.
type relay struct {
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	roots  *x509.CertPool
	pins   map[string]string // host name -> loopback IP
	mu     sync.Mutex
	leaves map[string]*tls.Certificate // by CONNECT host
}

func newRelay(roots *x509.CertPool, pins map[string]string) (*relay, error) {
	ca, caKey, err := newCert("tlsrelay CA", "", nil, nil)
	if err != nil {
		return nil, err
	}
	return &relay{ca: ca, caKey: caKey, roots: roots, pins: pins, leaves: map[string]*tls.Certificate{}}, nil
}

func (r *relay) serve(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go r.handle(c)
	}
}

// handle answers one CONNECT and relays its tunnel until either side ends.
func (r *relay) handle(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	if req.Method != http.MethodConnect {
		io.WriteString(c, "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return
	}
	host, port, err := net.SplitHostPort(req.Host)
	if err != nil {
		io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return
	}
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		return
	}
	leaf, err := r.leaf(host)
	if err != nil {
		return
	}
	// A client waits for the 200 before its ClientHello, so br holds no byte
	// beyond the request; reading through br keeps that true for any client.
	client := tls.Server(bufferedConn{c, br}, &tls.Config{
		Certificates: []tls.Certificate{*leaf},
		NextProtos:   []string{"http/1.1"},
	})
	if err := client.Handshake(); err != nil {
		return
	}
	up, err := r.dialUpstream(host, port)
	if err != nil {
		return
	}
	defer up.Close()
	c.SetDeadline(time.Time{})

	done := make(chan struct{})
	go func() {
		io.Copy(up, client)
		up.Close()
		c.Close()
		close(done)
	}()
	io.Copy(client, up)
	up.Close()
	c.Close()
	<-done
}

// dialUpstream opens TLS to host:port at its pinned loopback address,
// verified against the upstream's roots for the CONNECT host's name.
func (r *relay) dialUpstream(host, port string) (*tls.Conn, error) {
	ip, ok := r.pins[host]
	if !ok {
		ip = host
	}
	if !isLoopback(ip) {
		return nil, fmt.Errorf("refusing to dial %s: not a loopback address", host)
	}
	d := &tls.Dialer{
		NetDialer: &net.Dialer{Timeout: handshakeTimeout},
		Config:    &tls.Config{ServerName: host, RootCAs: r.roots, NextProtos: []string{"http/1.1"}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(ip, port))
	if err != nil {
		return nil, err
	}
	return c.(*tls.Conn), nil
}

// leaf returns the cached leaf for host, signing one on first use.
func (r *relay) leaf(host string) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if l := r.leaves[host]; l != nil {
		return l, nil
	}
	cert, key, err := newCert(host, host, r.ca, r.caKey)
	if err != nil {
		return nil, err
	}
	l := &tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}
	r.leaves[host] = l
	return l, nil
}

// bufferedConn reads through the bufio.Reader that read the CONNECT request.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// newCert creates an ECDSA P-256 certificate, as the harness's servers do: a
// CA when parent is nil, otherwise a server leaf for host signed by parent.
func newCert(cn, host string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
		parent, parentKey = tmpl, key
	} else {
		tmpl.DNSNames = []string{host}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func writeCertPEM(path string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// parseResolve reads "name=ip[,name=ip]" pins; every ip must be loopback.
func parseResolve(s string) (map[string]string, error) {
	pins := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if kv == "" {
			continue
		}
		name, ip, ok := strings.Cut(kv, "=")
		if !ok || !isLoopback(ip) {
			return nil, fmt.Errorf("-resolve %q: want name=loopback-ip", kv)
		}
		pins[name] = ip
	}
	return pins, nil
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
