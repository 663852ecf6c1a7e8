// Package fleetclient is the Go client of Fleet's HTTP API: one method per
// route, taking and returning the types of shared/fleetapi that the API
// itself encodes, so what the OpenAPI test checks is what a caller gets.
// It imports neither Fleet, its store nor the AWS SDK: a program links
// only this, fleetapi and the standard library.
//
// Its contracts with a caller:
//   - An answer that is not 2xx is an *Error carrying the API's status,
//     code, message and details. A route whose refusal is also its answer
//     (a dispatch a host refused, a verb or a drain the host refused)
//     returns the decoded answer together with the *Error.
//   - A request is retried only where repeating it cannot act twice: GETs,
//     cancel, drain, resume and probes, and a dispatch, which always
//     carries an idempotency key (the caller's, or one generated for the
//     call and reused on each of its retries), so a dispatch whose answer
//     was lost is answered by the run it created. Input and retry are never
//     repeated: typing twice, or retrying a run twice, is the caller's call.
//     Retried are a connection that failed, 429, 502, 503 and 504, within
//     MaxAttempts, after Retry-After when the API sends one.
//   - Follow reads a run's SSE stream to its end, resuming with
//     Last-Event-ID across the stream's planned ends and reconnecting after
//     a dropped connection, and hands each event once, in order. Only the
//     stream's done message ends it: a run queued (waiting for a host)
//     is live like a running one, however long it stays silent.
//   - The token is sent only in the Authorization header and never appears
//     in an error.
package fleetclient

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/version"
)

// Options configure a Client. Only BaseURL is required.
type Options struct {
	// BaseURL is Fleet's API, e.g. https://abc.execute-api.eu-west-1.amazonaws.com
	// or http://127.0.0.1:8080 (make dev): an absolute http or https URL,
	// a trailing slash allowed.
	BaseURL string
	// Token is the caller's (or the admin's) bearer token. It is sent to
	// BaseURL's origin and StreamURL's, never to another.
	Token string
	// StreamURL is the stream's base URL when it is served on another
	// origin than the API (the stream function's URL in AWS: the
	// StreamUrl output, RUNFLEET_STREAM_URL). Empty: the stream is on
	// the API's origin (the local stack), and Follow refuses a stream
	// URL elsewhere rather than send it the token.
	StreamURL string
	// HTTPClient sends the requests; nil is a client of its own with no
	// overall timeout (a stream lasts as long as its run), each request
	// other than the stream bounded by RequestTimeout. The client uses a
	// copy whose redirects never carry the token to another origin.
	HTTPClient *http.Client
	// RequestTimeout bounds one attempt of a request that is not a stream;
	// zero is 70 s (a long-poll of events waits up to 20 s, a host call
	// behind a verb a few more).
	RequestTimeout time.Duration
	// MaxAttempts bounds the tries of a retried request; zero is 4.
	MaxAttempts int
	// Wait waits d or until ctx ends (between retries, before a stream
	// reconnects); nil waits on a real timer. Tests inject their clock.
	Wait func(ctx context.Context, d time.Duration) error
	// Rand is the source of generated idempotency keys; nil is crypto/rand.
	Rand io.Reader
	// UserAgent names the program; "runfleet-go/<version>" is appended.
	UserAgent string
}

// Client calls Fleet's API. It is safe for concurrent use.
type Client struct {
	base        string
	token       string
	origins     []string // where the token may go: the API's and the stream's
	http        *http.Client
	timeout     time.Duration
	maxAttempts int
	wait        func(context.Context, time.Duration) error
	rand        io.Reader
	userAgent   string
}

// New checks the options and returns a Client.
func New(o Options) (*Client, error) {
	base := strings.TrimRight(strings.TrimSpace(o.BaseURL), "/")
	if err := checkBaseURL(base); err != nil {
		return nil, err
	}
	if o.StreamURL != "" {
		if err := fleetapi.CheckBaseURL(strings.TrimSpace(o.StreamURL)); err != nil {
			return nil, fmt.Errorf("fleetclient: stream URL %w", err)
		}
	}
	if strings.ContainsAny(o.Token, "\r\n") {
		// Named without the value: a token never appears in an error.
		return nil, errors.New("fleetclient: the token holds a line break; it cannot be sent as a header")
	}
	c := &Client{base: base, token: o.Token, origins: []string{originOfRaw(base)}, http: o.HTTPClient, timeout: o.RequestTimeout,
		maxAttempts: o.MaxAttempts, wait: o.Wait, rand: o.Rand}
	c.http = keepTokenOnOrigin(o.HTTPClient)
	if c.timeout <= 0 {
		c.timeout = 70 * time.Second
	}
	if c.maxAttempts <= 0 {
		c.maxAttempts = 4
	}
	if c.wait == nil {
		c.wait = realWait
	}
	if c.rand == nil {
		c.rand = rand.Reader
	}
	if o.StreamURL != "" {
		c.origins = append(c.origins, originOfRaw(strings.TrimSpace(o.StreamURL)))
	}
	c.userAgent = strings.TrimSpace(o.UserAgent + " runfleet-go/" + version.Version)
	return c, nil
}

// BaseURL is the API's base URL as the client uses it (no trailing slash).
func (c *Client) BaseURL() string { return c.base }

func checkBaseURL(raw string) error {
	if raw == "" {
		return errors.New("fleetclient: no API URL: set it (e.g. http://127.0.0.1:8080)")
	}
	if err := fleetapi.CheckBaseURL(raw); err != nil {
		return fmt.Errorf("fleetclient: API URL %w", err)
	}
	return nil
}

func realWait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Error is an answer of the API that is not 2xx: its status and the
// fleetapi.Error body (code, message, details).
type Error struct {
	Status  int
	Code    string
	Message string
	// Details is the error's structured details as the API sent them
	// (no_eligible_host: a fleetapi.NoEligibleHost), or nil.
	Details json.RawMessage
	// RetryAfter is the API's Retry-After, when it sent one.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	if e.Code != "" {
		return fmt.Sprintf("%s (%s, HTTP %d)", msg, e.Code, e.Status)
	}
	return fmt.Sprintf("%s (HTTP %d)", msg, e.Status)
}

// IsCode reports whether err is an *Error with the given code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// NoEligibleHost decodes the details of a no_eligible_host refusal.
func (e *Error) NoEligibleHost() (fleetapi.NoEligibleHost, bool) {
	var d fleetapi.NoEligibleHost
	if e.Code != fleetapi.CodeNoEligibleHost || len(e.Details) == 0 || json.Unmarshal(e.Details, &d) != nil {
		return fleetapi.NoEligibleHost{}, false
	}
	return d, true
}

// call is one API request: its route and how it may be retried.
type call struct {
	method, path string
	query        url.Values
	body         any // JSON-encoded when not nil
	headers      map[string]string
	retry        bool
}

// answer is a response read whole.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// maxAnswer bounds an answer read whole: the API's pages stop at 4 MiB of
// records (egress), and Lambda's answers at 6 MB.
const maxAnswer = 16 << 20

// do sends cl, retrying as the package comment says, and returns the last
// answer; a non-2xx answer is returned with its *Error.
func (c *Client) do(ctx context.Context, cl call) (answer, error) {
	var payload []byte
	if cl.body != nil {
		var err error
		if payload, err = json.Marshal(cl.body); err != nil {
			return answer{}, fmt.Errorf("fleetclient: encoding the %s %s body: %w", cl.method, cl.path, err)
		}
	}
	attempts := 1
	if cl.retry {
		attempts = c.maxAttempts
	}
	var last error
	for attempt := 1; ; attempt++ {
		a, err := c.once(ctx, cl, payload)
		if err == nil {
			if a.status >= 200 && a.status < 300 {
				return a, nil
			}
			apiErr := toError(a)
			if attempt >= attempts || !retriedStatus(a.status) {
				return a, apiErr
			}
			last = apiErr
			if err := c.wait(ctx, backoff(attempt, apiErr.RetryAfter)); err != nil {
				return a, apiErr
			}
			continue
		}
		if ctx.Err() != nil {
			return answer{}, ctx.Err()
		}
		last = err
		if attempt >= attempts {
			return answer{}, last
		}
		if err := c.wait(ctx, backoff(attempt, 0)); err != nil {
			return answer{}, last
		}
	}
}

// once sends one attempt and reads its answer whole.
func (c *Client) once(ctx context.Context, cl call, payload []byte) (answer, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	u := c.base + cl.path
	if len(cl.query) > 0 {
		u += "?" + cl.query.Encode()
	}
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, cl.method, u, body)
	if err != nil {
		return answer{}, fmt.Errorf("fleetclient: %s %s: %w", cl.method, cl.path, err)
	}
	c.authorize(req)
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	for k, v := range cl.headers {
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return answer{}, transportError(cl.method, cl.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return answer{}, transportError(cl.method, cl.path, err)
	}
	if len(b) > maxAnswer {
		return answer{}, fmt.Errorf("fleetclient: %s %s: the answer is over %d MiB", cl.method, cl.path, maxAnswer>>20)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// keepTokenOnOrigin is hc (nil: a new client) with a redirect rule that
// drops the Authorization header when a redirect leaves the origin of the
// request it was set on. net/http's own rule keeps it for the same host
// name on any port or scheme and for any subdomain (client.go,
// shouldCopyHeaderOnRedirect): on a shared machine another port is
// another user's listener, and http:// puts the token on the wire in
// clear. hc itself is not modified; its own CheckRedirect still applies.
func keepTokenOnOrigin(hc *http.Client) *http.Client {
	cp := &http.Client{}
	if hc != nil {
		*cp = *hc
	}
	theirs := cp.CheckRedirect
	cp.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if originOf(req.URL) != originOf(via[0].URL) {
			req.Header.Del("Authorization")
		}
		if theirs != nil {
			return theirs(req, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	return cp
}

// originOf is u's origin (RFC 6454): scheme, host and port, the default
// port made explicit.
func originOf(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[strings.ToLower(u.Scheme)]
	}
	return strings.ToLower(u.Scheme) + "://" + strings.ToLower(u.Hostname()) + ":" + port
}

func originOfRaw(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return originOf(u)
}

func (c *Client) authorize(req *http.Request) {
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("User-Agent", c.userAgent)
}

// transportError names the route and the failure; net/http's errors name
// the URL, which holds no token (the token is a header).
func transportError(method, path string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return fmt.Errorf("fleetclient: %s %s: %w", method, path, err)
}

func retriedStatus(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// backoff is the wait before attempt+1: the API's Retry-After when given,
// else 250 ms doubling to at most 8 s.
func backoff(attempt int, retryAfter time.Duration) time.Duration {
	if retryAfter > 0 {
		return retryAfter
	}
	d := 250 * time.Millisecond << min(attempt-1, 5)
	return min(d, 8*time.Second)
}

// toError reads a non-2xx answer's fleetapi.Error body; a body that is not
// one (a proxy's page) leaves the status to speak.
func toError(a answer) *Error {
	e := &Error{Status: a.status}
	var body fleetapi.Error
	if json.Unmarshal(a.body, &body) == nil {
		e.Code, e.Message, e.Details = body.Code, body.Error, body.Details
	}
	if e.Message == "" {
		e.Message = strings.TrimSpace(http.StatusText(a.status))
	}
	if s := a.header.Get("Retry-After"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n >= 0 {
			e.RetryAfter = time.Duration(n) * time.Second
		}
	}
	return e
}

// decodeInto decodes a's body into v (a pointer).
func decodeInto(cl call, a answer, v any) error {
	if err := json.Unmarshal(a.body, v); err != nil {
		return fmt.Errorf("fleetclient: %s %s answered %d with a body that is not its JSON: %w", cl.method, cl.path, a.status, err)
	}
	return nil
}

// get and send are do for the common shapes: the answer decoded into out
// on 2xx, and on a non-2xx whose body is also the route's answer
// (refusedToo) decoded as well, returned with its *Error.
func (c *Client) send(ctx context.Context, cl call, out any, refusedToo bool) (int, error) {
	a, err := c.do(ctx, cl)
	var apiErr *Error
	switch {
	case err == nil:
		return a.status, decodeInto(cl, a, out)
	case errors.As(err, &apiErr) && refusedToo && a.status == http.StatusConflict:
		if derr := decodeInto(cl, a, out); derr != nil {
			return a.status, errors.Join(err, derr)
		}
		return a.status, err
	}
	return a.status, err
}

// newKey is a generated idempotency key: 128 random bits, hex.
func (c *Client) newKey() (string, error) {
	b := make([]byte, 16)
	if _, err := io.ReadFull(c.rand, b); err != nil {
		return "", fmt.Errorf("fleetclient: generating an idempotency key: %w", err)
	}
	return "rf-" + hex.EncodeToString(b), nil
}

func pathOf(parts ...string) string {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString("/")
		b.WriteString(url.PathEscape(p))
	}
	return b.String()
}
