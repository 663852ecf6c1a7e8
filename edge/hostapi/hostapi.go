// Package hostapi owns edge's host API: the routes of DESIGN.md's host
// protocol that Fleet calls, over the runner. Every route, /healthz
// included, takes the host credential as a bearer token, compared in
// constant time. Errors are hostproto.ErrorBody, mapped from the runner's
// error kinds in one place (errorAnswer); a fault is logged and answered
// 500 with a generic message. The protocol's wire types are mapped to and
// from the runner's own in one place too (wire.go).
package hostapi

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/runfleet/runfleet/edge/ledger"
	"github.com/runfleet/runfleet/edge/runner"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/jsonstrict"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/shared/version"
)

// maxBodyBytes bounds a request body: a start with its prompt and env, or
// one input.
const maxBodyBytes = 1 << 20

// Log field names.
const (
	fieldMethod   = "method"
	fieldRoute    = "route"
	fieldStatus   = "status"
	fieldCode     = "code"
	fieldDuration = "durationMs"
	fieldError    = "error"
)

// Config configures the API.
type Config struct {
	// Runner serves the run routes. Required.
	Runner *runner.Runner
	// Token is the host credential Fleet presents. Required.
	Token string
	// SecretsProxy reports nil when the secrets proxy is up and not killed
	// (features.secretsProxy); nil means this edge has no proxy.
	SecretsProxy func() error
	// CA dates the proxy's CA for /healthz; nil omits it.
	CA func() *hostproto.CAInfo
	// Ledger serves runs' egress ledgers (GET /runs/{id}/egress) and the
	// host's ledger key (/healthz); nil serves neither.
	Ledger Ledger
	// Gatherer is served at /metrics; nil serves an empty registry.
	Gatherer prometheus.Gatherer
	// Logger gets one line per request; default discards. Never the token.
	Logger *slog.Logger
	// Clock times requests; default the real clock.
	Clock clock.Clock
}

// Ledger is runs' egress ledgers as the API serves them; *ledger.Ledger
// satisfies it. Safe for concurrent use.
type Ledger interface {
	// Page returns up to limit records after a sequence (0: the default
	// page), with the ledger's summary and seal; ledger.ErrNotFound for a
	// run the host does not hold.
	Page(runID string, after int64, limit int) (ledger.Page, error)
	// PublicKey is the key that seals the host's ledgers
	// (egress.FormatPublicKey).
	PublicKey() string
}

var _ Ledger = (*ledger.Ledger)(nil)

// API is the host API's handler.
type API struct {
	cfg       Config
	tokenHash [sha256.Size]byte
	mux       *http.ServeMux
	log       *slog.Logger
	clock     clock.Clock
}

var _ http.Handler = (*API)(nil)

// New builds the API.
func New(cfg Config) (*API, error) {
	if cfg.Runner == nil {
		return nil, errors.New("hostapi: Runner is required")
	}
	if cfg.Token == "" {
		return nil, errors.New("hostapi: Token is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Gatherer == nil {
		cfg.Gatherer = prometheus.NewRegistry()
	}
	a := &API{cfg: cfg, tokenHash: sha256.Sum256([]byte(cfg.Token)), mux: http.NewServeMux(), log: cfg.Logger, clock: cfg.Clock}
	a.mux.HandleFunc(routeHealth, a.health)
	a.mux.HandleFunc("POST /runs", a.start)
	a.mux.HandleFunc("GET /runs", a.find)
	a.mux.HandleFunc("GET /runs/{id}", a.get)
	a.mux.HandleFunc("GET /runs/{id}/events", a.events)
	if cfg.Ledger != nil {
		a.mux.HandleFunc("GET /runs/{id}/egress", a.egress)
	}
	a.mux.HandleFunc("POST /runs/{id}/input", a.input)
	a.mux.HandleFunc("POST /runs/{id}/cancel", a.cancel)
	a.mux.HandleFunc("POST /runs/{id}/retry", a.retry)
	a.mux.HandleFunc("PUT /runs/{id}/credentials", a.putCredentials)
	a.mux.HandleFunc("POST /host/drain", a.drain)
	a.mux.HandleFunc("POST /host/resume", a.resume)
	a.mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelError)}))
	a.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, hostproto.ErrorBody{Error: "no route " + r.Method + " " + r.URL.Path})
	})
	return a, nil
}

// routeHealth is the probe's route.
const routeHealth = "GET /healthz"

// ServeHTTP checks the bearer token, then routes; it logs one line per
// request.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	begun := a.clock.Now()
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	if a.authorized(r) {
		a.mux.ServeHTTP(rec, r)
	} else {
		writeJSON(rec, http.StatusUnauthorized, hostproto.ErrorBody{Error: "missing or wrong host credential", Code: hostproto.CodeUnauthorized})
	}
	_, route := a.mux.Handler(r)
	// Fleet probes every host every minute: an answered probe is routine,
	// and at INFO it would bury the lines that matter.
	level := slog.LevelInfo
	if route == routeHealth && rec.status == http.StatusOK {
		level = slog.LevelDebug
	}
	a.log.Log(r.Context(), level, "host api", fieldMethod, r.Method, fieldRoute, route, fieldStatus, rec.status, fieldCode, rec.code,
		fieldDuration, a.clock.Now().Sub(begun).Milliseconds())
}

// authorized compares the bearer token with the host credential in
// constant time (as SHA-256 digests, so lengths leak nothing either).
func (a *API) authorized(r *http.Request) bool {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	given := sha256.Sum256([]byte(token))
	match := subtle.ConstantTimeCompare(given[:], a.tokenHash[:]) == 1
	return ok && match
}

func (a *API) health(w http.ResponseWriter, _ *http.Request) {
	limits := wireLimits(a.cfg.Runner.Limits())
	idle := a.cfg.Runner.Idle()
	active, maxConcurrent := a.cfg.Runner.Load()
	h := hostproto.Health{
		OK:               a.cfg.Runner.Usable() == nil,
		Draining:         a.cfg.Runner.Draining(),
		Idle:             &idle,
		Version:          version.Version,
		Agents:           a.cfg.Runner.Agents(),
		InsecureSameUser: a.cfg.Runner.InsecureSameUser(),
		EgressConfined:   a.cfg.Runner.EgressConfined(),
		Storage:          wireStorage(a.cfg.Runner.Storage()),
		Limits:           &limits,
		Load:             &hostproto.Load{Active: active, MaxConcurrent: maxConcurrent},
		Features: hostproto.Features{
			SecretsProxy: a.cfg.SecretsProxy != nil && a.cfg.SecretsProxy() == nil,
			// Admission always enforces the broker for a run that declares
			// secrets (package runner), whatever the proxy's state.
			ExecRequire: true,
		},
	}
	if a.cfg.CA != nil {
		h.CA = a.cfg.CA()
	}
	if a.cfg.Ledger != nil {
		h.LedgerKey = a.cfg.Ledger.PublicKey()
	}
	writeJSON(w, http.StatusOK, h)
}

func (a *API) start(w http.ResponseWriter, r *http.Request) {
	var req hostproto.StartRequest
	body, err := decodeBody(w, r, &req)
	if err == nil {
		err = runspec.RefuseEmpty(body)
	}
	if err != nil {
		a.fail(w, err)
		return
	}
	run, err := a.cfg.Runner.Start(specOf(req))
	if err != nil {
		a.fail(w, err)
		return
	}
	status := http.StatusCreated
	if run.Reused {
		status = http.StatusOK
	}
	writeJSON(w, status, wireRun(run))
}

func (a *API) find(w http.ResponseWriter, r *http.Request) {
	token := r.URL.Query().Get("clientToken")
	if token == "" {
		a.fail(w, &runner.RequestError{Field: "clientToken", Message: "the query parameter is required"})
		return
	}
	runs, err := a.cfg.Runner.FindByClientToken(token)
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, hostproto.RunList{Runs: wireRuns(runs)})
}

func (a *API) get(w http.ResponseWriter, r *http.Request) {
	a.answerRun(w, http.StatusOK)(a.cfg.Runner.Get(r.PathValue("id")))
}

func (a *API) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	after, err := nonNegative(q, "after")
	if err != nil {
		a.fail(w, err)
		return
	}
	limit, err := pageLimit(q, runner.MaxEventPage)
	if err != nil {
		a.fail(w, err)
		return
	}
	page, err := a.cfg.Runner.Events(r.PathValue("id"), after, limit)
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, wirePage(page))
}

// egress serves a page of the run's egress ledger with the events'
// conventions: after and limit read alike, a page past the end without
// nextCursor, an unknown run the events' 404.
func (a *API) egress(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	after, err := nonNegative(q, "after")
	if err != nil {
		a.fail(w, err)
		return
	}
	limit, err := pageLimit(q, ledger.MaxPage)
	if err != nil {
		a.fail(w, err)
		return
	}
	page, err := a.cfg.Ledger.Page(r.PathValue("id"), after, limit)
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, wireEgressPage(page))
}

func (a *API) input(w http.ResponseWriter, r *http.Request) {
	var in hostproto.InputRequest
	if _, err := decodeBody(w, r, &in); err != nil {
		a.fail(w, err)
		return
	}
	if in.Input == nil {
		a.fail(w, &runner.RequestError{Field: "input", Message: "is required (any JSON value, null included)"})
		return
	}
	a.answerRun(w, http.StatusOK)(a.cfg.Runner.Input(r.PathValue("id"), in.Input))
}

func (a *API) cancel(w http.ResponseWriter, r *http.Request) {
	if err := readNoFields(w, r); err != nil {
		a.fail(w, err)
		return
	}
	a.answerRun(w, http.StatusOK)(a.cfg.Runner.Cancel(r.PathValue("id")))
}

func (a *API) retry(w http.ResponseWriter, r *http.Request) {
	if err := readNoFields(w, r); err != nil {
		a.fail(w, err)
		return
	}
	a.answerRun(w, http.StatusOK)(a.cfg.Runner.Retry(r.PathValue("id")))
}

// putCredentials is PUT /runs/{id}/credentials: fresh values from Fleet
// for the run's keys the policy takes from Fleet (hostproto's
// CredentialsRequest says what it answers).
func (a *API) putCredentials(w http.ResponseWriter, r *http.Request) {
	var req hostproto.CredentialsRequest
	if _, err := decodeBody(w, r, &req); err != nil {
		a.fail(w, err)
		return
	}
	a.answerRun(w, http.StatusOK)(a.cfg.Runner.PutCredentials(r.PathValue("id"), credentialsOf(req.Credentials)))
}

func (a *API) drain(w http.ResponseWriter, r *http.Request) {
	if err := readNoFields(w, r); err != nil {
		a.fail(w, err)
		return
	}
	a.cfg.Runner.Drain()
	writeJSON(w, http.StatusOK, a.drainState())
}

func (a *API) resume(w http.ResponseWriter, r *http.Request) {
	if err := readNoFields(w, r); err != nil {
		a.fail(w, err)
		return
	}
	a.cfg.Runner.Resume()
	writeJSON(w, http.StatusOK, a.drainState())
}

// drainState is the answer of /host/drain and /host/resume, as the runner
// stands after it: Fleet records it at once, so routing excludes a drained
// host and automation learns when it has emptied.
func (a *API) drainState() hostproto.DrainState {
	idle := a.cfg.Runner.Idle()
	return hostproto.DrainState{Draining: a.cfg.Runner.Draining(), Idle: &idle}
}

func (a *API) answerRun(w http.ResponseWriter, status int) func(runner.Run, error) {
	return func(run runner.Run, err error) {
		if err != nil {
			a.fail(w, err)
			return
		}
		writeJSON(w, status, wireRun(run))
	}
}

// fail answers err as errorAnswer maps it, logging a fault.
func (a *API) fail(w http.ResponseWriter, err error) {
	status, body := errorAnswer(err)
	if status == http.StatusInternalServerError {
		a.log.Error("host api fault", fieldError, err.Error())
	}
	if rec, ok := w.(*statusRecorder); ok {
		rec.code = body.Code
	}
	writeJSON(w, status, body)
}

// errorAnswer is the one place the runner's error kinds become statuses and
// codes.
func errorAnswer(err error) (int, hostproto.ErrorBody) {
	var reqErr *runner.RequestError
	var fieldErr *runspec.FieldError
	var refusal *runner.Refusal
	var tooBig *http.MaxBytesError
	var badJSON *jsonError
	switch {
	case errors.As(err, &tooBig):
		return http.StatusRequestEntityTooLarge, hostproto.ErrorBody{Error: fmt.Sprintf("the request body is larger than %d bytes", tooBig.Limit), Code: hostproto.CodeBadRequest}
	case errors.As(err, &badJSON):
		return http.StatusBadRequest, hostproto.ErrorBody{Error: badJSON.Error(), Code: hostproto.CodeInvalidJSON}
	case errors.As(err, &reqErr):
		return http.StatusBadRequest, hostproto.ErrorBody{Error: reqErr.Error(), Code: hostproto.CodeBadRequest}
	case errors.As(err, &fieldErr):
		// The run request's own rules, worded as Fleet words them.
		return http.StatusBadRequest, hostproto.ErrorBody{Error: fieldErr.Error(), Code: hostproto.CodeBadRequest}
	case errors.Is(err, runner.ErrNotFound), errors.Is(err, ledger.ErrNotFound):
		return http.StatusNotFound, hostproto.ErrorBody{Error: "no such run on this host", Code: hostproto.CodeRunNotFound}
	case errors.Is(err, runner.ErrNotRunning):
		return http.StatusConflict, hostproto.ErrorBody{Error: "the run has no live attempt", Code: hostproto.CodeNotRunning}
	case errors.Is(err, runner.ErrNotRetryable):
		return http.StatusConflict, hostproto.ErrorBody{Error: "the run's attempt is still live", Code: hostproto.CodeNotRetryable}
	case errors.Is(err, runner.ErrDraining):
		return http.StatusConflict, hostproto.ErrorBody{Error: "the host is draining and admits nothing new", Code: hostproto.CodeDraining}
	case errors.As(err, &refusal):
		msg := refusal.Detail
		if msg == "" {
			msg = refusal.Error()
		}
		return http.StatusConflict, hostproto.ErrorBody{Error: msg, Code: refusal.Reason}
	}
	return http.StatusInternalServerError, hostproto.ErrorBody{Error: "internal error"}
}

// jsonError is a body that is not one well-formed JSON value, or that
// gives a key twice: 400 invalid_json (errorAnswer). Its message never
// quotes the body, which may hold a secret meant for a field.
type jsonError struct{ msg string }

func (e *jsonError) Error() string { return e.msg }

// readJSON reads a body of at most maxBodyBytes and checks it is one JSON
// value that gives no key twice in an object: encoding/json would keep the
// last value, so {"clientToken": "a", "clientToken": "b"} would mean b here
// and perhaps a to what read it before (shared/jsonstrict; issue 30). A
// blank body is refused when required, else returned as nil.
func readJSON(w http.ResponseWriter, r *http.Request, required bool) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		return nil, err
	}
	trimmed := bytes.TrimSpace(body)
	switch {
	case len(trimmed) == 0 && required:
		return nil, &jsonError{msg: "body: is empty; a JSON object is required"}
	case len(trimmed) == 0:
		return nil, nil
	case !json.Valid(trimmed):
		// The decoder, unlike Unmarshal, tells a body cut short from a bad
		// byte; only the offset is named, never the body.
		var v any
		if err := json.NewDecoder(bytes.NewReader(trimmed)).Decode(&v); errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, &jsonError{msg: "body: is truncated JSON: it ends before the value closes"}
		}
		var se *json.SyntaxError
		if err := json.Unmarshal(trimmed, &v); errors.As(err, &se) {
			return nil, &jsonError{msg: fmt.Sprintf("body: is not valid JSON (at byte %d)", se.Offset)}
		}
		return nil, &jsonError{msg: "body: is not valid JSON"}
	}
	if err := jsonstrict.CheckDuplicateKeys(trimmed); err != nil {
		return nil, &jsonError{msg: err.Error()}
	}
	return body, nil
}

// readNoFields reads the body of a route that takes no fields (cancel,
// retry, drain, resume): absent, or JSON (Fleet sends {}) checked as
// readJSON checks it; its fields, if any, are ignored, so a newer Fleet
// can send more.
func readNoFields(w http.ResponseWriter, r *http.Request) error {
	_, err := readJSON(w, r, false)
	return err
}

// decodeBody reads a JSON body of at most maxBodyBytes into v and returns
// it (readJSON's checks first). Unknown fields are allowed, so a newer
// Fleet can talk to this edge; a value of the wrong type is refused naming
// its field.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) ([]byte, error) {
	body, err := readJSON(w, r, true)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(body, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			// The run request is inline in the start request: its fields
			// are named as the JSON names them.
			field := strings.TrimPrefix(te.Field, "Request.")
			return nil, &runner.RequestError{Field: field, Message: fmt.Sprintf("want %s, got %s", jsonstrict.Want(te.Type), te.Value)}
		}
		return nil, &runner.RequestError{Field: "body", Message: "is not the expected JSON: " + strings.TrimPrefix(err.Error(), "json: ")}
	}
	return body, nil
}

// nonNegative reads an optional non-negative integer query parameter:
// absent is 0; given, digits only (empty, "+1", "-1" and "1e3" are
// refused naming it).
func nonNegative(q url.Values, name string) (int64, error) {
	if !q.Has(name) {
		return 0, nil
	}
	s := q.Get(name)
	n, err := strconv.ParseInt(s, 10, 64)
	if s == "" || strings.TrimLeft(s, "0123456789") != "" || err != nil {
		return 0, &runner.RequestError{Field: name, Message: fmt.Sprintf("%q is not a non-negative integer", quoted(s))}
	}
	return n, nil
}

// pageLimit reads the optional limit of a page, the one rule for the host
// API's lists, as Fleet's API has it: absent is 0 (the runner's default
// page); given, an integer from 1 to max, and anything else (0, -1, max+1,
// not a number) is refused naming the range rather than taken for the
// default or clamped.
func pageLimit(q url.Values, max int) (int, error) {
	const name = "limit"
	if !q.Has(name) {
		return 0, nil
	}
	s := q.Get(name)
	n, err := strconv.Atoi(s)
	if s == "" || strings.TrimLeft(s, "0123456789") != "" || err != nil || n < 1 || n > max {
		return 0, &runner.RequestError{Field: name, Message: fmt.Sprintf("%q: want an integer from 1 to %d (or omit it for the default page)", quoted(s), max)}
	}
	return n, nil
}

// quoted bounds a query value a message repeats.
func quoted(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// statusRecorder keeps the status and error code for the request's log line.
type statusRecorder struct {
	http.ResponseWriter
	status int
	code   string
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// The host API server's timeouts: a slow or idle client cannot hold a
// connection forever.
const (
	serverReadHeaderTimeout = 10 * time.Second
	serverReadTimeout       = 30 * time.Second
	serverWriteTimeout      = 60 * time.Second
	serverIdleTimeout       = 2 * time.Minute
)

// NewServer returns the http.Server for the API with those timeouts.
func NewServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: serverReadHeaderTimeout,
		ReadTimeout:       serverReadTimeout,
		WriteTimeout:      serverWriteTimeout,
		IdleTimeout:       serverIdleTimeout,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}
