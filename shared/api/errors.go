package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/runfleet/runfleet/shared/auth"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/fleetapi"
)

// requestError is a failure the API itself finds in a request (decoding,
// routing, access) with the status it deserves.
type requestError struct {
	status  int
	code    string
	message string
}

func (e *requestError) Error() string { return e.message }

// NewRequestError is a failure found in a request itself, answered with
// status and code (for the stream handler's own checks).
func NewRequestError(status int, code, format string, args ...any) error {
	return &requestError{status: status, code: code, message: fmt.Sprintf(format, args...)}
}

// Codes the stream handler answers with.
const (
	CodeRouteNotFound    = codeRouteNotFound
	CodeMethodNotAllowed = codeMethodNotAllowed
)

func badRequest(format string, args ...any) *requestError {
	return &requestError{status: http.StatusBadRequest, code: fleet.CodeInvalid, message: fmt.Sprintf(format, args...)}
}

// adminRequired is the 403 of an admin-only route or view asked for
// without an admin token.
func adminRequired(message string) *requestError {
	return &requestError{status: http.StatusForbidden, code: codeAdminRequired, message: message}
}

// jsonError is a 400 for a body that is not one well-formed JSON value or
// gives a key twice (invalid_json); a body that is JSON but not what the
// route takes is badRequest's (invalid_request).
func jsonError(format string, args ...any) *requestError {
	return &requestError{status: http.StatusBadRequest, code: fleetapi.CodeInvalidJSON, message: fmt.Sprintf(format, args...)}
}

// Machine codes the API adds to fleet's.
const (
	codeUnauthenticated  = "unauthenticated"
	codeAdminRequired    = "admin_required"
	codeRouteNotFound    = "route_not_found"
	codeMethodNotAllowed = "method_not_allowed"
	codeBodyTooLarge     = "body_too_large"
	codeInternal         = "internal"
)

// ErrorStatus maps every error kind to its HTTP status and the body shown to
// the caller, and reports whether the error is a fault. It is the one place
// that does so, for the API and the stream handler alike: a kind it does
// not know is a fault, answered 500 with a generic message (the caller
// logs it), never with its text.
func ErrorStatus(err error) (int, fleetapi.Error, bool) {
	var re *requestError
	var fe *fleet.Error
	switch {
	case errors.As(err, &re):
		return re.status, fleetapi.Error{Error: re.message, Code: re.code}, false
	case errors.As(err, &fe) && fleetStatus(fe.Kind) != 0:
		details, derr := toErrorDetails(fe.Details)
		if derr != nil {
			break // details without a view: a fault, never shown as they are
		}
		return fleetStatus(fe.Kind), fleetapi.Error{Error: fe.Message, Code: fe.Code, Details: details}, false
	case errors.Is(err, auth.ErrUnauthenticated):
		return http.StatusUnauthorized, fleetapi.Error{Error: err.Error(), Code: codeUnauthenticated}, false
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable, fleetapi.Error{Error: "the request ran out of time; retry it", Code: "timeout"}, true
	}
	return http.StatusInternalServerError, fleetapi.Error{Error: "internal error", Code: codeInternal}, true
}

// outcomeStatus is the one mapping from a forwarded verb's outcome (the run
// verbs', a host's drain and resume) to its status, as DESIGN.md's
// forwarded verbs state it. 200: the host took it. 409: the host refused
// it, or it certainly never reached the host, so nothing was done: an
// error status with a code, as dispatch answers a host's refusal (the body
// is both the error and the verb's answer). 202: the host did not answer in
// time, or answered 5xx, so it may or may not have acted (RFC 9110's
// Accepted: "might or might not eventually be acted upon"); not an error
// status, because retrying blindly could act twice (an input would be
// typed again), and not 200, because the host confirmed nothing. A
// dispatch whose start goes unanswered is a 2xx with pending: true for the
// same reason.
func outcomeStatus(a fleetapi.Acceptance) int {
	switch a {
	case fleetapi.Accepted:
		return http.StatusOK
	case fleetapi.Refused:
		return http.StatusConflict
	}
	return http.StatusAccepted
}

func fleetStatus(k fleet.Kind) int {
	switch k {
	case fleet.KindInvalid:
		return http.StatusBadRequest
	case fleet.KindForbidden:
		return http.StatusForbidden
	case fleet.KindNotFound:
		return http.StatusNotFound
	case fleet.KindConflict:
		return http.StatusConflict
	}
	return 0
}
