package edgetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"time"
)

// CA is a test certificate authority for loopback TLS servers: the
// upstreams edge reaches (trusted through proxy.upstream.extraRootsFile)
// and the host API. Its certificates are valid from an hour ago for a day,
// on the wall clock.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// PEM is Cert in PEM, what a trust file holds.
	PEM []byte
}

// NewCA makes a CA.
func NewCA(t TB) *CA {
	t.Helper()
	c, err := MakeCA()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// MakeCA is NewCA for code that holds no test (a TestMain, a kit's Start):
// it returns the error instead of failing a test.
func MakeCA() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("edgetest: CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "runfleet test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("edgetest: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("edgetest: CA certificate: %w", err)
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Leaf mints a server certificate for names (an IP literal goes in the IP
// addresses, anything else in the DNS names), in PEM with its key.
func (c *CA) Leaf(t TB, names ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	certPEM, keyPEM, err := c.MintLeaf(names...)
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, keyPEM
}

// MintLeaf is Leaf returning its error, for code that holds no test.
func (c *CA) MintLeaf(names ...string) (certPEM, keyPEM []byte, err error) {
	if len(names) == 0 {
		return nil, nil, errors.New("edgetest: a leaf needs at least one name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("edgetest: leaf key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.Cert, &key.PublicKey, c.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("edgetest: leaf certificate for %v: %w", names, err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("edgetest: leaf key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), nil
}

// Certificate is Leaf as a tls.Certificate, for a server's tls.Config.
func (c *CA) Certificate(t TB, names ...string) tls.Certificate {
	t.Helper()
	cert, err := c.MintCertificate(names...)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// MintCertificate is Certificate returning its error, for code that holds
// no test.
func (c *CA) MintCertificate(names ...string) (tls.Certificate, error) {
	certPEM, keyPEM, err := c.MintLeaf(names...)
	if err != nil {
		return tls.Certificate{}, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("edgetest: leaf for %v: %w", names, err)
	}
	return cert, nil
}

// TLSServer starts an HTTPS server on loopback answering as names with a
// leaf of this CA; it stops at the test's end.
func (c *CA) TLSServer(t TB, h http.Handler, names ...string) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{c.Certificate(t, names...)}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}
