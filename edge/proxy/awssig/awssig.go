// Package awssig is AWS Signature Version 4 as a proxy checks and re-signs
// it: the task signs a request with a placeholder secret, the proxy checks
// that signature over the request exactly as sent (Parse, Verify), then
// signs the same canonical request again with the real credentials (Resign),
// keeping the task's signed headers and X-Amz-Date and changing only the
// access key id, the session token and the signature. A streamed
// aws-chunked body is re-signed chunk by chunk (NewChunkResigner).
//
// Verification and re-signing canonicalise the same bytes by the same code,
// so a rule here that disagrees with a client's signer (an unusual path,
// query or header spelling) only ever fails closed: the task's signature
// does not verify and the request is refused. It never makes the proxy put
// the real secret's signature on something other than what it checked.
// The rules follow aws-sdk-go-v2's signer, which the tests use as an
// oracle, except that the signed header set is always the task's (the SDK
// chooses its own): see canonical.go.
//
// The package decides nothing about policy and holds no secret beyond a
// call: which placeholder maps to which credentials, whether a request may
// go, and what is audited are the caller's. Errors name what was wrong and
// never carry a secret, a token or a signature.
package awssig

import (
	"errors"
	"time"
)

// Credentials are what a request is signed with: the task's placeholders
// or the real ones. SessionToken is empty for long-term keys.
type Credentials struct {
	AccessKeyID, SecretAccessKey, SessionToken string
}

// PayloadMode is how a request's signature covers its body, as its
// x-amz-content-sha256 says.
type PayloadMode int

const (
	// Literal: the canonical request ends in the body's hex SHA-256, carried
	// in x-amz-content-sha256 (S3) or, when that header is absent (most
	// other services), computed from the body by whoever verifies.
	Literal PayloadMode = iota
	// Unsigned: "UNSIGNED-PAYLOAD", the body is not covered.
	Unsigned
	// Streaming: "STREAMING-AWS4-HMAC-SHA256-PAYLOAD", an aws-chunked body
	// whose every chunk is signed in a chain seeded by the header signature.
	Streaming
	// StreamingUnsignedTrailer: "STREAMING-UNSIGNED-PAYLOAD-TRAILER", an
	// aws-chunked body with no chunk signatures and unsigned trailers; only
	// the header is re-signed, the body passes unchanged.
	StreamingUnsignedTrailer
	// StreamingTrailer: "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER", as
	// Streaming, then trailers signed as the chain's last link.
	StreamingTrailer
)

const (
	unsignedPayload          = "UNSIGNED-PAYLOAD"
	streamingPayload         = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
	streamingUnsignedTrailer = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
	streamingTrailer         = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
)

// String is the mode's x-amz-content-sha256 value; Literal has none (its
// value is the hash itself) and is "literal".
func (m PayloadMode) String() string {
	switch m {
	case Literal:
		return "literal"
	case Unsigned:
		return unsignedPayload
	case Streaming:
		return streamingPayload
	case StreamingUnsignedTrailer:
		return streamingUnsignedTrailer
	case StreamingTrailer:
		return streamingTrailer
	}
	return "unknown"
}

// Signature is a request's SigV4 signature as Parse found it. Its fields
// describe the task's signature and are not changed by Resign.
type Signature struct {
	// Presigned: the signature is in the query (X-Amz-Signature), not in
	// the Authorization header.
	Presigned bool
	// AccessKeyID, Date (yyyymmdd), Region and Service are the credential
	// scope: AccessKeyID/Date/Region/Service/aws4_request.
	AccessKeyID, Date, Region, Service string
	// SignedHeaders are the lowercase names the signature covers, in the
	// strictly ascending order the request listed them.
	SignedHeaders []string
	// Signature is the task's signature, 64 lowercase hex digits: the seed
	// of a streamed body's chain.
	Signature string
	// Time is X-Amz-Date; Date is its day.
	Time time.Time
	// Expires is X-Amz-Expires of a presigned request, 0 when absent (and
	// always for a header signature).
	Expires time.Duration
	// Payload is how the body is covered, PayloadHash the request's
	// x-amz-content-sha256 as sent ("" when absent).
	Payload     PayloadMode
	PayloadHash string

	// verified is set by a successful Verify: Resign and NewChunkResigner
	// refuse a signature that has not passed it, so the real secret is
	// never used for a request whose placeholder signature went unchecked.
	verified bool
}

// ErrNotSigned: the request carries neither an AWS Authorization header nor
// a presigned query. An Authorization header of a non-AWS scheme (Bearer,
// Basic) is not a signature either: what to do with such a request is the
// caller's decision.
var ErrNotSigned = errors.New("awssig: request carries no SigV4 signature")

// ErrMismatch: a signature (the header's, the query's, a chunk's or the
// trailer's) is not the one the key gives. Errors for chunks wrap it.
var ErrMismatch = errors.New("awssig: signature mismatch")

// ErrNotVerified: Resign or NewChunkResigner was given a Signature that
// Verify has not passed.
var ErrNotVerified = errors.New("awssig: signature not verified")

// ErrStale: the request's X-Amz-Date (and X-Amz-Expires) put it outside the
// time CheckTime was asked about.
var ErrStale = errors.New("awssig: request time outside its validity window")

// UnsupportedError is a signature of a scheme this package does not re-sign.
// Reason is stable, for audit: "sigv2_unsupported" (Authorization "AWS
// id:sig", or a query with AWSAccessKeyId and Signature),
// "sigv4a_unsupported" (AWS4-ECDSA-P256-SHA256, X-Amz-Region-Set, or an
// ECDSA streaming payload), "event_stream_unsupported"
// (STREAMING-AWS4-HMAC-SHA256-EVENTS).
type UnsupportedError struct {
	Reason string
	scheme string
}

func (e *UnsupportedError) Error() string {
	return "awssig: " + e.scheme + " is not supported"
}

func unsupported(reason, scheme string) error {
	return &UnsupportedError{Reason: reason, scheme: scheme}
}

// MalformedError is a SigV4 signature, or an aws-chunked body, that cannot
// be checked as it stands. Reason is stable, for audit:
//
//	algorithm_unknown         an AWS4-* algorithm other than AWS4-HMAC-SHA256
//	authorization_malformed   the Authorization header's syntax
//	credential_malformed      the credential scope or its access key id
//	signed_headers_malformed  missing, not lowercase, not strictly ascending
//	signed_headers_lack_host  host is not signed
//	signed_headers_lack_date  x-amz-date is not signed (header signature)
//	date_malformed            X-Amz-Date missing, malformed, or not the scope's day
//	signature_malformed       missing, or not 64 lowercase hex digits
//	expires_malformed         X-Amz-Expires not 1..604800 seconds
//	payload_hash_malformed    x-amz-content-sha256, or a body hash, unusable
//	query_malformed           undecodable query, or a signing parameter twice
//	signed_twice              both an Authorization header and a presigned query
//	credentials_malformed     the credentials given to Resign
//	chunk_malformed           an aws-chunked frame's syntax
//	chunk_too_large           a chunk above MaxChunk
//	chunk_truncated           the body ended inside a frame or before the final chunk
//	trailer_malformed         the trailers' syntax or size
type MalformedError struct {
	Reason string
	what   string
}

func (e *MalformedError) Error() string { return "awssig: " + e.what }

func malformed(reason, what string) error {
	return &MalformedError{Reason: reason, what: what}
}
