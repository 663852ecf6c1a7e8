package awsfront

import (
	"encoding/xml"
	"errors"
	"net/http"
)

// The kinds of the front's own refusals. Each error the checks return wraps
// exactly one of them; answer maps them to what S3 would say.
var (
	// ErrSignature: a header, presigned, chunk or trailer signature does
	// not match what the key's secret gives.
	ErrSignature = errors.New("signature does not match")
	// ErrExpired: a presigned URL used after X-Amz-Date + X-Amz-Expires.
	ErrExpired = errors.New("request has expired")
	// ErrUnknownKey: the front holds no secret for the access key id.
	ErrUnknownKey = errors.New("access key id unknown to the front")
	// ErrToken: the session token does not belong to the temporary key.
	ErrToken = errors.New("security token does not match the key")
	// ErrMalformed: the signature's parts or the aws-chunked framing cannot
	// be read.
	ErrMalformed = errors.New("malformed request")
	// ErrIncompleteBody: the decoded aws-chunked data is not as long as
	// x-amz-decoded-content-length says.
	ErrIncompleteBody = errors.New("decoded body length differs from x-amz-decoded-content-length")
	// ErrBadDigest: a trailing checksum does not match the data.
	ErrBadDigest = errors.New("checksum does not match the data")
	// ErrContentSHA256: the body's SHA-256 differs from the hex digest in
	// x-amz-content-sha256.
	ErrContentSHA256 = errors.New("body SHA-256 differs from x-amz-content-sha256")
)

// answer maps a refusal to the status and S3 error code a client gets.
// It is the one place that does; anything unrecognised is the front's own
// fault and answers 500, so a kit bug never looks like a refusal.
func answer(err error) (status int, code string) {
	switch {
	case errors.Is(err, ErrSignature):
		return http.StatusForbidden, "SignatureDoesNotMatch"
	case errors.Is(err, ErrExpired):
		return http.StatusForbidden, "AccessDenied"
	case errors.Is(err, ErrUnknownKey):
		return http.StatusForbidden, "InvalidAccessKeyId"
	case errors.Is(err, ErrToken):
		return http.StatusBadRequest, "InvalidToken"
	case errors.Is(err, ErrMalformed):
		return http.StatusBadRequest, "InvalidRequest"
	case errors.Is(err, ErrIncompleteBody):
		return http.StatusBadRequest, "IncompleteBody"
	case errors.Is(err, ErrBadDigest):
		return http.StatusBadRequest, "BadDigest"
	case errors.Is(err, ErrContentSHA256):
		return http.StatusBadRequest, "XAmzContentSHA256Mismatch"
	}
	return http.StatusInternalServerError, "InternalError"
}

// s3Error is S3's error document, what SDKs parse into an API error code.
type s3Error struct {
	XMLName   xml.Name `xml:"Error"`
	Code      string   `xml:"Code"`
	Message   string   `xml:"Message"`
	Resource  string   `xml:"Resource,omitempty"`
	RequestID string   `xml:"RequestId"`
}

// writeError answers err as S3 would, with answer's status and code. The
// connection is closed after it: the front may have left a body unread.
func writeError(w http.ResponseWriter, status int, code string, err error, resource, requestID string) {
	body, _ := xml.Marshal(s3Error{Code: code, Message: err.Error(), Resource: resource, RequestID: requestID})
	w.Header().Set("Content-Type", "application/xml")
	w.Header().Set("Connection", "close")
	w.Header().Set("X-Amz-Request-Id", requestID)
	w.WriteHeader(status)
	_, _ = w.Write([]byte(xml.Header))
	_, _ = w.Write(body)
}
