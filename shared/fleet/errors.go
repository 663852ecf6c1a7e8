package fleet

import "fmt"

// Kind is what went wrong, as the API needs to know it: the API maps each
// kind to one HTTP status (in its single error-mapping function).
type Kind int

const (
	// KindInvalid: the request is malformed (400).
	KindInvalid Kind = iota + 1
	// KindForbidden: the caller may not do this (403).
	KindForbidden
	// KindNotFound: the named thing does not exist for this caller (404).
	KindNotFound
	// KindConflict: the state forbids it now (409).
	KindConflict
)

// Machine codes carried by errors, for clients that branch on them.
const (
	CodeInvalid             = "invalid_request"
	CodeUnknownCredential   = "unknown_credential_ref"
	CodeOutOfScope          = "out_of_scope"
	CodeNotFound            = "not_found"
	CodeHostExists          = "host_exists"
	CodeHostInUse           = "host_in_use"
	CodeOwnerExists         = "owner_exists"
	CodeOwnerReserved       = "owner_reserved"
	CodeNoEligibleHost      = "no_eligible_host"
	CodeIdempotencyMismatch = "idempotency_key_reused"
	CodeInFlight            = "dispatch_in_flight"
	// CodeCredentialUnavailable: a brokered key of a dispatch could not
	// be minted; nothing was started (Details: a CredentialRefusal).
	CodeCredentialUnavailable = "credential_unavailable"
)

// Error is a failure the caller caused or can act on. Its Message is shown to
// the caller as is, so it names the field or cause and never carries a
// secret or an internal detail. Any other error from this package is a
// fault: the API logs it and answers 500.
type Error struct {
	Kind    Kind
	Code    string
	Message string
	// Details is extra JSON for the caller (e.g. the routing refusal).
	Details any
}

func (e *Error) Error() string { return e.Message }

func invalid(format string, args ...any) *Error {
	return &Error{Kind: KindInvalid, Code: CodeInvalid, Message: fmt.Sprintf(format, args...)}
}

func forbidden(format string, args ...any) *Error {
	return &Error{Kind: KindForbidden, Code: CodeOutOfScope, Message: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) *Error {
	return &Error{Kind: KindNotFound, Code: CodeNotFound, Message: fmt.Sprintf(format, args...)}
}

func conflict(code string, details any, format string, args ...any) *Error {
	return &Error{Kind: KindConflict, Code: code, Message: fmt.Sprintf(format, args...), Details: details}
}
