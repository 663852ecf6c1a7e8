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
