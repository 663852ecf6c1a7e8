package fakehost

import (
	"encoding/json"
	"net/http"

	"github.com/runfleet/runfleet/shared/hostproto"
)

// Event pages, as edge bounds them.
const (
	defaultEventPage = 100
	maxEventPage     = 1000
)

// VerbFault is what the host does with POST /runs/{id}/input, /cancel and
// /retry.
type VerbFault int

const (
	// VerbsNormal answers as a runner would.
	VerbsNormal VerbFault = iota
	// VerbsHang answers nothing until the client gives up (or Release).
	VerbsHang
	// VerbsFail answers 500 without acting.
	VerbsFail
)

// FaultVerbs sets what the verbs do from now on.
func (h *Host) FaultVerbs(f VerbFault) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.verbs = f
}

// AppendOutput appends an output event with text to the run, as a running
// task's terminal output would be recorded.
func (h *Host) AppendOutput(runID, text string) {
	data, _ := json.Marshal(text)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.appendLocked(runID, hostproto.EventOutput, data)
}

// Events returns a copy of the run's events.
func (h *Host) Events(runID string) []hostproto.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]hostproto.Event(nil), h.events[runID]...)
}

// Inputs returns the input values the run received, each exactly as the
// "input" member of the request carried it.
func (h *Host) Inputs(runID string) []json.RawMessage {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]json.RawMessage(nil), h.inputs[runID]...)
}

// SetMetrics sets the Prometheus text GET /metrics answers.
func (h *Host) SetMetrics(text string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.metrics = text
}

// Requests counts the authenticated requests served, by route pattern
// (e.g. "GET /runs/{id}/events").
func (h *Host) Requests() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]int, len(h.requests))
	for k, v := range h.requests {
		out[k] = v
	}
	return out
}

// ResetRequests forgets the request counts.
func (h *Host) ResetRequests() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.requests = map[string]int{}
}

// appendLocked appends one event to a run's sequence (contiguous from 1
// across attempts). Callers hold h.mu.
func (h *Host) appendLocked(runID, typ string, data json.RawMessage) {
	seq := int64(len(h.events[runID]) + 1)
	h.events[runID] = append(h.events[runID], hostproto.Event{Sequence: seq, Type: typ, Data: data, TS: h.clock.Now().UTC()})
}

// appendStateLocked records r's current state as a state event.
func (h *Host) appendStateLocked(r *hostproto.Run) {
	data, _ := json.Marshal(hostproto.StateChange{Status: r.Status, Attempt: r.Attempt, ExitCode: r.ExitCode, Reason: r.Reason})
	h.appendLocked(r.RunID, hostproto.EventState, data)
}

func (h *Host) handleEvents(w http.ResponseWriter, r *http.Request) {
	after, limit, ok := pageQuery(w, r)
	if !ok {
		return
	}
	limit = min(limit, h.maxPage)
	h.mu.Lock()
	_, known := h.runs[r.PathValue("id")]
	all := h.events[r.PathValue("id")]
	page := hostproto.EventPage{Events: []hostproto.Event{}, NextCursor: &after}
	for _, e := range all {
		if e.Sequence <= after {
			continue
		}
		if len(page.Events) == limit {
			page.HasMore = true
			break
		}
		page.Events = append(page.Events, e)
		page.NextCursor = &e.Sequence
	}
	h.mu.Unlock()
	if !known {
		writeJSON(w, http.StatusNotFound, hostproto.ErrorBody{Error: "no such run", Code: hostproto.CodeRunNotFound})
		return
	}
	writeJSON(w, http.StatusOK, page)
}

// verb runs the common part of a verb: the fault knob and the run lookup.
// act, under h.mu, changes the run or returns a refusal.
func (h *Host) verb(w http.ResponseWriter, r *http.Request, act func(run *hostproto.Run) *refusal) {
	h.mu.Lock()
	fault, release := h.verbs, h.release
	h.mu.Unlock()
	switch fault {
	case VerbsHang:
		select {
		case <-r.Context().Done():
			return
		case <-release:
		}
	case VerbsFail:
		writeJSON(w, http.StatusInternalServerError, hostproto.ErrorBody{Error: "internal error"})
		return
	}
	h.mu.Lock()
	run, ok := h.runs[r.PathValue("id")]
	if !ok {
		h.mu.Unlock()
		writeJSON(w, http.StatusNotFound, hostproto.ErrorBody{Error: "no such run", Code: hostproto.CodeRunNotFound})
		return
	}
	refused := act(run)
	answer := *run
	h.mu.Unlock()
	if refused != nil {
		writeJSON(w, refused.status, hostproto.ErrorBody{Error: "refused: " + refused.code, Code: refused.code})
		return
	}
	writeJSON(w, http.StatusOK, answer)
}

func (h *Host) handleInput(w http.ResponseWriter, r *http.Request) {
	var req map[string]json.RawMessage
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, hostproto.ErrorBody{Error: "bad input request: " + err.Error(), Code: hostproto.CodeBadRequest})
		return
	}
	input, ok := req["input"]
	if !ok {
		writeJSON(w, http.StatusBadRequest, hostproto.ErrorBody{Error: "input is required", Code: hostproto.CodeBadRequest})
		return
	}
	h.verb(w, r, func(run *hostproto.Run) *refusal {
		if hostproto.TerminalStatus(run.Status) {
			return &refusal{status: http.StatusConflict, code: hostproto.CodeNotRunning}
		}
		h.inputs[run.RunID] = append(h.inputs[run.RunID], input)
		h.appendLocked(run.RunID, hostproto.EventInput, input)
		return nil
	})
}

func (h *Host) handleCancel(w http.ResponseWriter, r *http.Request) {
	h.verb(w, r, func(run *hostproto.Run) *refusal {
		if hostproto.TerminalStatus(run.Status) {
			return &refusal{status: http.StatusConflict, code: hostproto.CodeNotRunning}
		}
		run.Status, run.ExitCode, run.Reason = hostproto.StatusCanceled, nil, hostproto.ReasonCanceled
		h.appendStateLocked(run)
		h.endedLocked(run)
		return nil
	})
}

func (h *Host) handleRetry(w http.ResponseWriter, r *http.Request) {
	h.verb(w, r, func(run *hostproto.Run) *refusal {
		if !hostproto.TerminalStatus(run.Status) {
			return &refusal{status: http.StatusConflict, code: hostproto.CodeNotRetryable}
		}
		run.Attempt++
		run.Status, run.ExitCode, run.Reason = hostproto.StatusPending, nil, ""
		h.appendStateLocked(run)
		return nil
	})
}

func (h *Host) handleMetrics(w http.ResponseWriter, _ *http.Request) {
	h.mu.Lock()
	text := h.metrics
	h.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(text))
}
