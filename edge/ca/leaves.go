package ca

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
)

// leafIssuer is certmagic set up for one signer: a Cache and Config of its
// own, an Issuer signing with that signer, and a memory storage. When the
// signer changes a new leafIssuer replaces it whole and the old cache is
// stopped, so no leaf of the old signer is served again.
//
// certmagic decides renewals by the wall clock; here the injected clock
// decides. The Config is on-demand, which keeps certmagic's background
// maintenance away from these leaves (it skips on-demand certificates), and
// get checks every cached leaf against the injected clock itself, evicting
// one that is no longer fresh before issuing anew.
type leafIssuer struct {
	signer  *authority
	issuer  *signerIssuer
	storage *memoryStorage
	cache   *certmagic.Cache
	magic   *certmagic.Config
	flights flightGroup
}

// leafPolicy is what leaf issuance reads from the Authority's Config.
type leafPolicy struct {
	now      func() time.Time
	random   io.Reader
	lifetime time.Duration
	// allow is the name gate (Authority.mayIssue).
	allow func(name string) bool
	// maxLeaves bounds the leaves cached; zero means no bound.
	maxLeaves int
}

// maxLeaves bounds one signer's leaf cache. The policy's names are few,
// but names a run intercepts only to scrub (Authority.AdmitName) are any
// the task connects to, so without a bound a task naming random hosts
// would grow edge's memory a leaf at a time (a few KiB each). Past it
// certmagic evicts a leaf at random, which costs a reissue (one P-256 key
// and signature) at the next handshake for that name, nothing more.
const maxLeaves = 4096

func newLeafIssuer(signer *authority, policy leafPolicy) *leafIssuer {
	li := &leafIssuer{
		signer:  signer,
		issuer:  &signerIssuer{signer: signer, policy: policy},
		storage: newMemoryStorage(policy.now),
	}
	li.cache = certmagic.NewCache(certmagic.CacheOptions{
		GetConfigForCert: func(certmagic.Certificate) (*certmagic.Config, error) { return li.magic, nil },
		Capacity:         policy.maxLeaves,
		Logger:           zap.NewNop(),
	})
	li.magic = certmagic.New(li.cache, certmagic.Config{
		Issuers:   []certmagic.Issuer{li.issuer},
		Storage:   li.storage,
		KeySource: certmagic.StandardKeyGenerator{KeyType: certmagic.P256},
		OnDemand: &certmagic.OnDemandConfig{DecisionFunc: func(_ context.Context, name string) error {
			return allowed(policy.allow, name)
		}},
		OCSP:                certmagic.OCSPConfig{DisableStapling: true},
		DisableARI:          true,
		DisableStorageCheck: true, // memory cannot run out of space halfway
		Logger:              zap.NewNop(),
	})
	return li
}

// stop ends the cache's background maintenance.
func (li *leafIssuer) stop() { li.cache.Stop() }

// get returns a leaf for name that is fresh at now, issuing one if the
// cache has none.
func (li *leafIssuer) get(ctx context.Context, name string, now time.Time) (*tls.Certificate, error) {
	if cert := li.fresh(name, now); cert != nil {
		return cert, nil
	}
	return li.flights.do(name, func() (*tls.Certificate, error) {
		if cert := li.fresh(name, now); cert != nil {
			return cert, nil
		}
		li.evict(ctx, name, now)
		if err := li.magic.ObtainCertSync(withIssueTime(ctx, now), name); err != nil {
			return nil, fmt.Errorf("ca: issuing a leaf for %q: %w", name, err)
		}
		cached, err := li.magic.CacheManagedCertificate(ctx, name)
		// The cache holds the leaf now; the storage's copy would outlive
		// its eviction from the bounded cache (maxLeaves), so it goes.
		_ = li.storage.Delete(ctx, certmagic.StorageKeys.CertsSitePrefix(li.issuer.IssuerKey(), name))
		if err != nil {
			return nil, fmt.Errorf("ca: loading the leaf issued for %q: %w", name, err)
		}
		if !leafFresh(cached.Leaf, now) {
			return nil, fmt.Errorf("ca: the leaf issued for %q is not valid at %s", name, now.UTC().Format(time.RFC3339))
		}
		cert := cached.Certificate
		return &cert, nil
	})
}

// fresh returns a cached leaf for name that is fresh at now, or nil.
func (li *leafIssuer) fresh(name string, now time.Time) *tls.Certificate {
	for _, c := range li.cache.AllMatchingCertificates(name) {
		if leafFresh(c.Leaf, now) {
			cert := c.Certificate
			return &cert
		}
	}
	return nil
}

// evict drops name's leaves that are not fresh at now from the cache, and
// its stored assets, without which certmagic would not issue again.
func (li *leafIssuer) evict(ctx context.Context, name string, now time.Time) {
	var stale []string
	for _, c := range li.cache.AllMatchingCertificates(name) {
		if !leafFresh(c.Leaf, now) {
			stale = append(stale, c.Hash())
		}
	}
	li.cache.Remove(stale)
	_ = li.storage.Delete(ctx, certmagic.StorageKeys.CertsSitePrefix(li.issuer.IssuerKey(), name))
}

// leafFresh: valid at now, and not yet in the last third of its life,
// when it is reissued (certmagic's default renewal ratio, on our clock).
func leafFresh(leaf *x509.Certificate, now time.Time) bool {
	if leaf == nil || now.Before(leaf.NotBefore) {
		return false
	}
	renewAt := leaf.NotAfter.Add(-leaf.NotAfter.Sub(leaf.NotBefore) / 3)
	return now.Before(renewAt)
}

// allowed is the one name decision both the handshake and the Issuer make.
func allowed(allow func(string) bool, name string) error {
	if allow == nil || !allow(name) {
		return fmt.Errorf("ca: %q is not a name the proxy intercepts; no leaf is issued for it", name)
	}
	return nil
}

// normalizeServerName is the SNI as leaves are keyed: lower case, no
// trailing dot.
func normalizeServerName(sni string) string {
	return strings.TrimSuffix(strings.ToLower(strings.TrimSpace(sni)), ".")
}

// signerIssuer is the certmagic.Issuer that signs leaves with one signer.
type signerIssuer struct {
	signer *authority
	policy leafPolicy
}

var _ certmagic.Issuer = (*signerIssuer)(nil)

// IssuerKey carries the signer's fingerprint, so certmagic never mixes up
// leaves of two signers.
func (s *signerIssuer) IssuerKey() string { return "runfleet-edge-ca-" + s.signer.fingerprintHex() }

// Issue signs the CSR's one name. Every failure is permanent
// (certmagic.ErrNoRetry): retrying cannot make a refused name allowed or an
// ended signer valid.
func (s *signerIssuer) Issue(ctx context.Context, csr *x509.CertificateRequest) (*certmagic.IssuedCertificate, error) {
	now, ok := ctx.Value(issueTimeKey{}).(time.Time)
	if !ok {
		now = s.policy.now()
	}
	der, err := s.sign(csr, now)
	if err != nil {
		return nil, certmagic.ErrNoRetry{Err: err}
	}
	return &certmagic.IssuedCertificate{Certificate: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// issueTimeKey carries the handshake's reading of the clock to the Issuer
// through certmagic, so the leaf is dated at the instant the handshake
// checked the signer and the cache against.
type issueTimeKey struct{}

func withIssueTime(ctx context.Context, now time.Time) context.Context {
	return context.WithValue(ctx, issueTimeKey{}, now)
}

func (s *signerIssuer) sign(csr *x509.CertificateRequest, now time.Time) ([]byte, error) {
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("ca: the leaf request's signature: %w", err)
	}
	names := append([]string(nil), csr.DNSNames...)
	for _, ip := range csr.IPAddresses {
		names = append(names, ip.String())
	}
	if len(names) != 1 || len(csr.EmailAddresses) > 0 || len(csr.URIs) > 0 {
		return nil, fmt.Errorf("ca: a leaf names exactly one host, not %q", names)
	}
	name := names[0]
	if err := allowed(s.policy.allow, name); err != nil {
		return nil, err
	}
	signer := s.signer.cert
	if !now.Before(signer.NotAfter) {
		return nil, fmt.Errorf("ca: the signer ended at %s", signer.NotAfter.UTC().Format(time.RFC3339))
	}
	serial, err := randomSerial(s.policy.random)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             later(now.Add(-backdate), signer.NotBefore),
		NotAfter:              earlier(now.Add(s.policy.lifetime), signer.NotAfter),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(s.policy.random, tmpl, signer, csr.PublicKey, s.signer.key)
	if err != nil {
		return nil, fmt.Errorf("ca: signing a leaf for %q: %w", name, err)
	}
	return der, nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// flightGroup runs one issuance per name at a time; callers arriving while
// it runs share its result.
type flightGroup struct {
	mu      sync.Mutex
	flights map[string]*flight
}

type flight struct {
	done chan struct{}
	cert *tls.Certificate
	err  error
}

func (g *flightGroup) do(name string, fn func() (*tls.Certificate, error)) (*tls.Certificate, error) {
	g.mu.Lock()
	if f, ok := g.flights[name]; ok {
		g.mu.Unlock()
		<-f.done
		return f.cert, f.err
	}
	if g.flights == nil {
		g.flights = map[string]*flight{}
	}
	// The error stands if fn panics, so waiters never get no leaf and no error.
	f := &flight{done: make(chan struct{}), err: errors.New("ca: leaf issuance failed")}
	g.flights[name] = f
	g.mu.Unlock()

	defer func() {
		g.mu.Lock()
		delete(g.flights, name)
		g.mu.Unlock()
		close(f.done)
	}()
	cert, err := fn()
	if err == nil && cert == nil {
		err = errors.New("ca: no leaf")
	}
	f.cert, f.err = cert, err
	return cert, err
}
