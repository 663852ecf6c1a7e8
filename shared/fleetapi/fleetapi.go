// Package fleetapi is Fleet's HTTP API as its callers see it: every request
// body and every answer of the API's routes and of a run's stream (its SSE
// frames' data), and the error body they all share. A client (the CLI, the
// dashboard, a CI job) imports it to speak to Fleet without importing Fleet:
// it holds tagged structs only, no I/O (and the one check of a base URL,
// which Fleet's configuration and the client both apply), and depends on
// nothing but the standard library and the run request (shared/runspec).
//
// The JSON is a contract with deployed callers: fields are added, never
// renamed or removed, and a field's omission rule never changes (one
// deliberate exception, issue 30: an events page past the run's end omits
// nextCursor, which would otherwise name a place no event reached). Each
// answer's keys come in the order Fleet has always written them, and a
// list Fleet writes as [] is never null. The api handler and the stream
// encode these types (shared/api's views.go converts Fleet's records into
// them), and tests/openapi_test.go decodes real answers into them against
// infra/openapi.yaml. Routes, statuses and scoping:
// DESIGN.md, section "Fleet's HTTP API" for the rest.
package fleetapi

import (
	"fmt"
	"net/url"
	"time"
)

// CheckBaseURL accepts an absolute http or https URL with a host and no
// query or fragment: a base that paths are appended to (the API's, the
// stream's).
func CheckBaseURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return fmt.Errorf("%q is not a URL: want an absolute http or https URL, e.g. http://127.0.0.1:8080", raw)
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
		return fmt.Errorf("%q: want an absolute http or https URL, e.g. http://127.0.0.1:8080", raw)
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return fmt.Errorf("%q: want a base URL without credentials, query or fragment", raw)
	}
	return nil
}

// Health is GET /healthz. Its keys are in the order Fleet writes them.
type Health struct {
	OK      bool      `json:"ok"`
	Product string    `json:"product"`
	TS      time.Time `json:"ts"`
	Version string    `json:"version"`
}
