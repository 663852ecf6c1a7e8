package awsfront

// A SigV4 verifier written apart from edge's (edge/proxy/awssig), so that
// the two check each other: the tests run real clients through edge to
// this front, and a rule either side gets wrong shows as a refusal. It
// follows the published algorithm (docs.aws.amazon.com, "Create a signed
// AWS API request", and S3's "Authenticating Requests (AWS Signature
// Version 4)") and the clients' own choices where the text leaves room;
// aws-sdk-go-v2's signer is the oracle in the tests.

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

const (
	algorithm     = "AWS4-HMAC-SHA256"
	amzTimeFormat = "20060102T150405Z"
	// maxPresignExpiry is S3's limit on X-Amz-Expires: seven days.
	maxPresignExpiry = 7 * 24 * time.Hour
)

// The x-amz-content-sha256 values that are not a digest of the body.
const (
	unsignedPayload          = "UNSIGNED-PAYLOAD"
	streamingSigned          = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
	streamingSignedTrailer   = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
	streamingUnsignedTrailer = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
)

// signature is a SigV4 signature as a request carries it, header or query.
type signature struct {
	presigned bool
	// accessKeyID, date (YYYYMMDD), region and service are the credential
	// scope's parts.
	accessKeyID, date, region, service string
	// amzDate is X-Amz-Date, the string to sign's timestamp.
	amzDate string
	// signedHeaders are lower case, in the order signed.
	signedHeaders []string
	// sig is the hex signature.
	sig string
	// expires is X-Amz-Expires (presigned only).
	expires time.Duration
}

func (s signature) scope() string {
	return s.date + "/" + s.region + "/" + s.service + "/aws4_request"
}

// signedAt is X-Amz-Date as a time.
func (s signature) signedAt() (time.Time, error) {
	t, err := time.Parse(amzTimeFormat, s.amzDate)
	if err != nil {
		return time.Time{}, fmt.Errorf("awsfront: X-Amz-Date %q: %w", s.amzDate, ErrMalformed)
	}
	return t, nil
}

// authOf says where r carries a SigV4 signature, without checking it.
func authOf(r *http.Request) Auth {
	if strings.HasPrefix(r.Header.Get("Authorization"), algorithm+" ") {
		return AuthHeader
	}
	if r.URL.Query().Has("X-Amz-Signature") {
		return AuthPresigned
	}
	return AuthNone
}

// parseHeaderSignature reads the Authorization header and X-Amz-Date.
func parseHeaderSignature(r *http.Request) (signature, error) {
	var s signature
	rest, ok := strings.CutPrefix(r.Header.Get("Authorization"), algorithm+" ")
	if !ok {
		return s, fmt.Errorf("awsfront: Authorization is not %s: %w", algorithm, ErrMalformed)
	}
	var cred, signed string
	for _, part := range strings.Split(rest, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "Credential":
			cred = v
		case "SignedHeaders":
			signed = v
		case "Signature":
			s.sig = v
		}
	}
	if err := s.setCredential(cred); err != nil {
		return s, err
	}
	if err := s.setSignedHeaders(signed); err != nil {
		return s, err
	}
	s.amzDate = r.Header.Get("X-Amz-Date")
	return s, s.check()
}

// parsePresigned reads the X-Amz-* query parameters of a presigned URL.
func parsePresigned(q url.Values) (signature, error) {
	s := signature{presigned: true, sig: q.Get("X-Amz-Signature"), amzDate: q.Get("X-Amz-Date")}
	if q.Get("X-Amz-Algorithm") != algorithm {
		return s, fmt.Errorf("awsfront: X-Amz-Algorithm %q: %w", q.Get("X-Amz-Algorithm"), ErrMalformed)
	}
	if err := s.setCredential(q.Get("X-Amz-Credential")); err != nil {
		return s, err
	}
	if err := s.setSignedHeaders(q.Get("X-Amz-SignedHeaders")); err != nil {
		return s, err
	}
	// Absent, the URL does not expire by itself (STS's presigned calls,
	// as the EKS token); S3 requires it (checkPresigned).
	if !q.Has("X-Amz-Expires") {
		return s, s.check()
	}
	secs, err := strconv.Atoi(q.Get("X-Amz-Expires"))
	if err != nil || secs < 1 || time.Duration(secs)*time.Second > maxPresignExpiry {
		return s, fmt.Errorf("awsfront: X-Amz-Expires %q must be 1 to %d seconds: %w", q.Get("X-Amz-Expires"), int(maxPresignExpiry.Seconds()), ErrMalformed)
	}
	s.expires = time.Duration(secs) * time.Second
	return s, s.check()
}

func (s *signature) setCredential(cred string) error {
	parts := strings.Split(cred, "/")
	if len(parts) != 5 || parts[4] != "aws4_request" || parts[0] == "" {
		return fmt.Errorf("awsfront: credential scope %q is not key/date/region/service/aws4_request: %w", cred, ErrMalformed)
	}
	s.accessKeyID, s.date, s.region, s.service = parts[0], parts[1], parts[2], parts[3]
	return nil
}

func (s *signature) setSignedHeaders(list string) error {
	if list == "" {
		return fmt.Errorf("awsfront: no signed headers: %w", ErrMalformed)
	}
	s.signedHeaders = strings.Split(list, ";")
	if !sort.StringsAreSorted(s.signedHeaders) {
		return fmt.Errorf("awsfront: signed headers %q not sorted: %w", list, ErrMalformed)
	}
	return nil
}

// check: the parts every signature needs, consistent with each other.
func (s signature) check() error {
	if len(s.sig) != 64 {
		return fmt.Errorf("awsfront: signature is not 64 hex digits: %w", ErrMalformed)
	}
	if _, err := hex.DecodeString(s.sig); err != nil {
		return fmt.Errorf("awsfront: signature is not hex: %w", ErrMalformed)
	}
	if !strings.HasPrefix(s.amzDate, s.date+"T") {
		return fmt.Errorf("awsfront: X-Amz-Date %q is not on the scope's day %q: %w", s.amzDate, s.date, ErrMalformed)
	}
	if _, err := s.signedAt(); err != nil {
		return err
	}
	for _, h := range s.signedHeaders {
		if h == "host" {
			return nil
		}
	}
	return fmt.Errorf("awsfront: host is not signed: %w", ErrMalformed)
}

// canonicalRequest builds the canonical request of r over the path and
// query lines v (a client's reading of r's URL, or moto's).
func canonicalRequest(r *http.Request, s signature, v view, payloadHash string) string {
	var b strings.Builder
	b.WriteString(r.Method)
	b.WriteByte('\n')
	b.WriteString(v.uri)
	b.WriteByte('\n')
	b.WriteString(v.query)
	b.WriteByte('\n')
	for _, h := range s.signedHeaders {
		b.WriteString(h)
		b.WriteByte(':')
		b.WriteString(canonicalHeaderValue(r, h))
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	b.WriteString(strings.Join(s.signedHeaders, ";"))
	b.WriteByte('\n')
	b.WriteString(payloadHash)
	return b.String()
}

// canonicalURI: S3 signs the path exactly as sent (its clients encode keys
// once and sign that); every other service signs the sent path encoded
// once more (aws-sdk-go-v2 httpbinding.EscapePath, botocore
// SigV4Auth._normalize_url_path).
func canonicalURI(escapedPath, service string) string {
	if escapedPath == "" {
		escapedPath = "/"
	}
	if service == "s3" {
		return escapedPath
	}
	return uriEncode(escapedPath, false)
}

// canonicalQuery sorts the query's parameters by encoded name, then value,
// each decoded and encoded again the way SigV4 encodes (space is %20,
// never +).
func canonicalQuery(rawQuery string, presigned bool) string {
	type pair struct{ k, v string }
	var pairs []pair
	for _, part := range strings.Split(rawQuery, "&") {
		if part == "" {
			continue
		}
		k, v, _ := strings.Cut(part, "=")
		// PathUnescape, not QueryUnescape: a + the client sent is a plus
		// (clients send a space as %20), and it is signed as %2B.
		dk, err1 := url.PathUnescape(k)
		dv, err2 := url.PathUnescape(v)
		if err1 != nil || err2 != nil {
			dk, dv = k, v // signed as sent; a mismatch will say so
		}
		if presigned && dk == "X-Amz-Signature" {
			continue
		}
		pairs = append(pairs, pair{uriEncode(dk, true), uriEncode(dv, true)})
	}
	sort.Slice(pairs, func(i, j int) bool {
		if pairs[i].k != pairs[j].k {
			return pairs[i].k < pairs[j].k
		}
		return pairs[i].v < pairs[j].v
	})
	parts := make([]string, len(pairs))
	for i, p := range pairs {
		parts[i] = p.k + "=" + p.v
	}
	return strings.Join(parts, "&")
}

// canonicalHeaderValue is one signed header's value: every value it has,
// trimmed, inner runs of spaces made one, joined by commas. Go's server
// keeps Host, and Transfer-Encoding when chunked, out of the header map.
func canonicalHeaderValue(r *http.Request, name string) string {
	var values []string
	switch name {
	case "host":
		values = []string{r.Host}
	case "transfer-encoding":
		values = r.TransferEncoding
	case "content-length":
		values = r.Header.Values(name)
		if len(values) == 0 && r.ContentLength >= 0 {
			values = []string{strconv.FormatInt(r.ContentLength, 10)}
		}
	default:
		values = r.Header.Values(name)
	}
	for i, v := range values {
		values[i] = strings.Join(strings.Fields(v), " ")
	}
	return strings.Join(values, ",")
}

// uriEncode is SigV4's UriEncode: every byte but A-Z a-z 0-9 - _ . ~
// becomes %XX (upper case hex). '/' is kept in a path and encoded in a
// query parameter (encodeSlash).
func uriEncode(s string, encodeSlash bool) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9',
			c == '-', c == '_', c == '.', c == '~':
			b.WriteByte(c)
		case c == '/' && !encodeSlash:
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		}
	}
	return b.String()
}

// signingKey derives the day's key for a scope from the secret.
func signingKey(secret string, s signature) []byte {
	k := hmacSHA256([]byte("AWS4"+secret), s.date)
	k = hmacSHA256(k, s.region)
	k = hmacSHA256(k, s.service)
	return hmacSHA256(k, "aws4_request")
}

func hmacSHA256(key []byte, data string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(data))
	return m.Sum(nil)
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// signatureOver is the hex signature of r's canonical request over v.
func signatureOver(r *http.Request, s signature, v view, secret, payloadHash string) string {
	sts := algorithm + "\n" + s.amzDate + "\n" + s.scope() + "\n" + sha256Hex([]byte(canonicalRequest(r, s, v, payloadHash)))
	return hex.EncodeToString(hmacSHA256(signingKey(secret, s), sts))
}

// verify checks s against r as a client signs it (for a presigned URL,
// without its X-Amz-Signature), with secret over payloadHash.
func verify(r *http.Request, s signature, secret, payloadHash string) error {
	want := signatureOver(r, s, clientView(r.URL.EscapedPath(), r.URL.RawQuery, s.service, s.presigned), secret, payloadHash)
	// hmac.Equal: constant time, so the comparison tells nothing of the
	// expected signature.
	if !hmac.Equal([]byte(want), []byte(strings.ToLower(s.sig))) {
		where := "header"
		if s.presigned {
			where = "presigned"
		}
		return fmt.Errorf("awsfront: %s signature of key %s: %w", where, s.accessKeyID, ErrSignature)
	}
	return nil
}

// VerifySignature checks the SigV4 signature r carries (header or
// presigned) with secret, as the front does, for tests that stand up an
// AWS of their own: the payload hash is r's x-amz-content-sha256, else
// UNSIGNED-PAYLOAD for a presigned S3 URL, else body's hash. Time is not
// checked. ErrSignature or ErrMalformed, wrapped, when it fails.
func VerifySignature(r *http.Request, secret string, body []byte) error {
	var s signature
	var err error
	switch authOf(r) {
	case AuthHeader:
		s, err = parseHeaderSignature(r)
	case AuthPresigned:
		s, err = parsePresigned(r.URL.Query())
	default:
		return fmt.Errorf("awsfront: no SigV4 signature: %w", ErrMalformed)
	}
	if err != nil {
		return err
	}
	payload := r.Header.Get("X-Amz-Content-Sha256")
	if payload == "" {
		payload = sha256Hex(body)
		if s.presigned && s.service == "s3" {
			payload = "UNSIGNED-PAYLOAD"
		}
	}
	return verify(r, s, secret, payload)
}
