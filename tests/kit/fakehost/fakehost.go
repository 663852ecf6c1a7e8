// Package fakehost is a runner host for tests: a real HTTP(S) server on
// loopback speaking the host protocol (shared/hostproto) from memory, with
// knobs to make it drain, refuse, hang or die at chosen moments, and counters
// a test asserts on. It is not a runner: runs only change state when a test
// says so.
package fakehost

import (
	"crypto/ed25519"
	"crypto/subtle"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// Config configures a fake host. The zero value is usable.
type Config struct {
	// Token is the host credential it accepts; empty means "host-token".
	Token string
	// TLS serves HTTPS with httptest's self-signed certificate (see CAPEM);
	// false serves plain HTTP on loopback.
	TLS bool
	// Clock judges start deadlines; nil is the real clock.
	Clock clock.Clock
	// Agents the host offers; nil means ["shell"].
	Agents []string
	// Features as /healthz reports them; the zero value has both off.
	Features hostproto.Features
	// Version reported by /healthz; empty means "fake-1".
	Version string
	// MaxEventPage caps an events page below what Fleet asks for (a host
	// may answer fewer, with hasMore); zero means 1000, edge's maximum.
	MaxEventPage int
	// MaxEgressPage caps an egress ledger page likewise; zero means 1000.
	MaxEgressPage int
	// NoLedger makes a host older than egress ledgers: no ledgerKey in
	// /healthz, and no /runs/{id}/egress route (404 without a code).
	NoLedger bool
	// OnRequest, when set, is called with each authenticated request
	// before it is served, on the request's goroutine, with no lock of the
	// Host held: it may block, move a fake clock (a slow host) or call the
	// Host's methods.
	OnRequest func(r *http.Request)
	// NoKeepAlive closes each connection after its answer, so no client
	// holds one open: once the host is closed, a call fails to connect
	// rather than race the close of a pooled connection (which reads as
	// "no answer", a request possibly delivered).
	NoKeepAlive bool
	// MaxConcurrent, when above zero, is the host's slots, as edge's
	// runner.maxConcurrent: a start that would create a run while that
	// many of its runs are live is refused 409 host_busy, and /healthz
	// reports load {active, maxConcurrent} (unless SetLoad says otherwise).
	MaxConcurrent int
}

// StartFault is what the host does with the next POST /runs that would
// create a run.
type StartFault int

const (
	// NoFault answers normally.
	NoFault StartFault = iota
	// DieAfterAccept records the run, then drops the connection without an
	// answer: the client sees no answer, the run exists.
	DieAfterAccept
	// HangAfterAccept records the run, then answers nothing until the
	// client gives up (or Release is called).
	HangAfterAccept
	// HangBeforeAccept answers nothing and records nothing until the client
	// gives up (or Release is called, after which it proceeds normally).
	HangBeforeAccept
)

// Host is a running fake host. Its methods are safe for concurrent use.
type Host struct {
	// URL is the base URL to register.
	URL string

	srv     *httptest.Server
	mux     *http.ServeMux
	token   string
	clock   clock.Clock
	maxPage int

	maxEgressPage int
	noLedger      bool
	maxConcurrent int

	mu         sync.Mutex
	health     hostproto.Health
	healthFail int // answer /healthz with this status when non-zero
	runs       map[string]*hostproto.Run
	byToken    map[string]string
	nextID     int
	created    int
	startCalls int
	starts     []hostproto.StartRequest
	fault      StartFault
	faultLeft  int
	refuse     *refusal
	release    chan struct{}

	events   map[string][]hostproto.Event
	inputs   map[string][]json.RawMessage
	metrics  string
	verbs    VerbFault
	requests map[string]int

	ledgers   map[string]*ledger
	signer    ed25519.PrivateKey
	holdSeals bool

	creds credentialState
}

type refusal struct {
	status int
	code   string
}

// New starts a fake host; Close stops it.
func New(cfg Config) *Host {
	h := &Host{
		token:   cfg.Token,
		clock:   cfg.Clock,
		runs:    map[string]*hostproto.Run{},
		byToken: map[string]string{},
		release: make(chan struct{}),
		mux:     http.NewServeMux(),

		events:   map[string][]hostproto.Event{},
		inputs:   map[string][]json.RawMessage{},
		requests: map[string]int{},
		ledgers:  map[string]*ledger{},
		noLedger: cfg.NoLedger,
		creds:    newCredentialState(),

		maxConcurrent: cfg.MaxConcurrent,
	}
	if h.token == "" {
		h.token = "host-token"
	}
	if h.clock == nil {
		h.clock = clock.Real{}
	}
	h.maxPage = cfg.MaxEventPage
	if h.maxPage <= 0 {
		h.maxPage = maxEventPage
	}
	h.maxEgressPage = cfg.MaxEgressPage
	if h.maxEgressPage <= 0 {
		h.maxEgressPage = maxEventPage
	}
	agents := cfg.Agents
	if agents == nil {
		agents = []string{"shell"}
	}
	ver := cfg.Version
	if ver == "" {
		ver = "fake-1"
	}
	h.health = hostproto.Health{OK: true, Version: ver, Agents: agents, Features: cfg.Features}

	h.mux.HandleFunc("GET /healthz", h.handleHealth)
	h.mux.HandleFunc("POST /runs", h.handleStart)
	h.mux.HandleFunc("GET /runs", h.handleFind)
	h.mux.HandleFunc("GET /runs/{id}", h.handleGet)
	h.mux.HandleFunc("GET /runs/{id}/events", h.handleEvents)
	if !cfg.NoLedger {
		h.mux.HandleFunc("GET /runs/{id}/egress", h.handleEgress)
	}
	h.mux.HandleFunc("POST /runs/{id}/input", h.handleInput)
	h.mux.HandleFunc("POST /runs/{id}/cancel", h.handleCancel)
	h.mux.HandleFunc("POST /runs/{id}/retry", h.handleRetry)
	h.mux.HandleFunc("PUT /runs/{id}/credentials", h.handleCredentials)
	h.mux.HandleFunc("GET /metrics", h.handleMetrics)
	h.mux.HandleFunc("POST /host/drain", h.handleDrain(true))
	h.mux.HandleFunc("POST /host/resume", h.handleDrain(false))
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.authorized(r) {
			writeJSON(w, http.StatusUnauthorized, hostproto.ErrorBody{Error: "bad host credential", Code: hostproto.CodeUnauthorized})
			return
		}
		_, pattern := h.mux.Handler(r)
		h.mu.Lock()
		h.requests[pattern]++
		h.mu.Unlock()
		if cfg.OnRequest != nil {
			cfg.OnRequest(r)
		}
		h.mux.ServeHTTP(w, r)
	})
	h.srv = httptest.NewUnstartedServer(handler)
	h.srv.Config.SetKeepAlivesEnabled(!cfg.NoKeepAlive)
	if cfg.TLS {
		h.srv.StartTLS()
	} else {
		h.srv.Start()
	}
	h.URL = h.srv.URL
	if !cfg.NoLedger {
		h.signer = ledgerKey(h.URL)
		h.health.LedgerKey = egress.FormatPublicKey(h.signer.Public().(ed25519.PublicKey))
	}
	return h
}

// Handle adds a route to the host (Go ServeMux pattern), behind the same
// bearer check, for protocol parts a test needs beyond the built-in ones.
func (h *Host) Handle(pattern string, handler http.HandlerFunc) { h.mux.HandleFunc(pattern, handler) }

// Token is the host credential the host accepts.
func (h *Host) Token() string { return h.token }

// CAPEM is the PEM of the TLS certificate to trust (TLS hosts only).
func (h *Host) CAPEM() string {
	if h.srv.TLS == nil {
		return ""
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: h.srv.Certificate().Raw}))
}

// Close stops the server, releasing any hung request first.
func (h *Host) Close() {
	h.Release()
	h.srv.CloseClientConnections()
	h.srv.Close()
}

// CloseClientConnections drops every open connection, as a crash would.
func (h *Host) CloseClientConnections() { h.srv.CloseClientConnections() }

// SetAgents sets the agents /healthz reports and starts accept.
func (h *Host) SetAgents(agents ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.health.Agents = agents
}

// SetFeatures sets the features /healthz reports.
func (h *Host) SetFeatures(f hostproto.Features) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.health.Features = f
}

// SetDraining makes the host report draining and refuse starts (409 draining).
func (h *Host) SetDraining(d bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.health.Draining = d
}

// SetHealthy sets /healthz's ok field.
func (h *Host) SetHealthy(ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.health.OK = ok
}

// SetCA sets the CA dates /healthz reports.
func (h *Host) SetCA(ca *hostproto.CAInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.health.CA = ca
}

// SetStorage sets the storage /healthz reports (nil: a host older than the
// field). It only reports: starts are not refused for it.
func (h *Host) SetStorage(st *hostproto.Storage) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.health.Storage = nil
	if st != nil {
		c := *st
		h.health.Storage = &c
	}
}

// SetLimits sets the limits /healthz reports (nil: a host older than the field).
func (h *Host) SetLimits(l *hostproto.Limits) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.health.Limits = nil
	if l != nil {
		c := *l
		h.health.Limits = &c
	}
}

// SetLoad sets the load /healthz reports (nil: a host older than the
// field). It only reports: starts are not refused for it (RefuseStarts
// does that).
func (h *Host) SetLoad(l *hostproto.Load) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.health.Load = nil
	if l != nil {
		c := *l
		h.health.Load = &c
	}
}

// FailHealth makes /healthz answer status (0 restores normal answers).
func (h *Host) FailHealth(status int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.healthFail = status
}

// FaultStarts applies fault to the next n starts that would create a run.
func (h *Host) FaultStarts(fault StartFault, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fault, h.faultLeft = fault, n
}

// RefuseStarts makes every start that would create a run answer status with
// code, until called with status 0.
func (h *Host) RefuseStarts(status int, code string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if status == 0 {
		h.refuse = nil
		return
	}
	h.refuse = &refusal{status: status, code: code}
}

// Release lets every hung request proceed.
func (h *Host) Release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.release:
	default:
		close(h.release)
	}
}

// Created counts runs the host created: the number of runs that "reached
// the host". A start reused by clientToken does not count.
func (h *Host) Created() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.created
}

// StartCalls counts every POST /runs that passed authentication.
func (h *Host) StartCalls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.startCalls
}

// Starts returns the start requests that created runs, in order.
func (h *Host) Starts() []hostproto.StartRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]hostproto.StartRequest(nil), h.starts...)
}

// Run returns a copy of the run with runID.
func (h *Host) Run(runID string) (hostproto.Run, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.runs[runID]
	if !ok {
		return hostproto.Run{}, false
	}
	return *r, true
}

// SetRun changes a run's status (and exit code, reason) as the runner would,
// appending the state event in the same step (as edge does, so a terminal
// status is never visible before its state event), and sealing its egress
// ledger when the status is terminal (unless HoldSeals).
func (h *Host) SetRun(runID, status string, exitCode *int, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r, ok := h.runs[runID]; ok {
		r.Status, r.ExitCode, r.Reason = status, exitCode, reason
		h.appendStateLocked(r)
		h.endedLocked(r)
	}
}

// SetRunDetail is SetRun with the detail a person reads beside the reason.
func (h *Host) SetRunDetail(runID, status string, exitCode *int, reason, detail string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r, ok := h.runs[runID]; ok {
		r.Status, r.ExitCode, r.Reason, r.Detail = status, exitCode, reason, detail
		h.appendStateLocked(r)
		h.endedLocked(r)
	}
}

// Forget makes the host deny a run, as after losing its state.
func (h *Host) Forget(runID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r, ok := h.runs[runID]; ok {
		delete(h.byToken, r.ClientToken)
		delete(h.runs, runID)
		delete(h.events, runID)
		delete(h.ledgers, runID)
		h.creds.forgetLocked(runID)
	}
}

func (h *Host) authorized(r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(h.token)) == 1
}

func (h *Host) handleHealth(w http.ResponseWriter, _ *http.Request) {
	h.mu.Lock()
	health, fail := h.health, h.healthFail
	health.Agents = append([]string(nil), health.Agents...)
	idle := h.idleLocked()
	health.Idle = &idle
	if health.Load == nil && h.maxConcurrent > 0 {
		health.Load = &hostproto.Load{Active: h.activeLocked(), MaxConcurrent: h.maxConcurrent}
	}
	h.mu.Unlock()
	if fail != 0 {
		writeJSON(w, fail, hostproto.ErrorBody{Error: "health check failed"})
		return
	}
	writeJSON(w, http.StatusOK, health)
}

// handleDrain answers POST /host/drain (draining true) and /host/resume:
// the state after, as edge answers it.
func (h *Host) handleDrain(draining bool) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		h.mu.Lock()
		h.health.Draining = draining
		idle := h.idleLocked()
		h.mu.Unlock()
		writeJSON(w, http.StatusOK, hostproto.DrainState{Draining: draining, Idle: &idle})
	}
}

// idleLocked reports whether no run of the host is live. h.mu is held.
func (h *Host) idleLocked() bool { return h.activeLocked() == 0 }

// activeLocked counts the host's live runs. h.mu is held.
func (h *Host) activeLocked() int {
	n := 0
	for _, r := range h.runs {
		if !hostproto.TerminalStatus(r.Status) {
			n++
		}
	}
	return n
}

func (h *Host) handleStart(w http.ResponseWriter, r *http.Request) {
	var req hostproto.StartRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, hostproto.ErrorBody{Error: "bad start request: " + err.Error(), Code: hostproto.CodeBadRequest})
		return
	}
	if req.ClientToken == "" || req.Agent == "" {
		writeJSON(w, http.StatusBadRequest, hostproto.ErrorBody{Error: "clientToken and agent are required", Code: hostproto.CodeBadRequest})
		return
	}

	h.mu.Lock()
	h.startCalls++
	if id, ok := h.byToken[req.ClientToken]; ok {
		run := *h.runs[id]
		h.mu.Unlock()
		run.Reused = true
		writeJSON(w, http.StatusOK, run)
		return
	}
	fault := NoFault
	if h.faultLeft > 0 {
		fault = h.fault
		h.faultLeft--
	}
	release := h.release
	h.mu.Unlock()

	if fault == HangBeforeAccept {
		select {
		case <-r.Context().Done():
			return
		case <-release:
		}
	}

	h.mu.Lock()
	if id, ok := h.byToken[req.ClientToken]; ok { // created while this one hung
		run := *h.runs[id]
		h.mu.Unlock()
		run.Reused = true
		writeJSON(w, http.StatusOK, run)
		return
	}
	if refusal := h.startRefusal(req); refusal != nil {
		h.mu.Unlock()
		writeJSON(w, refusal.status, hostproto.ErrorBody{Error: "start refused: " + refusal.code, Code: refusal.code})
		return
	}
	h.nextID++
	h.created++
	run := &hostproto.Run{
		RunID:       fmt.Sprintf("run-%d", h.nextID),
		ClientToken: req.ClientToken,
		Status:      hostproto.StatusPending,
		Attempt:     1,
	}
	h.runs[run.RunID] = run
	h.byToken[req.ClientToken] = run.RunID
	h.starts = append(h.starts, req)
	h.creds.startLocked(run.RunID, req.Credentials)
	h.appendStateLocked(run)
	answer := *run
	h.mu.Unlock()

	switch fault {
	case DieAfterAccept:
		// The server drops the connection without writing a response.
		panic(http.ErrAbortHandler)
	case HangAfterAccept:
		select {
		case <-r.Context().Done():
			return
		case <-release:
		}
	}
	writeJSON(w, http.StatusCreated, answer)
}

// startRefusal decides, under h.mu, whether a new start is refused.
func (h *Host) startRefusal(req hostproto.StartRequest) *refusal {
	switch {
	case h.refuse != nil:
		return h.refuse
	case req.Deadline != nil && h.clock.Now().After(*req.Deadline):
		return &refusal{status: http.StatusConflict, code: hostproto.CodeDeadlinePassed}
	case h.health.Draining:
		return &refusal{status: http.StatusConflict, code: hostproto.CodeDraining}
	case h.maxConcurrent > 0 && h.activeLocked() >= h.maxConcurrent:
		return &refusal{status: http.StatusConflict, code: hostproto.ReasonHostBusy}
	}
	for _, a := range h.health.Agents {
		if a == req.Agent {
			return nil
		}
	}
	return &refusal{status: http.StatusBadRequest, code: hostproto.CodeBadRequest}
}

func (h *Host) handleFind(w http.ResponseWriter, r *http.Request) {
	token := r.URL.Query().Get("clientToken")
	h.mu.Lock()
	list := hostproto.RunList{Runs: []hostproto.Run{}}
	if id, ok := h.byToken[token]; ok && token != "" {
		list.Runs = append(list.Runs, *h.runs[id])
	}
	h.mu.Unlock()
	writeJSON(w, http.StatusOK, list)
}

func (h *Host) handleGet(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	run, ok := h.runs[r.PathValue("id")]
	var answer hostproto.Run
	if ok {
		answer = *run
	}
	h.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, hostproto.ErrorBody{Error: "no such run", Code: hostproto.CodeRunNotFound})
		return
	}
	writeJSON(w, http.StatusOK, answer)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
