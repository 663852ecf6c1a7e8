package api

import (
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/runfleet/runfleet/shared/fleetapi"
)

// linker makes a run's links (fleetapi.RunLinks: absolute, so a client
// follows them rather than assembling paths from templates) from the API's
// public base URL (as the request reached it) and the stream's: the stream
// is on the stream function's URL in AWS (API Gateway cannot stream), on
// the API's address locally.
type linker struct {
	api    string
	stream string
	// now is when the request was read: what a view shows relative to
	// the present (a waiting run's wait so far) is up to it.
	now time.Time
}

func (l linker) run(fleetRunID string) fleetapi.RunLinks {
	self := l.api + "/fleet/runs/" + url.PathEscape(fleetRunID)
	return fleetapi.RunLinks{Self: self, Events: self + "/events", Stream: l.stream + "/fleet/runs/" + url.PathEscape(fleetRunID) + "/stream",
		Egress: self + "/egress"}
}

// requestBase is the API's base URL as the caller reached it: the scheme
// API Gateway (or the local adapter) says it was reached by (https unless
// told otherwise), the domain name, and the stage unless it is $default
// (whose routes sit at the root).
func requestBase(ev events.APIGatewayV2HTTPRequest, headers map[string]string) string {
	scheme := "https"
	if p := strings.ToLower(strings.TrimSpace(firstOf(headers["x-forwarded-proto"]))); p == "http" {
		scheme = "http"
	}
	host := ev.RequestContext.DomainName
	if host == "" {
		host = headers["host"]
	}
	base := scheme + "://" + host
	if st := ev.RequestContext.Stage; st != "" && st != "$default" {
		base += "/" + url.PathEscape(st)
	}
	return base
}

// firstOf is the first of a comma-joined header's values (API Gateway joins
// repeated headers, and proxies append to X-Forwarded-Proto).
func firstOf(v string) string {
	first, _, _ := strings.Cut(v, ",")
	return first
}
