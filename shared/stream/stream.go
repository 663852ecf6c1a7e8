// Package stream owns the SSE stream of one run's events, GET
// /fleet/runs/{id}/stream: in AWS on the stream function's URL (a Lambda
// Function URL with InvokeMode RESPONSE_STREAM, the path read from
// rawPath), locally on RUNFLEET_ADDR. The core (session) writes SSE to a
// sink; two adapters give it one: HandleLambda (a pipe read by the Lambda
// runtime) and ServeHTTP (a flushed http.ResponseWriter).
//
// Its contracts with a client: each mirrored event is "event: event", its
// sequence the id, its data the events route's shape; once the backlog is
// sent, one "snapshot"; then live events, and "done" once the run is over
// and every event sent (each data a fleetapi type, converted by package
// api). Resuming (?after=, or Last-Event-ID, which wins) neither loses nor
// repeats an event: events are read only up to the run's mirror cursor.
// With ?egress=true the stream also carries the run's egress ledger, one
// "event: egress" per record after each poll's events, read only up to the
// ledger head's cursor; every id is then "<event seq>:<ledger seq>" (the
// two cursors after the message), which Last-Event-ID gives back to resume
// both (?egressAfter= is the ledger's ?after=), and each poll mirrors the
// whole ledger the host holds (fleet.SyncRunEgress), unbatched: the cost
// of watching it. Each poll first pulls the run through from its host
// (fleet.SyncRun). A
// planned end sends "retry:" first; a write not taken within WriteTimeout
// cuts the client off; a run silent for IdleTimeout ends with "event:
// idle". A caller holds at most MaxPerCaller streams across instances (a
// lease each, store.StreamLeases), beyond which the answer is 429
// too_many_streams with Retry-After. Any other refusal is the API's error
// body (api.ErrorStatus). The token, in Authorization or ?token= (for
// EventSource), is never logged.
//
// DESIGN.md, section "The stream" for the rest: framing, resuming,
// pull-through, the ends and the ceilings in full.
package stream

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/runfleet/runfleet/shared/api"
	"github.com/runfleet/runfleet/shared/auth"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/store"
)

// Defaults for Config's zero values.
const (
	DefaultPollInterval = time.Second
	DefaultKeepAlive    = 15 * time.Second
	// DefaultMaxDuration stays under Lambda's 15-minute limit.
	DefaultMaxDuration = 14 * time.Minute
	// DefaultEndMargin is kept free before an invocation's deadline for
	// the last poll and the retry hint.
	DefaultEndMargin  = 15 * time.Second
	DefaultWriteLimit = 10 * time.Second
	DefaultRetry      = 2 * time.Second
	// DefaultIdleTimeout ends a stream whose run has been silent this
	// long: a quiet run reconnects every few minutes (a lease and a read
	// of the run, milliseconds), an abandoned stream costs at most this
	// instead of MaxDuration.
	DefaultIdleTimeout = 3 * time.Minute
	// DefaultIdleRetry is the reconnection delay after an idle end: the
	// run was quiet for minutes, so a client waits longer than after a
	// planned end before it asks again.
	DefaultIdleRetry = 30 * time.Second
	// DefaultMaxPerCaller is the per-caller cap on open streams.
	DefaultMaxPerCaller = 10
	// DefaultLeaseTTL is how long a stream's slot outlives its last
	// renewal (a crashed stream's slot is free again after it).
	DefaultLeaseTTL = 2 * time.Minute
)

// CodeTooManyStreams is the code of the 429 beyond the per-caller cap.
const CodeTooManyStreams = fleetapi.CodeTooManyStreams

// Log field names.
const (
	logRequestID = "requestId"
	logPath      = "path"
	logQuery     = "query"
	logRun       = "fleetRunId"
	logOwner     = "ownerId"
	logStatus    = "status"
	logEnd       = "end"
	logEvents    = "events"
	logAfter     = "after"
	logEgress    = "egressRecords"
	logDuration  = "durationMs"
	logErr       = "err"
)

// Config configures a Handler.
type Config struct {
	// Fleet reads and syncs runs. Required.
	Fleet *fleet.Fleet
	// Auth turns the token into a caller. Required.
	Auth *auth.Authenticator
	// Logger gets one line per stream. Required.
	Logger *slog.Logger
	// Clock times polls, keep-alives, the planned end and the write limit;
	// nil is the wall clock.
	Clock clock.Clock
	// PollInterval is the time between polls; zero is DefaultPollInterval.
	PollInterval time.Duration
	// KeepAlive is the silence after which a keep-alive comment goes out;
	// zero is DefaultKeepAlive.
	KeepAlive time.Duration
	// MaxDuration bounds a stream; zero is DefaultMaxDuration. A stream also
	// ends EndMargin before its context's deadline (the invocation's).
	MaxDuration time.Duration
	// EndMargin: see MaxDuration; zero is DefaultEndMargin.
	EndMargin time.Duration
	// WriteTimeout bounds one write with its flush: a client that has not
	// taken it by then stopped reading, and is cut off. Zero is
	// DefaultWriteLimit.
	WriteTimeout time.Duration
	// Retry is the reconnection delay sent before a planned end; zero is
	// DefaultRetry.
	Retry time.Duration
	// PageSize is how many events one read of the mirror returns; zero is
	// fleet.MaxEventsLimit.
	PageSize int
	// IdleTimeout ends a stream after this long without a new event (the
	// retry hint is IdleRetry); zero is DefaultIdleTimeout.
	IdleTimeout time.Duration
	// IdleRetry is the reconnection delay sent at an idle end; zero is
	// DefaultIdleRetry.
	IdleRetry time.Duration
	// Leases counts each caller's open streams across instances. Nil: no
	// per-caller cap (only tests of the framing leave it out; Fleet's
	// assembly always sets it).
	Leases store.StreamLeases
	// MaxPerCaller is the per-caller cap on open streams, 1 to
	// store.MaxStreamSlots; zero is DefaultMaxPerCaller.
	MaxPerCaller int
	// LeaseTTL is a slot's life past its last renewal; zero is
	// DefaultLeaseTTL.
	LeaseTTL time.Duration
	// Random makes lease holder ids; nil is crypto/rand.
	Random io.Reader
	// Parked, when set, is called on a session's goroutine each time the
	// session has done a poll and armed its timer, just before it waits on
	// it; the session waits for Parked to return first (it must return
	// once ctx is done). Tests that drive a fake clock move it only then.
	// Nil: nothing is called.
	Parked func(ctx context.Context)
}

// Validate reports a missing required field.
func (c Config) Validate() error {
	var errs []error
	if c.Fleet == nil {
		errs = append(errs, errors.New("stream: Config.Fleet is required"))
	}
	if c.Auth == nil {
		errs = append(errs, errors.New("stream: Config.Auth is required"))
	}
	if c.Logger == nil {
		errs = append(errs, errors.New("stream: Config.Logger is required"))
	}
	if c.MaxPerCaller < 0 || c.MaxPerCaller > store.MaxStreamSlots {
		errs = append(errs, fmt.Errorf("stream: Config.MaxPerCaller %d: want 1 to %d (0: %d)", c.MaxPerCaller, store.MaxStreamSlots, DefaultMaxPerCaller))
	}
	return errors.Join(errs...)
}

// Handler serves streams. It is safe for concurrent use.
type Handler struct {
	cfg   Config
	log   *slog.Logger
	clock clock.Clock
	seq   atomic.Uint64
}

// New checks cfg, fills its defaults and returns a Handler.
func New(cfg Config) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.PollInterval, DefaultPollInterval)
	def(&cfg.KeepAlive, DefaultKeepAlive)
	def(&cfg.MaxDuration, DefaultMaxDuration)
	def(&cfg.EndMargin, DefaultEndMargin)
	def(&cfg.WriteTimeout, DefaultWriteLimit)
	def(&cfg.Retry, DefaultRetry)
	def(&cfg.IdleTimeout, DefaultIdleTimeout)
	def(&cfg.IdleRetry, DefaultIdleRetry)
	def(&cfg.LeaseTTL, DefaultLeaseTTL)
	if cfg.MaxPerCaller == 0 {
		cfg.MaxPerCaller = DefaultMaxPerCaller
	}
	if cfg.Random == nil {
		cfg.Random = rand.Reader
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = fleet.MaxEventsLimit
	}
	return &Handler{cfg: cfg, log: cfg.Logger, clock: cfg.Clock}, nil
}

// Path reports whether rawPath is a stream's path, /fleet/runs/{id}/stream,
// and returns the run id.
func Path(rawPath string) (string, bool) {
	rest, ok := strings.CutPrefix(rawPath, "/fleet/runs/")
	if !ok {
		return "", false
	}
	escaped, ok := strings.CutSuffix(rest, "/stream")
	if !ok || escaped == "" || strings.Contains(escaped, "/") {
		return "", false
	}
	id, err := url.PathUnescape(escaped)
	if err != nil || id == "" {
		return "", false
	}
	return id, true
}

// request is what the adapters hand the core.
type request struct {
	method    string
	rawPath   string
	rawQuery  string
	requestID string
	// header reads a header by its lower-case name.
	header func(name string) (string, bool)
}

// redactedQuery is the query as logged: the token's value replaced.
func redactedQuery(raw string) string {
	v, err := url.ParseQuery(raw)
	if err != nil {
		return "(malformed)"
	}
	if v.Has("token") {
		v.Set("token", "REDACTED")
	}
	return v.Encode()
}

// refusal is an answer other than a stream: status and JSON body.
type refusal struct {
	status int
	// body is the error body, encoded as the API encodes its answers.
	body  []byte
	allow string
	// retryAfter is the Retry-After header's value, when set.
	retryAfter string
}

// open checks the request and prepares its session, or refuses it.
func (h *Handler) open(ctx context.Context, req request) (*session, *refusal) {
	sess, err := h.prepare(ctx, req)
	if err == nil {
		return sess, nil
	}
	var full *capReached
	if errors.As(err, &full) {
		return nil, h.refuseFull(ctx, req, full)
	}
	status, body, fault := api.ErrorStatus(err)
	attrs := []any{logRequestID, req.requestID, logPath, req.rawPath, logQuery, redactedQuery(req.rawQuery), logStatus, status}
	if fault {
		h.log.ErrorContext(ctx, "stream refused: fault", append(attrs, logErr, err.Error())...)
	} else {
		h.log.InfoContext(ctx, "stream refused", attrs...)
	}
	// The stream's refusals carry no details: the body is strings, which
	// always encode.
	encoded, _ := api.EncodeJSON(body)
	r := &refusal{status: status, body: encoded}
	if status == http.StatusMethodNotAllowed {
		r.allow = http.MethodGet
	}
	return nil, r
}

func (h *Handler) prepare(ctx context.Context, req request) (*session, error) {
	id, ok := Path(req.rawPath)
	if !ok {
		return nil, api.NewRequestError(http.StatusNotFound, api.CodeRouteNotFound, "no such route: the stream is at /fleet/runs/{id}/stream")
	}
	if req.method != http.MethodGet {
		return nil, api.NewRequestError(http.StatusMethodNotAllowed, api.CodeMethodNotAllowed, "method %s is not allowed here", req.method)
	}
	q, err := api.ParseQuery(req.rawQuery, "after", "token", "egress", "egressAfter")
	if err != nil {
		return nil, err
	}
	withEgress, err := q.BoolFlag("egress")
	if err != nil {
		return nil, err
	}
	if q.Has("egressAfter") && !withEgress {
		return nil, api.NewRequestError(http.StatusBadRequest, fleet.CodeInvalid, "egressAfter is the ledger's cursor: it goes with egress=true")
	}
	authz, inHeader := req.header("authorization")
	if q.Has("token") {
		if inHeader {
			return nil, api.NewRequestError(http.StatusBadRequest, fleet.CodeInvalid, "send the token in the Authorization header or the token parameter, not both")
		}
		if q.Get("token") == "" {
			return nil, api.NewRequestError(http.StatusBadRequest, fleet.CodeInvalid, "the token parameter is empty")
		}
		authz = "Bearer " + q.Get("token")
	}
	caller, err := h.cfg.Auth.Authenticate(ctx, authz)
	if err != nil {
		return nil, err
	}
	after, _, err := q.NonNegativeInt("after")
	if err != nil {
		return nil, err
	}
	egressAfter, _, err := q.NonNegativeInt("egressAfter")
	if err != nil {
		return nil, err
	}
	if last, ok := req.header("last-event-id"); ok {
		// EventSource's reconnection: the last message the client has,
		// newer than where it first asked to start.
		if after, egressAfter, err = lastEventID(strings.TrimSpace(last), withEgress, egressAfter); err != nil {
			return nil, err
		}
	}
	run, err := h.cfg.Fleet.RunFor(ctx, caller, id)
	if err != nil {
		return nil, err
	}
	// Last, so that a refusal for any other cause takes no slot.
	lease, err := h.acquire(ctx, caller.OwnerID)
	if err != nil {
		return nil, err
	}
	return &session{h: h, req: req, caller: caller, run: run, cursor: after, after: after, lease: lease,
		egress: withEgress, egressCursor: egressAfter}, nil
}

// lastEventID reads a Last-Event-ID: an event sequence, or on a stream
// with egress "<event seq>:<ledger seq>" (a plain sequence there resumes
// the ledger at egressAfter, as asked). A ledger id on a stream without
// egress is refused rather than half taken.
func lastEventID(v string, withEgress bool, egressAfter int64) (int64, int64, error) {
	events, ledger, paired := strings.Cut(v, ":")
	if paired && !withEgress {
		return 0, 0, api.NewRequestError(http.StatusBadRequest, fleet.CodeInvalid,
			"Last-Event-ID %q is the id of a stream with egress: ask with egress=true", truncated(v))
	}
	if !paired {
		after, err := api.NonNegativeInt("Last-Event-ID", events)
		return after, egressAfter, err
	}
	after, err1 := api.NonNegativeInt("Last-Event-ID", events)
	egressAfter, err2 := api.NonNegativeInt("Last-Event-ID", ledger)
	if err1 != nil || err2 != nil {
		return 0, 0, api.NewRequestError(http.StatusBadRequest, fleet.CodeInvalid,
			"Last-Event-ID %q: want <event seq>:<ledger seq>, two non-negative integers", truncated(v))
	}
	return after, egressAfter, nil
}

// truncated bounds a client's value quoted in a refusal.
func truncated(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// capReached: the caller holds MaxPerCaller streams already.
type capReached struct {
	max int
	// retryAfter is when the earliest held slot would lapse.
	retryAfter time.Duration
}

func (e *capReached) Error() string {
	return fmt.Sprintf("stream: %d streams open, the cap", e.max)
}

// acquire takes one of the caller's slots; nil without Config.Leases.
func (h *Handler) acquire(ctx context.Context, owner string) (*store.StreamLease, error) {
	if h.cfg.Leases == nil {
		return nil, nil
	}
	var id [16]byte
	if _, err := io.ReadFull(h.cfg.Random, id[:]); err != nil {
		return nil, fmt.Errorf("stream: making a lease holder id: %w", err)
	}
	now := h.clock.Now()
	l, err := h.cfg.Leases.AcquireStreamLease(ctx, store.StreamLease{
		OwnerID: owner, Holder: hex.EncodeToString(id[:]), ExpiresAt: now.Add(h.cfg.LeaseTTL),
	}, h.cfg.MaxPerCaller)
	if errors.Is(err, store.ErrExists) {
		wait := l.ExpiresAt.Sub(now)
		if l.ExpiresAt.IsZero() || wait > h.cfg.LeaseTTL {
			wait = h.cfg.LeaseTTL
		}
		return nil, &capReached{max: h.cfg.MaxPerCaller, retryAfter: max(wait, time.Second)}
	}
	if err != nil {
		return nil, fmt.Errorf("stream: taking a stream slot: %w", err)
	}
	return &l, nil
}

// refuseFull answers 429 with Retry-After and the cap in the body.
func (h *Handler) refuseFull(ctx context.Context, req request, full *capReached) *refusal {
	secs := int64(math.Ceil(full.retryAfter.Seconds()))
	h.log.InfoContext(ctx, "stream refused", logRequestID, req.requestID, logPath, req.rawPath,
		logQuery, redactedQuery(req.rawQuery), logStatus, http.StatusTooManyRequests)
	body, _ := api.EncodeJSON(fleetapi.TooManyStreams{
		Error: fmt.Sprintf("this caller already has %d streams open, the most allowed per caller: close one, "+
			"follow the run with GET /fleet/runs/{id}/events?after=<cursor>&wait=<seconds> instead, or retry after %d s", full.max, secs),
		Code:    CodeTooManyStreams,
		Details: fleetapi.StreamCap{MaxStreamsPerCaller: full.max, RetryAfterSeconds: secs},
	})
	return &refusal{status: http.StatusTooManyRequests, body: body, retryAfter: strconv.FormatInt(secs, 10)}
}

// sseHeaders are the stream's response headers.
func sseHeaders() map[string]string {
	return map[string]string{
		"content-type":           "text/event-stream",
		"cache-control":          "no-cache",
		"x-accel-buffering":      "no", // a buffering proxy would turn the stream into one long download
		"x-content-type-options": "nosniff",
	}
}

// logEnd writes the stream's one line when it ends.
func (h *Handler) logEnd(ctx context.Context, s *session, begun time.Time, end endReason) {
	attrs := []any{logRequestID, s.req.requestID, logPath, s.req.rawPath, logQuery, redactedQuery(s.req.rawQuery),
		logRun, s.run.FleetRunID, logOwner, s.caller.OwnerID, logStatus, http.StatusOK, logAfter, s.after,
		logEnd, end.String(), logEvents, s.sent, logDuration, h.clock.Now().Sub(begun).Milliseconds()}
	if s.egress {
		attrs = append(attrs, logEgress, s.egressSent)
	}
	if end == endFault {
		h.log.ErrorContext(ctx, "stream ended on a fault", append(attrs, logErr, fmt.Sprint(s.fault))...)
		return
	}
	h.log.InfoContext(ctx, "stream", attrs...)
}

// errCutOff: the client did not take a write within WriteTimeout.
var errCutOff = errors.New("stream: the client stopped reading")

// isDone reports whether s's run is over and every event is sent, and on
// a stream with egress every ledger record (a drained run's ledger is
// mirrored whole: its head is final).
func (s *session) isDone() bool {
	run := s.run
	return store.Terminal(run.Status) && run.Drained && s.cursor >= run.EventCursor && (!s.egress || s.egressCursor >= s.head.Cursor)
}
