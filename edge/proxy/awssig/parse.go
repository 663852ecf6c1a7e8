package awssig

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

const (
	algorithm      = "AWS4-HMAC-SHA256"
	algorithmV4A   = "AWS4-ECDSA-P256-SHA256"
	scopeTerminal  = "aws4_request"
	amzDateLayout  = "20060102T150405Z"
	maxExpires     = 7 * 24 * 60 * 60 // S3's limit for a presigned URL, and SigV4's
	eventsPayload  = "STREAMING-AWS4-HMAC-SHA256-EVENTS"
	ecdsaStreaming = "STREAMING-AWS4-ECDSA-P256-SHA256-"
)

// The presigned query's parameters.
const (
	qAlgorithm     = "X-Amz-Algorithm"
	qCredential    = "X-Amz-Credential"
	qDate          = "X-Amz-Date"
	qExpires       = "X-Amz-Expires"
	qSignedHeaders = "X-Amz-SignedHeaders"
	qSignature     = "X-Amz-Signature"
	qSecurityToken = "X-Amz-Security-Token"
	qRegionSet     = "X-Amz-Region-Set"
)

// Parse finds the SigV4 signature of r: the Authorization header
// ("AWS4-HMAC-SHA256 Credential=id/yyyymmdd/region/service/aws4_request,
// SignedHeaders=a;b, Signature=hex") or a presigned query (X-Amz-Algorithm,
// X-Amz-Credential, X-Amz-Date, X-Amz-Expires, X-Amz-SignedHeaders,
// X-Amz-Signature). It checks syntax only: ErrNotSigned when neither is
// there, an *UnsupportedError for SigV2, SigV4A and event-stream signing, a
// *MalformedError naming the part otherwise. Whether the signature is right
// is Verify's question.
func Parse(r *http.Request) (*Signature, error) {
	q, err := parseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, err
	}
	if r.Header.Get(qRegionSet) != "" || has(q, qRegionSet) {
		return nil, unsupported("sigv4a_unsupported", "SigV4A")
	}
	presigned := has(q, qAlgorithm) || has(q, qCredential) || has(q, qSignature) || has(q, qSignedHeaders)

	var sig *Signature
	auths := r.Header.Values("Authorization")
	scheme := ""
	if len(auths) > 0 {
		scheme, _, _ = strings.Cut(auths[0], " ")
	}
	switch {
	case scheme == algorithm:
		if len(auths) > 1 {
			return nil, malformed("authorization_malformed", "more than one Authorization header")
		}
		if presigned {
			return nil, malformed("signed_twice", "signed by both the Authorization header and the query")
		}
		if sig, err = parseAuthorization(auths[0]); err != nil {
			return nil, err
		}
		if err = headerDate(r, sig); err != nil {
			return nil, err
		}
		if !contains(sig.SignedHeaders, "x-amz-date") {
			return nil, malformed("signed_headers_lack_date", "signed headers lack x-amz-date")
		}
	case scheme == algorithmV4A:
		return nil, unsupported("sigv4a_unsupported", "SigV4A")
	case scheme == "AWS":
		return nil, unsupported("sigv2_unsupported", "SigV2")
	case strings.HasPrefix(scheme, "AWS4-"):
		return nil, malformed("algorithm_unknown", "signing algorithm unknown")
	case presigned:
		if sig, err = parsePresigned(q); err != nil {
			return nil, err
		}
	case has(q, "AWSAccessKeyId") && has(q, "Signature"):
		return nil, unsupported("sigv2_unsupported", "SigV2")
	default:
		return nil, ErrNotSigned
	}
	if !contains(sig.SignedHeaders, "host") {
		return nil, malformed("signed_headers_lack_host", "signed headers lack host")
	}
	if sig.Presigned && contains(sig.SignedHeaders, "x-amz-security-token") {
		// Resign puts a presigned request's token in the query; a second,
		// signed copy in a header would have to be kept in step with it.
		return nil, malformed("signed_headers_malformed", "presigned request signs the X-Amz-Security-Token header")
	}
	if sig.PayloadHash, sig.Payload, err = payloadOf(r, sig); err != nil {
		return nil, err
	}
	return sig, nil
}

// parseAuthorization reads the three components of a SigV4 Authorization
// header, each exactly once, separated by commas and optional spaces.
func parseAuthorization(v string) (*Signature, error) {
	rest := strings.TrimLeft(v[len(algorithm):], " ")
	var cred, signed, signature string
	var seen int
	for part := range strings.SplitSeq(rest, ",") {
		part = strings.Trim(part, " ")
		k, val, ok := strings.Cut(part, "=")
		bit := 0
		switch k {
		case "Credential":
			cred, bit = val, 1
		case "SignedHeaders":
			signed, bit = val, 2
		case "Signature":
			signature, bit = val, 4
		}
		if !ok || bit == 0 || seen&bit != 0 {
			return nil, malformed("authorization_malformed", "Authorization header malformed")
		}
		seen |= bit
	}
	switch {
	case seen&1 == 0:
		return nil, malformed("credential_malformed", "Authorization lacks Credential")
	case seen&2 == 0:
		return nil, malformed("signed_headers_malformed", "Authorization lacks SignedHeaders")
	case seen&4 == 0:
		return nil, malformed("signature_malformed", "Authorization lacks Signature")
	}
	sig := &Signature{}
	if err := parseCredential(sig, cred); err != nil {
		return nil, err
	}
	if err := parseSignedHeaders(sig, signed); err != nil {
		return nil, err
	}
	if !isHex64(signature) {
		return nil, malformed("signature_malformed", "signature malformed")
	}
	sig.Signature = signature
	return sig, nil
}

func headerDate(r *http.Request, sig *Signature) error {
	dates := r.Header.Values("X-Amz-Date")
	if len(dates) != 1 {
		return malformed("date_malformed", "X-Amz-Date missing or repeated")
	}
	return setTime(sig, dates[0])
}

// parsePresigned reads a presigned query; every signing parameter must
// appear at most once, since which copy a service would read is unknown.
func parsePresigned(q []param) (*Signature, error) {
	get := func(name string) (string, int) {
		v, n := "", 0
		for _, p := range q {
			if p.key == name {
				v, n = p.value, n+1
			}
		}
		return v, n
	}
	for _, name := range [...]string{qAlgorithm, qCredential, qDate, qExpires, qSignedHeaders, qSignature, qSecurityToken} {
		if _, n := get(name); n > 1 {
			return nil, malformed("query_malformed", "query repeats a signing parameter")
		}
	}
	switch alg, _ := get(qAlgorithm); alg {
	case algorithm:
	case algorithmV4A:
		return nil, unsupported("sigv4a_unsupported", "SigV4A")
	case "":
		return nil, malformed("algorithm_unknown", "X-Amz-Algorithm missing")
	default:
		return nil, malformed("algorithm_unknown", "signing algorithm unknown")
	}
	sig := &Signature{Presigned: true}
	cred, n := get(qCredential)
	if n == 0 {
		return nil, malformed("credential_malformed", "X-Amz-Credential missing")
	}
	if err := parseCredential(sig, cred); err != nil {
		return nil, err
	}
	signed, n := get(qSignedHeaders)
	if n == 0 {
		return nil, malformed("signed_headers_malformed", "X-Amz-SignedHeaders missing")
	}
	if err := parseSignedHeaders(sig, signed); err != nil {
		return nil, err
	}
	signature, _ := get(qSignature)
	if !isHex64(signature) {
		return nil, malformed("signature_malformed", "X-Amz-Signature missing or malformed")
	}
	sig.Signature = signature
	date, n := get(qDate)
	if n == 0 {
		return nil, malformed("date_malformed", "X-Amz-Date missing")
	}
	if err := setTime(sig, date); err != nil {
		return nil, err
	}
	if exp, n := get(qExpires); n > 0 {
		s, err := strconv.Atoi(exp)
		if err != nil || s < 1 || s > maxExpires || exp[0] == '+' {
			return nil, malformed("expires_malformed", "X-Amz-Expires malformed")
		}
		sig.Expires = time.Duration(s) * time.Second
	}
	return sig, nil
}

// parseCredential reads id/yyyymmdd/region/service/aws4_request.
func parseCredential(sig *Signature, cred string) error {
	parts := strings.Split(cred, "/")
	if len(parts) != 5 || parts[4] != scopeTerminal {
		return malformed("credential_malformed", "credential scope malformed")
	}
	if !validKeyID(parts[0]) {
		return malformed("credential_malformed", "credential access key id malformed")
	}
	if len(parts[1]) != 8 || !allDigits(parts[1]) {
		return malformed("credential_malformed", "credential date malformed")
	}
	if !validScopeName(parts[2]) {
		return malformed("credential_malformed", "credential region malformed")
	}
	if !validScopeName(parts[3]) {
		return malformed("credential_malformed", "credential service malformed")
	}
	sig.AccessKeyID, sig.Date, sig.Region, sig.Service = parts[0], parts[1], parts[2], parts[3]
	return nil
}

// parseSignedHeaders reads a;b;c. Strictly ascending lowercase names are
// what every signer sends and what the canonical request lists; anything
// else could be canonicalised more than one way.
func parseSignedHeaders(sig *Signature, v string) error {
	if v == "" {
		return malformed("signed_headers_malformed", "signed headers empty")
	}
	names := strings.Split(v, ";")
	for i, n := range names {
		if !validHeaderName(n) {
			return malformed("signed_headers_malformed", "signed header name malformed")
		}
		if i > 0 && names[i-1] >= n {
			return malformed("signed_headers_malformed", "signed headers not strictly ascending")
		}
	}
	sig.SignedHeaders = names
	return nil
}

// setTime reads X-Amz-Date, which must fall on the credential scope's day.
func setTime(sig *Signature, v string) error {
	t, err := time.Parse(amzDateLayout, v)
	if err != nil || len(v) != len(amzDateLayout) {
		return malformed("date_malformed", "X-Amz-Date malformed")
	}
	if v[:8] != sig.Date {
		return malformed("date_malformed", "X-Amz-Date is not the credential scope's day")
	}
	sig.Time = t
	return nil
}

// payloadOf reads x-amz-content-sha256 as the request carries it now. A
// presigned S3 request without one is Unsigned: S3 signs a URL, which
// carries no hash, over "UNSIGNED-PAYLOAD".
func payloadOf(r *http.Request, sig *Signature) (string, PayloadMode, error) {
	vs := r.Header.Values("X-Amz-Content-Sha256")
	if len(vs) == 0 {
		if sig.Presigned && s3Family(sig.Service) {
			return "", Unsigned, nil
		}
		return "", Literal, nil
	}
	if len(vs) > 1 {
		return "", 0, malformed("payload_hash_malformed", "x-amz-content-sha256 repeated")
	}
	v := vs[0]
	switch {
	case v == unsignedPayload:
		return v, Unsigned, nil
	case v == streamingPayload:
		return v, Streaming, nil
	case v == streamingUnsignedTrailer:
		return v, StreamingUnsignedTrailer, nil
	case v == streamingTrailer:
		return v, StreamingTrailer, nil
	case v == eventsPayload:
		return "", 0, unsupported("event_stream_unsupported", "event-stream signing")
	case strings.HasPrefix(v, ecdsaStreaming):
		return "", 0, unsupported("sigv4a_unsupported", "SigV4A")
	case isHex64(v):
		return v, Literal, nil
	}
	return "", 0, malformed("payload_hash_malformed", "x-amz-content-sha256 malformed")
}

func has(q []param, name string) bool {
	for _, p := range q {
		if p.key == name {
			return true
		}
	}
	return false
}

func contains(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

func isHex64[T string | []byte](s T) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// validKeyID: AWS access key ids are 16 to 128 letters and digits; nothing
// else may reach a credential scope, where '/' and ',' are separators.
func validKeyID(s string) bool {
	if len(s) < 16 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') {
			return false
		}
	}
	return true
}

// validScopeName: regions and signing names are lowercase letters, digits
// and '-' ("us-east-1", "execute-api", "s3-object-lambda"); '.' and '_'
// are let through for services not yet seen.
func validScopeName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'z') && c != '-' && c != '.' && c != '_' {
			return false
		}
	}
	return true
}

// validHeaderName: a lowercase HTTP token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
