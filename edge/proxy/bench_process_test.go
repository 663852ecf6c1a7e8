package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// BenchmarkThreeProcesses measures what the bench harness measures
// (infra/bench/proxy-table.sh, ../shared/bench/edge-vs-peers.sh), so that
// the two agree within noise: three processes, as there, not one.
//
//   - the proxy: a child (this test binary), wired as edge serve wires it:
//     a live task's credential and placeholder, the audit on and redacted,
//     its metrics registered, and the harness's policy (one key, in
//     headers only, for the upstream's host and port);
//   - the upstream: a second child, an HTTP/1.1 net/http TLS server that
//     answers 200 "ok\n" only to the real value and 401 to anything else,
//     as the harness's proxybench upstream does;
//   - the client: this process, shaped like the harness's load client
//     (proxybench load): one http.Transport per worker, HTTP/1.1 only, one
//     idle connection each, keep-alive or a new connection per request,
//     each worker sending requests back to back until the window closes.
//
// Each sub-benchmark runs direct (with the real value) and proxied (with
// the placeholder) in interleaved windows, the order alternating, so that
// load from elsewhere on the machine lands on both; it reports the
// medians of the windows' requests/s and of their ratios, the proxy
// child's CPU time per proxied request and, at c=1, the p50 latencies over
// all windows and their ratio. Any answer but a 200 fails it: through the
// proxy a 200 means the real value was substituted.
//
// Knobs: -benchtime Nx runs max(N, 5) windows of each side;
// RUNFLEET_PROXY_BENCH_WINDOW (a Go duration, default 200ms) is each
// window's length, so a sub-benchmark takes about 2 s by default. The
// harness runs 10 s (keep-alive) and 5 s (new connection) per target.
func BenchmarkThreeProcesses(b *testing.B) {
	window := 200 * time.Millisecond
	if v := os.Getenv("RUNFLEET_PROXY_BENCH_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("RUNFLEET_PROXY_BENCH_WINDOW=%q: want a positive Go duration", v)
		}
		window = d
	}
	uca := edgetest.NewCA(b)
	certPEM, keyPEM := uca.Leaf(b, "api.example.test")
	upPort := startBenchUpstream(b, childSpec{Mode: childUpstream, LeafCert: string(certPEM), LeafKey: string(keyPEM)})
	px := startChild(b, childSpec{
		UpstreamPort: upPort, UpstreamCA: string(uca.PEM),
		// The harness's edge.json: default placeholders, headers only.
		Keys: fmt.Sprintf(`{"acme": {"keys": {"K": {"domains": ["api.example.test:%d"], "in": ["header"]}}}}`, upPort),
	})
	upRoots := x509.NewCertPool()
	upRoots.AppendCertsFromPEM(uca.PEM)
	target := fmt.Sprintf("https://api.example.test:%d/x", upPort)

	for _, m := range []struct {
		name      string
		keepAlive bool
		concs     []int
	}{{"keepalive", true, []int{1, 8, 16, 64}}, {"newconn", false, []int{1, 4}}} {
		for _, conc := range m.concs {
			b.Run(fmt.Sprintf("%s/c=%d", m.name, conc), func(b *testing.B) {
				direct := newLoadClient(conc, m.keepAlive, upRoots, nil, target, benchKey)
				proxied := newLoadClient(conc, m.keepAlive, px.pool, px.proxy, target, px.hello.Placeholder)
				defer direct.close()
				defer proxied.close()
				// Connections open, the proxy's leaf issued, both pools warm.
				direct.run(b, window/4)
				proxied.run(b, window/4)

				var dr, pr, ratio []float64
				var dl, pl []time.Duration
				var proxyCPU time.Duration
				var proxiedOK int64
				runProxied := func() loadResult {
					cpu0 := px.cpu(b)
					r := proxied.run(b, window)
					proxyCPU += px.cpu(b) - cpu0
					proxiedOK += r.ok
					return r
				}
				b.ResetTimer()
				for round := range max(b.N, 5) {
					var d, p loadResult
					if round%2 == 0 {
						d = direct.run(b, window)
						p = runProxied()
					} else {
						p = runProxied()
						d = direct.run(b, window)
					}
					dr, pr, ratio = append(dr, d.rate()), append(pr, p.rate()), append(ratio, p.rate()/d.rate())
					dl, pl = append(dl, d.lat...), append(pl, p.lat...)
				}
				b.StopTimer()
				b.ReportMetric(medianOf(dr), "direct_req/s")
				b.ReportMetric(medianOf(pr), "proxied_req/s")
				b.ReportMetric(medianOf(ratio), "ratio")
				b.ReportMetric(float64(proxyCPU.Nanoseconds())/1e3/float64(proxiedOK), "proxy_cpu_µs/req")
				if conc == 1 {
					d, p := median(dl), median(pl)
					b.ReportMetric(float64(d.Microseconds()), "direct_p50_µs")
					b.ReportMetric(float64(p.Microseconds()), "proxied_p50_µs")
					b.ReportMetric(float64(p)/float64(d), "p50_ratio")
				}
			})
		}
	}
}

// upstreamHello is the upstream child's first line on stdout.
type upstreamHello struct {
	Port int `json:"port"`
}

// startBenchUpstream starts the upstream child and returns its port on
// 127.0.0.1.
func startBenchUpstream(b *testing.B, spec childSpec) int {
	_, _, out := spawnChild(b, spec)
	var h upstreamHello
	must(b, out.Decode(&h))
	return h.Port
}

// benchUpstreamMain is the upstream child: proxybench's upstream, with
// the leaf of the parent's test CA. It serves until its stdin closes.
func benchUpstreamMain(spec childSpec) int {
	cert, err := tls.X509KeyPair([]byte(spec.LeafCert), []byte(spec.LeafKey))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	want := "Bearer " + benchKey
	okBody, deniedBody := []byte("ok\n"), []byte("unauthorized\n")
	var http1 http.Protocols
	http1.SetHTTP1(true)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") == want {
				w.Write(okBody)
				return
			}
			w.WriteHeader(http.StatusUnauthorized)
			w.Write(deniedBody)
		}),
		Protocols: &http1,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
	}
	go srv.ServeTLS(ln, "", "")
	json.NewEncoder(os.Stdout).Encode(upstreamHello{Port: ln.Addr().(*net.TCPAddr).Port})
	io.Copy(io.Discard, os.Stdin)
	srv.Close()
	return 0
}

// loadClient is proxybench load's client in this process: conc workers,
// each with its own Transport (HTTP/1.1, at most one idle connection, no
// TLS session cache), api.example.test pinned to 127.0.0.1, sending a GET
// with "Authorization: Bearer <token>".
type loadClient struct {
	clients []*http.Client
	target  string
	header  http.Header
}

// newLoadClient goes direct when proxy is nil; roots verify what the client
// sees (the upstream's CA direct, the proxy's bundle through it).
func newLoadClient(conc int, keepAlive bool, roots *x509.CertPool, proxy *url.URL, target, token string) *loadClient {
	l := &loadClient{target: target, header: http.Header{"Authorization": {"Bearer " + token}}}
	var http1 http.Protocols
	http1.SetHTTP1(true)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		if host == "api.example.test" {
			host = "127.0.0.1"
		}
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort(host, port))
	}
	for range conc {
		tr := &http.Transport{
			DialContext:         dial,
			TLSClientConfig:     &tls.Config{RootCAs: roots},
			Protocols:           &http1,
			DisableKeepAlives:   !keepAlive,
			MaxIdleConnsPerHost: 1,
			TLSHandshakeTimeout: 10 * time.Second,
		}
		if proxy != nil {
			tr.Proxy = http.ProxyURL(proxy)
		}
		l.clients = append(l.clients, &http.Client{Transport: tr, Timeout: 10 * time.Second})
	}
	return l
}

func (l *loadClient) close() {
	for _, c := range l.clients {
		c.CloseIdleConnections()
	}
}

// loadResult is one window: the 200s, how long the window took until its
// last request ended, and each 200's latency.
type loadResult struct {
	ok      int64
	elapsed time.Duration
	lat     []time.Duration
}

func (r loadResult) rate() float64 { return float64(r.ok) / r.elapsed.Seconds() }

// run has every worker send requests until window has passed; it fails b
// at any error or any status but 200.
func (l *loadClient) run(b *testing.B, window time.Duration) loadResult {
	type worker struct {
		ok, bad  int64
		status   int
		firstErr error
		lat      []time.Duration
	}
	ws := make([]worker, len(l.clients))
	start := time.Now()
	end := start.Add(window)
	var wg sync.WaitGroup
	for i, c := range l.clients {
		w := &ws[i]
		wg.Go(func() {
			for time.Now().Before(end) && w.firstErr == nil {
				req, _ := http.NewRequest(http.MethodGet, l.target, nil)
				req.Header = l.header // read-only for the client and the transport
				t0 := time.Now()
				res, err := c.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, res.Body)
					res.Body.Close()
				}
				switch {
				case err != nil:
					w.firstErr = err
				case res.StatusCode == http.StatusOK:
					w.ok++
					w.lat = append(w.lat, time.Since(t0))
				default:
					w.bad++
					w.status = res.StatusCode
				}
			}
		})
	}
	wg.Wait()
	r := loadResult{elapsed: time.Since(start)}
	for _, w := range ws {
		if w.firstErr != nil {
			b.Fatalf("a request failed: %v", w.firstErr)
		}
		if w.bad > 0 {
			b.Fatalf("answers other than 200: %d (one was %d)", w.bad, w.status)
		}
		r.ok += w.ok
		r.lat = append(r.lat, w.lat...)
	}
	return r
}
