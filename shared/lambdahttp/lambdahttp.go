// Package lambdahttp owns the bridge from net/http to the Lambda events that
// Fleet's handlers take: an http.Handler that turns a request into an API
// Gateway v2 (HTTP API, payload 2.0) event, calls the Lambda handler, and
// writes its response back. The local stack serves the api handler through
// it, so what runs locally is what runs in Lambda.
package lambdahttp

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"

	"github.com/runfleet/runfleet/shared/clock"
)

// APIGatewayV2Func is a Lambda handler for API Gateway HTTP API events.
type APIGatewayV2Func func(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error)

// MaxBodyBytes is API Gateway's payload limit (10 MB); a larger body is
// refused with 413 before the handler runs, as API Gateway does.
const MaxBodyBytes = 10 << 20

// Config configures the adapter.
type Config struct {
	// Handler is the Lambda handler. Required.
	Handler APIGatewayV2Func
	// Logger receives handler errors. Required.
	Logger *slog.Logger
	// Clock stamps requestContext.time; nil is the wall clock.
	Clock clock.Clock
	// Stage is requestContext.stage; empty is "$default".
	Stage string
	// NewRequestID makes requestContext.requestId; nil numbers requests.
	NewRequestID func() string
}

// Handler adapts net/http to an APIGatewayV2Func.
type Handler struct {
	cfg Config
	seq atomic.Uint64
}

// New returns the adapter; it fails if a required field is missing.
func New(cfg Config) (*Handler, error) {
	if cfg.Handler == nil || cfg.Logger == nil {
		return nil, errors.New("lambdahttp: Config.Handler and Config.Logger are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Stage == "" {
		cfg.Stage = "$default"
	}
	return &Handler{cfg: cfg}, nil
}

// ServeHTTP converts, calls and writes back. A handler error is a 500 with
// API Gateway's own body, as in AWS.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ev, err := h.Event(r)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errTooLarge) {
			status = http.StatusRequestEntityTooLarge
		}
		http.Error(w, `{"message":"`+http.StatusText(status)+`"}`, status)
		return
	}
	resp, err := h.cfg.Handler(r.Context(), ev)
	if err != nil {
		h.cfg.Logger.Error("lambdahttp: handler failed", "err", err)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"message":"Internal Server Error"}`)
		return
	}
	WriteResponse(w, resp, h.cfg.Logger)
}

var errTooLarge = errors.New("lambdahttp: body too large")

// Event builds the API Gateway v2 event API Gateway would send for r.
func (h *Handler) Event(r *http.Request) (events.APIGatewayV2HTTPRequest, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return events.APIGatewayV2HTTPRequest{}, fmt.Errorf("lambdahttp: reading the body: %w", err)
	}
	if len(body) > MaxBodyBytes {
		return events.APIGatewayV2HTTPRequest{}, errTooLarge
	}
	now := h.cfg.Clock.Now().UTC()
	headers := map[string]string{}
	var cookies []string
	for name, vals := range r.Header {
		lname := strings.ToLower(name)
		if lname == "cookie" {
			for _, v := range vals {
				for _, c := range strings.Split(v, ";") {
					if c = strings.TrimSpace(c); c != "" {
						cookies = append(cookies, c)
					}
				}
			}
			continue
		}
		// API Gateway joins repeated headers with commas.
		headers[lname] = strings.Join(vals, ",")
	}
	headers["host"] = r.Host
	// API Gateway sets X-Forwarded-Proto itself (the API builds links from
	// it); so does this adapter, from the connection, whatever was sent.
	headers["x-forwarded-proto"] = "http"
	if r.TLS != nil {
		headers["x-forwarded-proto"] = "https"
	}
	queryParams := map[string]string{}
	for k, vals := range r.URL.Query() {
		queryParams[k] = strings.Join(vals, ",")
	}
	sourceIP, _, _ := net.SplitHostPort(r.RemoteAddr)
	requestID := ""
	if h.cfg.NewRequestID != nil {
		requestID = h.cfg.NewRequestID()
	} else {
		requestID = fmt.Sprintf("local-%d", h.seq.Add(1))
	}
	ev := events.APIGatewayV2HTTPRequest{
		Version:               "2.0",
		RouteKey:              "$default",
		RawPath:               r.URL.EscapedPath(),
		RawQueryString:        r.URL.RawQuery,
		Cookies:               cookies,
		Headers:               headers,
		QueryStringParameters: queryParams,
		RequestContext: events.APIGatewayV2HTTPRequestContext{
			RouteKey:   "$default",
			Stage:      h.cfg.Stage,
			RequestID:  requestID,
			DomainName: r.Host,
			Time:       now.Format("02/Jan/2006:15:04:05 -0700"),
			TimeEpoch:  now.UnixMilli(),
			HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{
				Method:    r.Method,
				Path:      r.URL.Path,
				Protocol:  r.Proto,
				SourceIP:  sourceIP,
				UserAgent: r.UserAgent(),
			},
		},
	}
	if len(queryParams) == 0 {
		ev.QueryStringParameters = nil
	}
	if len(body) > 0 {
		if utf8.Valid(body) && isTextual(headers["content-type"]) {
			ev.Body = string(body)
		} else {
			ev.Body = base64.StdEncoding.EncodeToString(body)
			ev.IsBase64Encoded = true
		}
	}
	return ev, nil
}

// isTextual follows API Gateway: text, JSON, XML and form bodies pass as
// text; anything else (or no content type) is base64-encoded.
func isTextual(contentType string) bool {
	ct := strings.ToLower(contentType)
	return strings.HasPrefix(ct, "text/") || strings.Contains(ct, "json") || strings.Contains(ct, "xml") ||
		strings.HasPrefix(ct, "application/x-www-form-urlencoded") || strings.HasPrefix(ct, "application/javascript")
}

// WriteResponse writes an API Gateway v2 response to w.
func WriteResponse(w http.ResponseWriter, resp events.APIGatewayV2HTTPResponse, log *slog.Logger) {
	hdr := w.Header()
	for k, v := range resp.Headers {
		hdr.Set(k, v)
	}
	for k, vs := range resp.MultiValueHeaders {
		for _, v := range vs {
			hdr.Add(k, v)
		}
	}
	for _, c := range resp.Cookies {
		hdr.Add("Set-Cookie", c)
	}
	body := []byte(resp.Body)
	if resp.IsBase64Encoded {
		decoded, err := base64.StdEncoding.DecodeString(resp.Body)
		if err != nil {
			log.Error("lambdahttp: the handler's base64 body does not decode", "err", err)
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		body = decoded
	}
	status := resp.StatusCode
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	w.Write(body)
}

// DefaultReadHeaderTimeout bounds reading a request's headers on servers
// built around the adapter.
const DefaultReadHeaderTimeout = 10 * time.Second
