package ca

import "time"

// CertInfo describes one CA certificate.
type CertInfo struct {
	// Subject is the certificate's subject as a distinguished name.
	Subject string
	// Fingerprint is the SHA-256 of the certificate's DER, as
	// `openssl x509 -fingerprint -sha256` prints it (AB:CD:...).
	Fingerprint string
	NotBefore   time.Time
	NotAfter    time.Time
}

// Status is the CA set at one moment: the signer, and its successor once
// minted. The bundle is exactly these certificates.
type Status struct {
	Signer    CertInfo
	Successor *CertInfo
}

// Valid reports whether the signer can vouch for a leaf at now: admission
// starts no run that declares secrets when it cannot.
func (s Status) Valid(now time.Time) bool {
	return !s.Signer.NotAfter.IsZero() && !now.Before(s.Signer.NotBefore) && now.Before(s.Signer.NotAfter)
}
