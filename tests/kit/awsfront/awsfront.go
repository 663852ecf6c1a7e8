// Package awsfront owns the AWS side of the tests of edge's SigV4
// re-signing: a moto_server of its own that checks signatures, the IAM
// identities in it (the real key edge holds, edge's own STS identity, a
// role to assume), and a loopback TLS front that answers as the real AWS
// names (sts.amazonaws.com, s3.us-east-1.amazonaws.com, bucket virtual
// hosts, dynamodb.us-east-1.amazonaws.com) with a certificate of its own
// test CA and forwards to moto over plain HTTP, keeping the Host header so
// moto routes by service and bucket (virtual-hosted and path-style S3 both
// work).
//
// Edge is pointed at the front with proxy.upstream.resolve (Resolve's map)
// and proxy.upstream.extraRootsFile (CAFile); tests then assert on Records:
// which key id reached "AWS", whether a request was forwarded at all.
//
// What checks what. moto 5.2.1 (iam/access_control.py) checks a header
// signature: the key id against the IAM keys it issued, the session token
// of temporary keys, the signature over the signed headers (through
// botocore's signer), and the IAM policy. It does not check a presigned URL
// (it answers 500 without an Authorization header), chunk or trailer
// signatures or trailing checksums of an aws-chunked body, nor a body
// against a literal x-amz-content-sha256; and it misreads S3 URLs with
// many characters a key or list prefix may hold, and drops some headers
// older clients sign (motoview.go). The front
// checks those itself, with its own SigV4 verifier (not edge's), refusing
// as S3 does with an XML error: presigned URLs with their expiry,
// aws-chunked bodies in all three streaming modes, literal payload
// digests, and the signature of a request moto would misread. A presigned
// or misread request goes on signed again by the front with the same key
// (Record.Resigned), which moto checks as usual. Bodies stream both ways;
// the front holds one chunk at a time.
//
// It lives under tests/: nothing outside tests imports it.
package awsfront

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/runfleet/runfleet/tests/kit/edgetest"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

// Region is the region every name of the front is in.
const Region = "us-east-1"

// defaultNames are the AWS names the front's certificate always covers
// (Front.Names lists them with Config.Names); the wildcards cover
// virtual-hosted buckets (bucket.s3...).
var defaultNames = []string{
	"sts.amazonaws.com",
	"sts.us-east-1.amazonaws.com",
	"s3.amazonaws.com",
	"s3.us-east-1.amazonaws.com",
	"*.s3.amazonaws.com",
	"*.s3.us-east-1.amazonaws.com",
	"dynamodb.us-east-1.amazonaws.com",
}

// CAFileName is the name of the CA's PEM file in Config.Dir.
const CAFileName = "awsfront-ca.pem"

const (
	defaultMaxChunk = 16 << 20
	defaultPrecheck = 1 << 20
	startTimeout    = 30 * time.Second
	// maxDrain bounds what the front reads and discards of a refused
	// request's body so the client gets its answer; past it the
	// connection is closed and the client may see a reset instead.
	maxDrain = 1 << 30
)

// Config is the front's configuration; the zero value is usable.
type Config struct {
	// Addr is where the front listens. "" means 127.0.0.1:0, enough for
	// clients built with HTTPClient or AWSConfig. Edge dials an upstream on
	// the port its client asked for (443 for AWS) at the address
	// proxy.upstream.resolve pins the name to, and that is an IP with no
	// port: a front edge reaches must listen on "<loopback IP>:443" (root
	// may bind it; pick an address in 127.0.0.0/8 no other test uses).
	Addr string
	// Dir receives CAFileName. "" means a new temporary directory that
	// Close removes. The file is 0644: it holds only a certificate, and a
	// task running as another user may have to read it.
	Dir string
	// Names are added to the certificate's default names (Front.Names),
	// e.g. a name a test uses that no wildcard covers.
	Names []string
	// Now is the front's clock: presigned URLs expire by it and forwarded
	// presigned requests are re-signed at it. Nil means time.Now. Tests
	// inject a clock to cross an expiry without sleeping.
	Now func() time.Time
	// MaxChunk bounds one aws-chunked chunk, which the front holds while it
	// checks its signature. Zero means 16 MiB (SDKs send 64 KiB to 1 MiB).
	MaxChunk int
	// Precheck is how much of a body the front checks before it contacts
	// moto at all. A body that ends within it and fails is refused without
	// moto seeing anything (Record.Upstream NotForwarded); a longer one is
	// cut off mid-body (CutOff). Zero means 1 MiB.
	Precheck int64
	// Logger gets one line per request. Nil discards.
	Logger *slog.Logger
}

// withDefaults fills what the zero values mean.
func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = "127.0.0.1:0"
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxChunk == 0 {
		c.MaxChunk = defaultMaxChunk
	}
	if c.Precheck == 0 {
		c.Precheck = defaultPrecheck
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Front is a running front with its moto. Its methods are safe for
// concurrent use.
type Front struct {
	// Addr is the front's "ip:port".
	Addr string
	// CAFile is the CA's PEM, for edge's proxy.upstream.extraRootsFile or a
	// client's AWS_CA_BUNDLE.
	CAFile string
	// CA is the test CA the front's certificate is from.
	CA *edgetest.CA
	// Identity is what the IAM bootstrap created.
	Identity Identity
	// Moto is the front's own moto (signature checks on).
	Moto *motoserver.Server

	cfg       Config
	names     []string
	motoURL   *url.URL
	srv       *http.Server
	transport *http.Transport
	keys      keyring
	records   log
	seq       atomic.Int64
	tmpDir    string
	closeOnce sync.Once
	closeErr  error
}

// Start starts a moto that checks signatures, bootstraps its IAM
// identities, and serves the front. ctx bounds the start only. The caller
// must Close it.
func Start(ctx context.Context, cfg Config) (f *Front, err error) {
	cfg = cfg.withDefaults()
	f = &Front{cfg: cfg, names: append(append([]string(nil), defaultNames...), cfg.Names...)}
	defer func() {
		if err != nil {
			err = errors.Join(err, f.Close())
		}
	}()

	f.Moto, f.Identity, err = StartMoto(ctx)
	if err != nil {
		return nil, err
	}
	f.keys.add(f.Identity.Real)
	f.keys.add(f.Identity.Edge)
	// Through moto's serialising front, for the atomicity motoserver's
	// package comment explains.
	if f.motoURL, err = url.Parse(f.Moto.URL); err != nil {
		return nil, fmt.Errorf("awsfront: moto's URL: %w", err)
	}

	if f.CA, err = edgetest.MakeCA(); err != nil {
		return nil, err
	}
	leaf, err := f.CA.MintCertificate(f.names...)
	if err != nil {
		return nil, err
	}
	dir := cfg.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "awsfront-"); err != nil {
			return nil, fmt.Errorf("awsfront: CA directory: %w", err)
		}
		f.tmpDir = dir
	}
	f.CAFile = filepath.Join(dir, CAFileName)
	if err := os.WriteFile(f.CAFile, f.CA.PEM, 0o644); err != nil {
		return nil, fmt.Errorf("awsfront: writing the CA: %w", err)
	}

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("awsfront: listening on %s: %w", cfg.Addr, err)
	}
	f.Addr = ln.Addr().String()
	f.transport = &http.Transport{
		// No Proxy: the environment's proxy settings must not send moto's
		// traffic anywhere. No compression: a body passes as moto sent it.
		DisableCompression:  true,
		MaxIdleConnsPerHost: 16,
	}
	f.srv = &http.Server{
		Handler:           f,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{leaf}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = f.srv.ServeTLS(ln, "", "") }()
	return f, nil
}

// StartT starts a front for one test and closes it in t.Cleanup; it fails
// the test if it cannot. Prefer one front per test binary (Run) where many
// tests need one: moto and the bootstrap take about a second.
func StartT(t testing.TB, cfg Config) *Front {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	f, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("awsfront: close: %v", err)
		}
	})
	return f
}

// Run is a TestMain body that starts one front for the test binary, hands
// it to use, runs the tests and closes it, returning the exit code. A
// front that cannot start fails the binary (with moto's install hint).
func Run(m *testing.M, cfg Config, use func(*Front)) int {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	f, err := Start(ctx, cfg)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	use(f)
	code := m.Run()
	if err := f.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Close stops the front and its moto and removes a temporary CA
// directory. It is idempotent.
func (f *Front) Close() error {
	f.closeOnce.Do(func() {
		var errs []error
		if f.srv != nil {
			errs = append(errs, f.srv.Close())
		}
		if f.transport != nil {
			f.transport.CloseIdleConnections()
		}
		if f.Moto != nil {
			errs = append(errs, f.Moto.Stop())
		}
		if f.tmpDir != "" {
			errs = append(errs, os.RemoveAll(f.tmpDir))
		}
		f.closeErr = errors.Join(errs...)
	})
	return f.closeErr
}

// Names are the names the front's certificate covers (wildcards included).
func (f *Front) Names() []string { return append([]string(nil), f.names...) }

// Covers reports whether the certificate covers host (a wildcard covers
// one label).
func (f *Front) Covers(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, n := range f.names {
		if n == host {
			return true
		}
		if suffix, ok := strings.CutPrefix(n, "*"); ok && strings.HasSuffix(host, suffix) && !strings.Contains(strings.TrimSuffix(host, suffix), ".") && len(host) > len(suffix) {
			return true
		}
	}
	return false
}

// Resolve is edge's proxy.upstream.resolve for the front: every name of
// the certificate that is not a wildcard, and extra (say the virtual host
// of a test's bucket, "mybucket.s3.us-east-1.amazonaws.com", which a
// wildcard covers but edge pins by exact name), mapped to the front's IP.
// Edge connects on port 443: see Config.Addr.
func (f *Front) Resolve(extra ...string) map[string]string {
	ip, _, _ := net.SplitHostPort(f.Addr)
	m := map[string]string{}
	for _, n := range append(f.Names(), extra...) {
		if !strings.HasPrefix(n, "*") {
			m[n] = ip
		}
	}
	return m
}

// HTTPClient is a client that reaches the front for every name it covers,
// whatever the port asked for, trusts its CA, and dials nothing else.
func (f *Front) HTTPClient() *http.Client {
	roots := x509.NewCertPool()
	roots.AddCert(f.CA.Cert)
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			if !f.Covers(host) {
				return nil, fmt.Errorf("awsfront: %s is not a name the front answers; no other address is dialled", host)
			}
			return dialer.DialContext(ctx, network, f.Addr)
		},
		DisableCompression: true,
	}}
}

// AWSConfig is an aws.Config that reaches the front (the SDK's own AWS
// endpoints, dialled to the front by HTTPClient) with creds, in Region.
// Nothing is read from the environment or shared config files.
func (f *Front) AWSConfig(creds aws.CredentialsProvider) aws.Config {
	return aws.Config{
		Region:      Region,
		Credentials: creds,
		HTTPClient:  f.HTTPClient(),
		// Retries would hide a refusal behind a second attempt.
		RetryMaxAttempts: 1,
	}
}

// AddCredentials lets the front check signatures made with c (a key it did
// not issue or learn, say temporary credentials a test got from moto
// directly). The real and edge keys, and any temporary credentials an STS
// answer through the front carried, are known already.
func (f *Front) AddCredentials(c aws.Credentials) { f.keys.add(c) }

// Records returns what the front saw, in arrival order.
func (f *Front) Records() []Record { return f.records.all() }

// checkedBody is a request body the front checks as it streams.
type checkedBody interface {
	io.Reader
	// Err is the check that failed, nil while none has.
	Err() error
	// Decoded counts the payload bytes checked so far.
	Decoded() int64
}

// ServeHTTP checks what moto cannot and forwards the rest to it.
func (f *Front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	requestID := "awsfront-" + strconv.FormatInt(f.seq.Add(1), 10)
	sw := &statusWriter{ResponseWriter: w}
	rec := Record{
		Host: r.Host, Method: r.Method, Path: r.URL.EscapedPath(), RawQuery: r.URL.RawQuery,
		Auth:          authOf(r),
		Payload:       r.Header.Get("X-Amz-Content-Sha256"),
		SecurityToken: r.Header.Get("X-Amz-Security-Token") != "" || r.URL.Query().Has("X-Amz-Security-Token"),
	}
	// commit puts the record in Records before the client can have the
	// answer's first byte, so a test that has its answer finds its record.
	var once sync.Once
	commit := func(status int) {
		once.Do(func() {
			rec.Status = status
			f.records.add(rec)
			f.cfg.Logger.Info("awsfront", "id", requestID, "host", rec.Host, "method", rec.Method, "path", rec.Path,
				"auth", string(rec.Auth), "key", rec.AccessKeyID, "payload", rec.Payload, "token", rec.SecurityToken,
				"checked", rec.FrontChecked, "resigned", rec.Resigned, "bytes", rec.BodyBytes, "upstream", rec.Upstream.String(),
				"status", rec.Status, "refusal", rec.Refusal)
		})
	}
	// Every path below commits first; this is for one that does not.
	defer func() { commit(sw.status) }()
	body := r.Body // the client's, before a check wraps it
	refuse := func(err error) {
		// Read what the client still sends before answering: a client
		// blocked writing a body the server stopped reading gets a reset,
		// not the answer (and Go's server may refuse reads once the
		// answer is written). Nothing else reads body by now: a checked
		// body that failed is never read again (progress.fail).
		_, _ = io.Copy(io.Discard, io.LimitReader(body, maxDrain))
		status, code := answer(err)
		rec.Refusal = code
		commit(status)
		writeError(sw, status, code, err, r.URL.Path, requestID)
	}

	plan, err := f.check(r, &rec)
	if err != nil {
		refuse(err)
		return
	}
	if plan.body != nil {
		// Check the first part of the body before moto hears of the
		// request: a short body that fails never reaches it.
		head, err := io.ReadAll(io.LimitReader(plan.body, f.cfg.Precheck))
		rec.BodyBytes = plan.body.Decoded()
		if err != nil {
			refuse(err)
			return
		}
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(head), plan.body), r.Body}
	}

	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = f.motoURL.Scheme, f.motoURL.Host
			// The Host moto sees is the AWS name: moto routes by it and
			// the signature covers it.
			pr.Out.Host = pr.In.Host
			if plan.resign != nil {
				plan.resign(pr.Out)
			}
		},
		Transport: f.transport,
		// Pass moto's answer on as it comes: a test may read the start
		// of a download before moto has written the rest.
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(f.cfg.Logger.Handler(), slog.LevelWarn),
		ModifyResponse: func(resp *http.Response) error {
			rec.Upstream = Answered
			if plan.body != nil {
				rec.BodyBytes = plan.body.Decoded()
			}
			if strings.HasPrefix(r.Host, "sts.") && resp.StatusCode == http.StatusOK {
				if err := f.keys.learnSTS(resp); err != nil {
					return err
				}
			}
			commit(resp.StatusCode)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			if plan.body != nil {
				rec.BodyBytes = plan.body.Decoded()
				if cerr := plan.body.Err(); cerr != nil {
					rec.Upstream = CutOff
					refuse(cerr)
					return
				}
			}
			if rec.Upstream != Answered {
				rec.Upstream = Unreachable
			}
			f.cfg.Logger.Error("awsfront: forwarding", "id", requestID, "err", err)
			commit(http.StatusBadGateway)
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	proxy.ServeHTTP(sw, r)
}

// plan is what the front does with a request that passed its checks.
type plan struct {
	// body replaces the request's body when the front checks it as it
	// streams.
	body checkedBody
	// resign, when set, signs the outbound request again (a presigned
	// URL, forwarded in header form).
	resign func(out *http.Request)
}

// check runs the front's own checks on r's signature and sets up those on
// its body; what it does not check, moto does.
func (f *Front) check(r *http.Request, rec *Record) (plan, error) {
	switch rec.Auth {
	case AuthPresigned:
		s, err := parsePresigned(r.URL.Query())
		rec.AccessKeyID = s.accessKeyID
		if err != nil {
			return plan{}, err
		}
		rec.FrontChecked = true
		creds, err := f.checkPresigned(r, s)
		if err != nil {
			return plan{}, err
		}
		rec.Resigned = true
		return plan{resign: func(out *http.Request) { f.resignPresigned(out, s, creds) }}, nil
	case AuthHeader:
		s, err := parseHeaderSignature(r)
		rec.AccessKeyID = s.accessKeyID
		switch {
		case err == nil:
			return f.checkHeader(r, s, rec)
		case strings.HasPrefix(rec.Payload, "STREAMING-"):
			// A body the front cannot check is never forwarded.
			rec.FrontChecked = true
			return plan{}, err
		}
		// moto judges a signature the front cannot read.
		return plan{}, nil
	}
	// No SigV4 signature: moto answers it.
	return plan{}, nil
}

// checkHeader checks what moto would not of a header-signed request: an
// aws-chunked or digest-carrying body, and the signature of a URL moto
// misreads (motoview.go), which it then re-signs for moto.
func (f *Front) checkHeader(r *http.Request, s signature, rec *Record) (plan, error) {
	var p plan
	mode := rec.Payload
	streaming := mode == streamingSigned || mode == streamingSignedTrailer || mode == streamingUnsignedTrailer
	// Only an S3 request names its payload hash in a header; for any
	// other service moto hashes the body itself, which the front would
	// have to hold to sign.
	misread := s.service == "s3" && mode != "" &&
		(motoView(r.URL.EscapedPath(), r.URL.RawQuery, s.service) != clientView(r.URL.EscapedPath(), r.URL.RawQuery, s.service, false) ||
			len(motoSigned(s.signedHeaders)) != len(s.signedHeaders))
	if streaming || misread {
		rec.FrontChecked = true
		creds, err := f.keys.lookup(s.accessKeyID, r.Header.Get("X-Amz-Security-Token"))
		if err != nil {
			return plan{}, err
		}
		// For a streaming body the chain is seeded by this signature:
		// check it here too, so chunks are never checked against a seed
		// nobody vouched for.
		if err := verify(r, s, creds.SecretAccessKey, mode); err != nil {
			return plan{}, err
		}
		if streaming {
			body, err := newChunkedBody(r.Body, mode, s, creds.SecretAccessKey,
				r.Header.Get("X-Amz-Decoded-Content-Length"), r.Header.Get("X-Amz-Trailer"), f.cfg.MaxChunk)
			if err != nil {
				return plan{}, err
			}
			p.body = body
		}
		if misread {
			rec.Resigned = true
			p.resign = func(out *http.Request) { f.signForMoto(out, s, creds.SecretAccessKey, mode) }
		}
	}
	if isHexDigest(mode) {
		rec.FrontChecked = true
		p.body = newDigestBody(r.Body, mode)
	}
	return p, nil
}

// statusWriter remembers the status sent, for the Record.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController (the reverse proxy's flushes) reach
// the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
