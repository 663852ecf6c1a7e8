package hostproto

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/runfleet/runfleet/shared/version"
)

// DefaultTimeout bounds a host call when ClientConfig.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// Response bodies are bounded so a misbehaving host cannot exhaust Fleet's
// memory; a larger answer is an error that errors.Is(err, ErrTooLarge).
const (
	maxAnswerBytes  = 1 << 20
	maxMetricsBytes = 16 << 20
	// DefaultMaxEventPageBytes bounds an events page: a full page of 1000
	// events of MaxEventData is under 40 MiB as JSON.
	DefaultMaxEventPageBytes = 64 << 20
)

// DialContextFunc dials a host; net.Dialer.DialContext has this shape.
type DialContextFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// ClientConfig configures a Client for one host.
type ClientConfig struct {
	// BaseURL is the host API's root, e.g. https://host-1.example:7070.
	// Required; any path in it prefixes every route.
	BaseURL string
	// Token is the host credential, sent as a bearer token on every route.
	// Required. It never appears in an error or a log.
	Token string
	// CAPEM, when set, is the only CA trusted for the host's TLS; empty
	// trusts the system roots.
	CAPEM string
	// Timeout bounds each call; zero means DefaultTimeout. A sooner ctx
	// deadline wins.
	Timeout time.Duration
	// Transport, when set, carries every request and DialContext and CAPEM
	// are ignored. Fleet shares one transport per CA across clients; nil
	// builds a private one.
	Transport http.RoundTripper
	// DialContext dials the host when Transport is nil; nil uses a
	// net.Dialer.
	DialContext DialContextFunc
	// MaxEventPageBytes bounds an events page's answer; zero is
	// DefaultMaxEventPageBytes.
	MaxEventPageBytes int64
}

// Client calls one host's API. It is safe for concurrent use.
type Client struct {
	base      *url.URL
	token     string
	timeout   time.Duration
	http      *http.Client
	maxEvents int64
}

// NewClient checks cfg and returns a client for the host.
func NewClient(cfg ClientConfig) (*Client, error) {
	base, err := url.Parse(cfg.BaseURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("hostproto: base URL %q is not an absolute http(s) URL", cfg.BaseURL)
	}
	if cfg.Token == "" {
		return nil, errors.New("hostproto: the host credential is empty")
	}
	rt := cfg.Transport
	if rt == nil {
		if rt, err = NewTransport(cfg.CAPEM, cfg.DialContext); err != nil {
			return nil, err
		}
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	base.Path = strings.TrimSuffix(base.Path, "/")
	maxEvents := cfg.MaxEventPageBytes
	if maxEvents <= 0 {
		maxEvents = DefaultMaxEventPageBytes
	}
	return &Client{
		base:      base,
		token:     cfg.Token,
		timeout:   timeout,
		maxEvents: maxEvents,
		// Redirects are not followed: a host API never redirects, and
		// following one would carry the bearer credential elsewhere.
		http: &http.Client{
			Transport: rt,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		},
	}, nil
}

// NewTransport builds the transport for hosts that trust caPEM (only that CA;
// empty: the system roots), dialing with dial (nil: a net.Dialer). Errors from
// dialing and from the TLS handshake are marked so that a TransportError can
// tell "never reached the host" from "no answer".
func NewTransport(caPEM string, dial DialContextFunc) (*http.Transport, error) {
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	if caPEM != "" {
		pool, err := CAPool(caPEM)
		if err != nil {
			return nil, err
		}
		tlsConf.RootCAs = pool
	}
	if dial == nil {
		dial = (&net.Dialer{Timeout: DefaultTimeout, KeepAlive: 30 * time.Second}).DialContext
	}
	return &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dial(ctx, network, addr)
			if err != nil {
				return nil, notDelivered{err}
			}
			return conn, nil
		},
		TLSClientConfig:       tlsConf,
		TLSHandshakeTimeout:   DefaultTimeout,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // the per-call timeout bounds the whole exchange
	}, nil
}

// CAPool parses a PEM bundle of one or more CA certificates.
func CAPool(caPEM string) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	rest := []byte(caPEM)
	n := 0
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("hostproto: caPem certificate %d: %w", n+1, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, errors.New("hostproto: caPem holds no PEM CERTIFICATE block")
	}
	return pool, nil
}

// Health asks GET /healthz.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	err := c.do(ctx, "health", http.MethodGet, "/healthz", nil, nil, &h, maxAnswerBytes)
	return h, err
}

// Start asks POST /runs. The answer has Reused set when the host already knew
// req.ClientToken (200); a start arriving after req.Deadline is refused with
// CodeDeadlinePassed.
func (c *Client) Start(ctx context.Context, req StartRequest) (Run, error) {
	var r Run
	err := c.do(ctx, "start run", http.MethodPost, "/runs", nil, req, &r, maxAnswerBytes)
	return r, err
}

// FindByClientToken asks GET /runs?clientToken= and reports whether the host
// knows a run started with token.
func (c *Client) FindByClientToken(ctx context.Context, token string) (Run, bool, error) {
	var list RunList
	q := url.Values{"clientToken": {token}}
	if err := c.do(ctx, "find run", http.MethodGet, "/runs", q, nil, &list, maxAnswerBytes); err != nil {
		return Run{}, false, err
	}
	for _, r := range list.Runs {
		if r.ClientToken == token {
			return r, true, nil
		}
	}
	return Run{}, false, nil
}

// Get asks GET /runs/{id}; a run the host denies is an error that
// errors.Is(err, ErrRunNotFound).
func (c *Client) Get(ctx context.Context, runID string) (Run, error) {
	var r Run
	err := c.do(ctx, "get run", http.MethodGet, "/runs/"+url.PathEscape(runID), nil, nil, &r, maxAnswerBytes)
	return r, err
}

// Events asks GET /runs/{id}/events for events with sequence > after, at
// most limit of them (0: the host's default). An answer over the client's
// MaxEventPageBytes is an error that errors.Is(err, ErrTooLarge): ask for
// fewer.
func (c *Client) Events(ctx context.Context, runID string, after int64, limit int) (EventPage, error) {
	q := url.Values{"after": {strconv.FormatInt(after, 10)}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var p EventPage
	err := c.do(ctx, "list events", http.MethodGet, "/runs/"+url.PathEscape(runID)+"/events", q, nil, &p, c.maxEvents)
	return p, err
}

// Egress asks GET /runs/{id}/egress: up to limit ledger records after
// a sequence (limit 0: the host's default).
func (c *Client) Egress(ctx context.Context, runID string, after int64, limit int) (EgressPage, error) {
	q := url.Values{"after": {strconv.FormatInt(after, 10)}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var p EgressPage
	err := c.do(ctx, "list egress records", http.MethodGet, "/runs/"+url.PathEscape(runID)+"/egress", q, nil, &p, c.maxEvents)
	return p, err
}

// Input asks POST /runs/{id}/input with any JSON value (nil sends null) and
// returns the host's answer as it came.
func (c *Client) Input(ctx context.Context, runID string, input json.RawMessage) (json.RawMessage, error) {
	if input == nil {
		input = json.RawMessage("null")
	}
	var answer json.RawMessage
	err := c.do(ctx, "send input", http.MethodPost, "/runs/"+url.PathEscape(runID)+"/input", nil, InputRequest{Input: input}, &answer, maxAnswerBytes)
	return answer, err
}

// Cancel asks POST /runs/{id}/cancel.
func (c *Client) Cancel(ctx context.Context, runID string) (Run, error) {
	var r Run
	err := c.do(ctx, "cancel run", http.MethodPost, "/runs/"+url.PathEscape(runID)+"/cancel", nil, struct{}{}, &r, maxAnswerBytes)
	return r, err
}

// Retry asks POST /runs/{id}/retry.
func (c *Client) Retry(ctx context.Context, runID string) (Run, error) {
	var r Run
	err := c.do(ctx, "retry run", http.MethodPost, "/runs/"+url.PathEscape(runID)+"/retry", nil, struct{}{}, &r, maxAnswerBytes)
	return r, err
}

// PutCredentials asks PUT /runs/{id}/credentials: the run's brokered keys'
// fresh values (CredentialsRequest).
func (c *Client) PutCredentials(ctx context.Context, runID string, req CredentialsRequest) (Run, error) {
	var r Run
	err := c.do(ctx, "put run credentials", http.MethodPut, "/runs/"+url.PathEscape(runID)+"/credentials", nil, req, &r, maxAnswerBytes)
	return r, err
}

// Drain asks POST /host/drain: the host stops admitting runs. It answers
// its state after.
func (c *Client) Drain(ctx context.Context) (DrainState, error) {
	var st DrainState
	err := c.do(ctx, "drain host", http.MethodPost, "/host/drain", nil, struct{}{}, &st, maxAnswerBytes)
	return st, err
}

// Resume asks POST /host/resume: the host admits runs again. It answers
// its state after.
func (c *Client) Resume(ctx context.Context) (DrainState, error) {
	var st DrainState
	err := c.do(ctx, "resume host", http.MethodPost, "/host/resume", nil, struct{}{}, &st, maxAnswerBytes)
	return st, err
}

// Metrics asks GET /metrics and returns the Prometheus text as it came.
func (c *Client) Metrics(ctx context.Context) ([]byte, error) {
	var raw []byte
	err := c.do(ctx, "read metrics", http.MethodGet, "/metrics", nil, nil, &raw, maxMetricsBytes)
	return raw, err
}

// do performs one call on path (already escaped). in (when non-nil) is sent as JSON; a 2xx answer is
// decoded into out (a *[]byte receives the body verbatim, nil discards it).
func (c *Client) do(ctx context.Context, op, method, path string, q url.Values, in, out any, limit int64) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	u := *c.base
	u.RawPath = c.base.EscapedPath() + path
	unescaped, err := url.PathUnescape(u.RawPath)
	if err != nil {
		return fmt.Errorf("hostproto: %s: bad path %q: %w", op, path, err)
	}
	u.Path = unescaped
	u.RawQuery = q.Encode()

	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("hostproto: %s: encoding the request: %w", op, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return fmt.Errorf("hostproto: %s: building the request: %w", op, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", version.Product+"-fleet/"+version.Version)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}

	resp, err := c.http.Do(req)
	if err != nil {
		return newTransportError(op, ctx, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return newTransportError(op, ctx, err)
	}
	if int64(len(raw)) > limit {
		return &Error{Op: op, Status: resp.StatusCode, Message: fmt.Sprintf("answer larger than %d bytes", limit), BadResponse: true, TooLarge: true}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return newStatusError(op, resp.StatusCode, raw)
	}
	switch dst := out.(type) {
	case nil:
		return nil
	case *[]byte:
		*dst = raw
		return nil
	default:
		if err := json.Unmarshal(raw, out); err != nil {
			return &Error{Op: op, Status: resp.StatusCode, Message: "answer is not the expected JSON: " + err.Error(), BadResponse: true}
		}
		return nil
	}
}
