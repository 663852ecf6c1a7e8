// Package api owns Fleet's HTTP API as a Lambda handler: an API Gateway v2
// (HTTP API, payload 2.0) request in, a response out. It holds the route
// table, authentication and access per route, strict request decoding and
// the one mapping from errors to statuses; the work itself is package
// fleet's. The local stack serves the same handler through lambdahttp.
package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/runfleet/runfleet/shared/auth"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/dashboard"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/store"
)

// DefaultMaxBodyBytes is the largest request body accepted (1 MiB).
const DefaultMaxBodyBytes = 1 << 20

// Log field names of the request line.
const (
	logMethod    = "method"
	logRoute     = "route"
	logStatus    = "status"
	logOwner     = "ownerId"
	logRequestID = "requestId"
	logLatency   = "latencyMs"
	logErr       = "err"
)

// Config configures a Handler.
type Config struct {
	// Fleet does the work. Required.
	Fleet *fleet.Fleet
	// Auth turns bearer tokens into callers. Required.
	Auth *auth.Authenticator
	// Logger gets one line per request and every fault. Required.
	Logger *slog.Logger
	// Clock reads the time (healthz, latency); nil is the wall clock.
	Clock clock.Clock
	// MaxBodyBytes bounds a request body; zero is DefaultMaxBodyBytes.
	MaxBodyBytes int
	// StreamURL is the stream's public base URL (the stream function's URL
	// in AWS), for the links of a run; empty means the API's own base, as
	// where one server answers both (the local stack).
	StreamURL string
	// Parked, when set, is called each time a long-poll of the events
	// route (wait=) has polled and armed its timer, just before it waits
	// on it; the poll waits for Parked to return (it must return once ctx
	// is done). Tests that drive a fake clock move it only then. Nil:
	// nothing is called.
	Parked func(ctx context.Context)
}

// Validate reports a missing required field.
func (c Config) Validate() error {
	var errs []error
	if c.Fleet == nil {
		errs = append(errs, errors.New("api: Config.Fleet is required"))
	}
	if c.Auth == nil {
		errs = append(errs, errors.New("api: Config.Auth is required"))
	}
	if c.Logger == nil {
		errs = append(errs, errors.New("api: Config.Logger is required"))
	}
	if c.StreamURL != "" {
		if err := fleetapi.CheckBaseURL(c.StreamURL); err != nil {
			errs = append(errs, fmt.Errorf("api: Config.StreamURL: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Handler is the API. It is safe for concurrent use.
type Handler struct {
	fleet   *fleet.Fleet
	auth    *auth.Authenticator
	log     *slog.Logger
	clock   clock.Clock
	maxBody int
	stream  string
	parked  func(ctx context.Context)
	dash    *dashboard.Site
	routes  []route
}

// New checks cfg and builds the handler.
func New(cfg Config) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h := &Handler{fleet: cfg.Fleet, auth: cfg.Auth, log: cfg.Logger, clock: cfg.Clock, maxBody: cfg.MaxBodyBytes,
		stream: strings.TrimSuffix(cfg.StreamURL, "/"), parked: cfg.Parked}
	if h.clock == nil {
		h.clock = clock.Real{}
	}
	if h.maxBody <= 0 {
		h.maxBody = DefaultMaxBodyBytes
	}
	dash, err := dashboard.New(dashboard.Config{StreamURL: h.stream})
	if err != nil {
		return nil, err
	}
	h.dash = dash
	h.routes = h.routeTable()
	for i := range h.routes {
		if err := h.routes[i].compile(); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// access is who may call a route.
type access int

const (
	public access = iota
	callerOnly
	adminOnly
)

// route is one entry of the table: method and pattern ("/fleet/hosts/{id}"),
// who may call it, the query parameters it takes, and its handler.
type route struct {
	method  string
	pattern string
	access  access
	query   []string
	handle  func(ctx context.Context, rq *request) (int, any, error)

	segments []string
}

func (r *route) compile() error {
	if !strings.HasPrefix(r.pattern, "/") {
		return fmt.Errorf("api: route pattern %q must start with /", r.pattern)
	}
	r.segments = strings.Split(strings.TrimPrefix(r.pattern, "/"), "/")
	return nil
}

// match reports whether path's segments fit the pattern, capturing {name}s.
func (r *route) match(segs []string) (map[string]string, bool) {
	if len(segs) != len(r.segments) {
		return nil, false
	}
	params := map[string]string{}
	for i, s := range r.segments {
		if strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") {
			v, err := url.PathUnescape(segs[i])
			if err != nil || v == "" {
				return nil, false
			}
			params[s[1:len(s)-1]] = v
			continue
		}
		if s != segs[i] {
			return nil, false
		}
	}
	return params, true
}

// request is what a route handler gets.
type request struct {
	caller  store.Caller
	params  map[string]string
	query   query
	body    []byte
	headers map[string]string
	links   linker
}

// header returns a request header by its lower-case name.
func (rq *request) header(name string) (string, bool) {
	v, ok := rq.headers[name]
	return v, ok
}

// Handle serves one API Gateway v2 request. It never returns an error: every
// failure is an HTTP answer (a fault is logged and answered 500).
func (h *Handler) Handle(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	start := h.clock.Now()
	method := ev.RequestContext.HTTP.Method
	rt, rq, err := h.prepare(ctx, ev)
	routeName := "unmatched"
	if rt != nil {
		routeName = rt.method + " " + rt.pattern
	}
	var status int
	var answer any
	if err == nil {
		status, answer, err = rt.handle(ctx, rq)
	}
	var resp events.APIGatewayV2HTTPResponse
	attrs := []any{slog.String(logMethod, method), slog.String(logRoute, routeName),
		slog.String(logRequestID, ev.RequestContext.RequestID)}
	if rq != nil && rq.caller.OwnerID != "" {
		attrs = append(attrs, slog.String(logOwner, rq.caller.OwnerID))
	}
	if err != nil {
		st, body, fault := ErrorStatus(err)
		if fault {
			h.log.ErrorContext(ctx, "request failed", append(attrs, slog.String(logErr, err.Error()))...)
		}
		resp = jsonResponse(st, body)
		if st == http.StatusUnauthorized {
			resp.Headers["www-authenticate"] = "Bearer"
		}
		if re := (*requestError)(nil); errors.As(err, &re) && re.status == http.StatusMethodNotAllowed {
			resp.Headers["allow"] = h.allowed(ev.RawPath)
		}
	} else if text, ok := answer.(textAnswer); ok {
		resp = textResponse(status, text)
	} else {
		resp = jsonResponse(status, answer)
	}
	h.log.InfoContext(ctx, "request", append(attrs, slog.Int(logStatus, resp.StatusCode),
		slog.Int64(logLatency, h.clock.Now().Sub(start).Milliseconds()))...)
	return resp, nil
}

// prepare matches the route, authenticates and authorises the caller, and
// reads the query and body. The returned route is nil when none matched.
func (h *Handler) prepare(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (*route, *request, error) {
	segs := pathSegments(ev.RawPath)
	method := ev.RequestContext.HTTP.Method
	var rt *route
	var params map[string]string
	pathKnown := false
	for i := range h.routes {
		p, ok := h.routes[i].match(segs)
		if !ok {
			continue
		}
		pathKnown = true
		if h.routes[i].method == method {
			rt, params = &h.routes[i], p
			break
		}
	}
	if rt == nil {
		if pathKnown {
			return nil, nil, &requestError{status: http.StatusMethodNotAllowed, code: codeMethodNotAllowed,
				message: fmt.Sprintf("method %s is not allowed here", method)}
		}
		return nil, nil, &requestError{status: http.StatusNotFound, code: codeRouteNotFound, message: "no such route"}
	}

	rq := &request{params: params, headers: lowerKeys(ev.Headers)}
	rq.links = linker{api: requestBase(ev, rq.headers), stream: h.stream, now: h.now()}
	if rq.links.stream == "" {
		rq.links.stream = rq.links.api
	}
	if rt.access != public {
		authz, _ := rq.header("authorization")
		c, err := h.auth.Authenticate(ctx, authz)
		if err != nil {
			return rt, rq, err
		}
		rq.caller = c
		if rt.access == adminOnly && !c.Admin {
			return rt, rq, adminRequired("this route requires an admin token")
		}
	}
	q, err := parseQuery(ev.RawQueryString, rt.query)
	if err != nil {
		return rt, rq, err
	}
	rq.query = q
	body, err := h.readBody(ev)
	if err != nil {
		return rt, rq, err
	}
	if len(strings.TrimSpace(string(body))) > 0 && (rt.method == http.MethodGet || rt.method == http.MethodDelete) {
		return rt, rq, badRequest("%s %s takes no request body", rt.method, rt.pattern)
	}
	rq.body = body
	return rt, rq, nil
}

func (h *Handler) readBody(ev events.APIGatewayV2HTTPRequest) ([]byte, error) {
	tooLarge := &requestError{status: http.StatusRequestEntityTooLarge, code: codeBodyTooLarge,
		message: fmt.Sprintf("the request body is larger than %d bytes", h.maxBody)}
	if !ev.IsBase64Encoded {
		if len(ev.Body) > h.maxBody {
			return nil, tooLarge
		}
		return []byte(ev.Body), nil
	}
	if base64.StdEncoding.DecodedLen(len(ev.Body)) > h.maxBody+3 {
		return nil, tooLarge
	}
	b, err := base64.StdEncoding.DecodeString(ev.Body)
	if err != nil {
		return nil, badRequest("the request body is not valid base64")
	}
	if len(b) > h.maxBody {
		return nil, tooLarge
	}
	return b, nil
}

// allowed lists the methods of the routes matching path, for a 405's Allow.
func (h *Handler) allowed(path string) string {
	segs := pathSegments(path)
	var methods []string
	for i := range h.routes {
		if _, ok := h.routes[i].match(segs); ok && !slices.Contains(methods, h.routes[i].method) {
			methods = append(methods, h.routes[i].method)
		}
	}
	sort.Strings(methods)
	return strings.Join(methods, ", ")
}

// pathSegments splits a raw path; one trailing slash is ignored.
func pathSegments(raw string) []string {
	p := strings.TrimPrefix(raw, "/")
	if len(p) > 1 {
		p = strings.TrimSuffix(p, "/")
	}
	return strings.Split(p, "/")
}

func lowerKeys(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[strings.ToLower(k)] = v
	}
	return out
}

// EncodeJSON is an answer's body as the API writes it (the stream's
// refusals too): JSON ending in a newline, without HTML escaping (the
// answers are JSON with nosniff, never HTML, and are read in terminals,
// where "\u003ctoken\u003e" would stand for "<token>").
func EncodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func jsonResponse(status int, v any) events.APIGatewayV2HTTPResponse {
	b, err := EncodeJSON(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":"internal error","code":"internal"}` + "\n")
	}
	return events.APIGatewayV2HTTPResponse{
		StatusCode: status,
		Headers: map[string]string{
			"content-type":           "application/json",
			"cache-control":          "no-store",
			"x-content-type-options": "nosniff",
		},
		Body: string(b),
	}
}

// textAnswer is a route's answer that is not JSON (GET /metrics, the
// dashboard's files).
type textAnswer struct {
	contentType string
	body        []byte
	// headers are more response headers, by lower-case name.
	headers map[string]string
}

func textResponse(status int, t textAnswer) events.APIGatewayV2HTTPResponse {
	resp := events.APIGatewayV2HTTPResponse{
		StatusCode: status,
		Headers: map[string]string{
			"content-type":           t.contentType,
			"cache-control":          "no-store",
			"x-content-type-options": "nosniff",
		},
		Body: string(t.body),
	}
	if t.contentType == "" {
		delete(resp.Headers, "content-type") // a 304: no body, so nothing to type
	}
	for k, v := range t.headers {
		resp.Headers[k] = v
	}
	return resp
}

// now is the handler's clock reading in UTC.
func (h *Handler) now() time.Time { return h.clock.Now().UTC() }
