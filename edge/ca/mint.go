package ca

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"strings"
	"time"
)

// backdate puts NotBefore a little in the past, so a peer whose clock lags
// slightly still accepts a certificate made this instant.
const backdate = 5 * time.Minute

// authority is one CA: certificate and (once unsealed) key.
type authority struct {
	cert        *x509.Certificate
	certPEM     []byte
	sealedKey   []byte
	key         *ecdsa.PrivateKey // nil until unsealed; Inspect never unseals
	fingerprint [sha256.Size]byte
}

func (a *authority) validity() validity {
	return validity{NotBefore: a.cert.NotBefore, NotAfter: a.cert.NotAfter}
}

// fingerprintHex is the fingerprint in lower-case hex, no separators.
func (a *authority) fingerprintHex() string { return hex.EncodeToString(a.fingerprint[:]) }

func (a *authority) info() CertInfo {
	return CertInfo{
		Subject:     a.cert.Subject.String(),
		Fingerprint: openSSLFingerprint(a.fingerprint[:]),
		NotBefore:   a.cert.NotBefore,
		NotAfter:    a.cert.NotAfter,
	}
}

func (a *authority) stored() storedAuthority {
	return storedAuthority{Certificate: string(a.certPEM), SealedKey: a.sealedKey}
}

// openSSLFingerprint writes a digest as `openssl x509 -fingerprint` does.
func openSSLFingerprint(sum []byte) string {
	h := strings.ToUpper(hex.EncodeToString(sum))
	var b strings.Builder
	for i := 0; i < len(h); i += 2 {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteString(h[i : i+2])
	}
	return b.String()
}

// keyAAD binds a sealed key to its certificate.
func keyAAD(fingerprint [sha256.Size]byte) []byte {
	return append([]byte("runfleet edge CA key v1\x00"), fingerprint[:]...)
}

// parseStoredCert reads a stored CA's certificate; its key stays sealed.
func parseStoredCert(s storedAuthority) (*authority, error) {
	block, rest := pem.Decode([]byte(s.Certificate))
	if block == nil || block.Type != "CERTIFICATE" || len(strings.TrimSpace(string(rest))) != 0 {
		return nil, errors.New("the certificate is not one PEM CERTIFICATE block")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the certificate does not parse: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("the certificate is not a CA")
	}
	if _, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok {
		return nil, errors.New("the certificate's key is not ECDSA")
	}
	return &authority{
		cert:        cert,
		certPEM:     pem.EncodeToMemory(block),
		sealedKey:   s.SealedKey,
		fingerprint: sha256.Sum256(cert.Raw),
	}, nil
}

// unseal opens the sealed key and checks that it belongs to the certificate.
func (a *authority) unseal(ctx context.Context, sealer Sealer) error {
	der, err := sealer.Open(ctx, a.sealedKey, keyAAD(a.fingerprint))
	if err != nil {
		return err
	}
	defer clear(der)
	parsed, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return fmt.Errorf("the opened key does not parse: %w", err)
	}
	key, ok := parsed.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(a.cert.PublicKey) {
		return errors.New("the opened key does not belong to the certificate")
	}
	a.key = key
	return nil
}

// mintAuthority makes a new self-signed P-256 CA valid from now for
// lifetime, its key sealed and never written in the clear.
func mintAuthority(ctx context.Context, now time.Time, lifetime time.Duration, random io.Reader, sealer Sealer) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ca: generating a CA key: %w", err)
	}
	serial, err := randomSerial(random)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			Organization: []string{"runfleet"},
			// The date and serial keep a signer's and its successor's
			// subjects apart, which chain building in some clients needs.
			CommonName: fmt.Sprintf("runfleet edge proxy CA %s %x", now.UTC().Format("2006-01-02T15:04Z"), serial.Bytes()[:4]),
		},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(lifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(random, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("ca: signing a CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("ca: reading back a CA certificate: %w", err)
	}
	a := &authority{
		cert:        cert,
		certPEM:     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:         key,
		fingerprint: sha256.Sum256(der),
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("ca: encoding a CA key: %w", err)
	}
	defer clear(keyDER)
	if a.sealedKey, err = sealer.Seal(ctx, keyDER, keyAAD(a.fingerprint)); err != nil {
		return nil, fmt.Errorf("ca: sealing a CA key: %w", err)
	}
	return a, nil
}

// randomSerial is a positive 128-bit serial number (RFC 5280 4.1.2.2).
func randomSerial(random io.Reader) (*big.Int, error) {
	b := make([]byte, 16)
	if _, err := io.ReadFull(random, b); err != nil {
		return nil, fmt.Errorf("ca: reading a serial number: %w", err)
	}
	b[0] &= 0x7f
	b[0] |= 0x40 // a fixed top bit keeps the encoding 16 bytes long
	return new(big.Int).SetBytes(b), nil
}
