package awssig

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// emptyHash is hex(sha256("")).
const emptyHash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// signingKey is SigV4's derived key: HMAC chained over the scope, so it
// signs for one day, region and service only. Four HMACs are a third of a
// re-signed request's signing cost, and a key serves a whole day, so keys
// are kept (derivedKeys). The result is shared: callers only read it.
func signingKey(secret, date, region, service string) []byte {
	id := derivedKeyID{secret, date, region, service}
	derivedKeys.mu.Lock()
	k, ok := derivedKeys.m[id]
	derivedKeys.mu.Unlock()
	if ok {
		return k
	}
	k = hmacSum([]byte("AWS4"+secret), date)
	k = hmacSum(k, region)
	k = hmacSum(k, service)
	k = hmacSum(k, scopeTerminal)
	derivedKeys.mu.Lock()
	if len(derivedKeys.m) >= maxDerivedKeys {
		// Days pass and secrets rotate: rather than track age, start
		// over; the next request of each scope derives its key again.
		clear(derivedKeys.m)
	}
	derivedKeys.m[id] = k
	derivedKeys.mu.Unlock()
	return k
}

type derivedKeyID struct{ secret, date, region, service string }

// maxDerivedKeys bounds the cache: far above the live runs' keys times
// their scopes on one host.
const maxDerivedKeys = 4096

// derivedKeys is held in edge's memory only, beside the secrets it is
// derived from.
var derivedKeys = struct {
	mu sync.Mutex
	m  map[derivedKeyID][]byte
}{m: map[derivedKeyID][]byte{}}

func hmacSum(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

func (s *Signature) amzDate() string { return s.Time.UTC().Format(amzDateLayout) }

func (s *Signature) scope() string {
	return s.Date + "/" + s.Region + "/" + s.Service + "/" + scopeTerminal
}

// payloadHash is the canonical request's last line for r as it is now: its
// x-amz-content-sha256, which must still be of the signature's mode; else
// "UNSIGNED-PAYLOAD" for a presigned S3 request; else bodyHash, the hex
// SHA-256 of the body, which the caller must supply since only it has read
// the body.
func payloadHash(r *http.Request, sig *Signature, bodyHash string) (string, error) {
	v, mode, err := payloadOf(r, sig)
	if err != nil {
		return "", err
	}
	if mode != sig.Payload {
		return "", malformed("payload_hash_malformed", "x-amz-content-sha256 changed payload mode")
	}
	switch {
	case v != "":
		return v, nil
	case mode == Unsigned:
		return unsignedPayload, nil
	case bodyHash == "":
		return "", malformed("payload_hash_malformed", "body hash required: the request carries no x-amz-content-sha256")
	case !isHex64(bodyHash):
		return "", malformed("payload_hash_malformed", "body hash malformed")
	}
	return bodyHash, nil
}

// signRequest returns the hex signature of r's canonical request over
// signed, with key, at sig's time and scope.
func signRequest(r *http.Request, sig *Signature, signed []string, payload string, key []byte) ([64]byte, error) {
	var out [64]byte
	var buf [1024]byte
	cr, err := appendCanonicalRequest(buf[:0], r, sig.Service, signed, sig.Presigned, payload)
	if err != nil {
		return out, err
	}
	crHash := sha256.Sum256(cr)
	sts := append(buf[:0], algorithm+"\n"...)
	sts = append(sts, sig.amzDate()...)
	sts = append(sts, '\n')
	sts = append(sts, sig.scope()...)
	sts = append(sts, '\n')
	sts = hex.AppendEncode(sts, crHash[:])
	m := hmac.New(sha256.New, key)
	m.Write(sts)
	var sum [sha256.Size]byte
	hex.Encode(out[:], m.Sum(sum[:0]))
	return out, nil
}

// Verify checks sig, which Parse found in r, over r exactly as the client
// sent it, with the placeholder secret. bodyHash, the hex SHA-256 of the
// body, is needed only when the request does not carry its payload hash:
// most services other than S3 send no x-amz-content-sha256, and then the
// canonical payload hash is the body's. The comparison is constant-time;
// a wrong signature is ErrMismatch. On success sig may be given to Resign
// and NewChunkResigner.
func Verify(r *http.Request, sig *Signature, secret, bodyHash string) error {
	sig.verified = false
	if secret == "" {
		return malformed("credentials_malformed", "secret empty")
	}
	payload, err := payloadHash(r, sig, bodyHash)
	if err != nil {
		return err
	}
	got, err := signRequest(r, sig, sig.SignedHeaders, payload, signingKey(secret, sig.Date, sig.Region, sig.Service))
	if err != nil {
		return err
	}
	if subtle.ConstantTimeCompare(got[:], []byte(sig.Signature)) != 1 {
		return ErrMismatch
	}
	sig.verified = true
	return nil
}

// Resign rewrites r, whose task signature sig Verify has passed, for creds.
// The signed headers' values, X-Amz-Date and the scope stay the task's;
// what changes is the access key id, the session token and the signature:
//
//   - Authorization header: rewritten. X-Amz-Security-Token is set to
//     creds.SessionToken, or removed when creds has none. A token header
//     the task signed stays signed with the new value; one it did not sign
//     is added to the signed headers when creds has a token; one it signed
//     leaves them when creds has none.
//   - Presigned: the query's X-Amz-Credential, X-Amz-Security-Token
//     (replaced, added or removed the same way) and X-Amz-Signature are
//     rewritten in place, the rest of r.URL.RawQuery left byte for byte.
//     Any X-Amz-Security-Token header is removed. Forward r.URL, not
//     r.RequestURI.
//
// The payload hash is r's x-amz-content-sha256 as it is now (so a caller
// that changes the body of a Literal request updates that header), else
// bodyHash as for Verify. The result is the new signature: the seed of a
// streamed body's chain for NewChunkResigner.
func Resign(r *http.Request, sig *Signature, creds Credentials, bodyHash string) (seed string, err error) {
	if !sig.verified {
		return "", ErrNotVerified
	}
	if !validKeyID(creds.AccessKeyID) || creds.SecretAccessKey == "" {
		return "", malformed("credentials_malformed", "credentials malformed")
	}
	payload, err := payloadHash(r, sig, bodyHash)
	if err != nil {
		return "", err
	}
	key := signingKey(creds.SecretAccessKey, sig.Date, sig.Region, sig.Service)
	delHeader(r.Header, "X-Amz-Security-Token")
	if sig.Presigned {
		return resignQuery(r, sig, creds, payload, key)
	}
	signed := slices.Clone(sig.SignedHeaders)
	const token = "x-amz-security-token"
	i, signedToken := slices.BinarySearch(signed, token)
	switch {
	case creds.SessionToken != "":
		r.Header["X-Amz-Security-Token"] = []string{creds.SessionToken}
		if !signedToken {
			signed = slices.Insert(signed, i, token)
		}
	case signedToken:
		signed = slices.Delete(signed, i, i+1)
	}
	got, err := signRequest(r, sig, signed, payload, key)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.Grow(len(algorithm) + 64 + len(creds.AccessKeyID) + len(sig.scope()) + 16*len(signed) + 64)
	b.WriteString(algorithm + " Credential=")
	b.WriteString(creds.AccessKeyID)
	b.WriteByte('/')
	b.WriteString(sig.scope())
	b.WriteString(", SignedHeaders=")
	for i, n := range signed {
		if i > 0 {
			b.WriteByte(';')
		}
		b.WriteString(n)
	}
	b.WriteString(", Signature=")
	b.Write(got[:])
	delHeader(r.Header, "Authorization")
	r.Header["Authorization"] = []string{b.String()}
	return string(got[:]), nil
}

// resignQuery rewrites a presigned request's signing parameters in place.
// The signature is computed with X-Amz-Signature left out of the canonical
// query, then put where the task's was.
func resignQuery(r *http.Request, sig *Signature, creds Credentials, payload string, key []byte) (string, error) {
	parts := strings.Split(r.URL.RawQuery, "&")
	sigAt, tokenSeen := -1, false
	kept := parts[:0]
	for _, part := range parts {
		k, _, _ := strings.Cut(part, "=")
		name, err := unescape(k)
		if err != nil {
			return "", malformed("query_malformed", "query has a malformed escape")
		}
		switch name {
		case qCredential:
			part = qCredential + "=" + uriEncoded(creds.AccessKeyID+"/"+sig.scope())
		case qSecurityToken:
			if creds.SessionToken == "" {
				continue
			}
			part = qSecurityToken + "=" + uriEncoded(creds.SessionToken)
			tokenSeen = true
		case qSignature:
			sigAt = len(kept)
		}
		kept = append(kept, part)
	}
	if creds.SessionToken != "" && !tokenSeen {
		kept = append(kept, qSecurityToken+"="+uriEncoded(creds.SessionToken))
	}
	if sigAt < 0 {
		// Parse saw it; a caller has taken it out since.
		return "", malformed("signature_malformed", "X-Amz-Signature missing")
	}
	r.URL.RawQuery = strings.Join(kept, "&")
	got, err := signRequest(r, sig, sig.SignedHeaders, payload, key)
	if err != nil {
		return "", err
	}
	kept[sigAt] = qSignature + "=" + string(got[:])
	r.URL.RawQuery = strings.Join(kept, "&")
	return string(got[:]), nil
}

func delHeader(h http.Header, name string) {
	for k := range h {
		if strings.EqualFold(k, name) {
			delete(h, k)
		}
	}
}

// CheckTime says whether now is within the request's validity: for a header
// signature, X-Amz-Date within skew of now (AWS allows 15 minutes); for a
// presigned one, from X-Amz-Date less skew to X-Amz-Date plus X-Amz-Expires
// (plus skew when the URL names no expiry). AWS checks the same on the
// re-signed request, which keeps both values; checking here refuses a
// stale or far-future request before the real secret signs it. ErrStale
// when outside.
func (s *Signature) CheckTime(now time.Time, skew time.Duration) error {
	if now.Before(s.Time.Add(-skew)) {
		return ErrStale
	}
	end := s.Time.Add(skew)
	if s.Presigned && s.Expires > 0 {
		end = s.Time.Add(s.Expires)
	}
	if now.After(end) {
		return ErrStale
	}
	return nil
}
