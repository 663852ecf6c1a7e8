package fakehost

import (
	"encoding/json"
	"net/http"
	"slices"

	"github.com/runfleet/runfleet/shared/hostproto"
)

// credentialState is what the host holds of its runs' brokered values
// (DESIGN.md, "Credentials Fleet mints"), in memory as edge keeps them.
// Guarded by Host.mu.
type credentialState struct {
	// values are each run's current values, by run id.
	values map[string][]hostproto.BrokeredValue
	// puts are the PUT /runs/{id}/credentials requests each run took.
	puts map[string][]hostproto.CredentialsRequest
	// refuse, when set, refuses every PUT.
	refuse *refusal
}

func newCredentialState() credentialState {
	return credentialState{values: map[string][]hostproto.BrokeredValue{}, puts: map[string][]hostproto.CredentialsRequest{}}
}

// startLocked keeps a new run's values from its start.
func (c *credentialState) startLocked(runID string, values []hostproto.BrokeredValue) {
	if len(values) > 0 {
		c.values[runID] = slices.Clone(values)
	}
}

func (c *credentialState) forgetLocked(runID string) {
	delete(c.values, runID)
	delete(c.puts, runID)
}

// Credentials returns the brokered values the host holds now for a run:
// from its start, as PUTs replaced them; none after LoseCredentials.
func (h *Host) Credentials(runID string) []hostproto.BrokeredValue {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []hostproto.BrokeredValue
	for _, v := range h.creds.values[runID] {
		if v.Value != "" {
			out = append(out, v)
		}
	}
	return out
}

// CredentialPuts returns the PUT /runs/{id}/credentials requests a run
// took, in order.
func (h *Host) CredentialPuts(runID string) []hostproto.CredentialsRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.creds.puts[runID])
}

// LoseCredentials forgets a run's brokered values, as an edge restart
// does: the run names each in MissingCredentials until a PUT gives it.
func (h *Host) LoseCredentials(runID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.runs[runID]
	if !ok {
		return
	}
	r.MissingCredentials = nil
	for i, v := range h.creds.values[runID] {
		h.creds.values[runID][i].Value = ""
		r.MissingCredentials = append(r.MissingCredentials, v.ID())
	}
}

// RefuseCredentials makes every PUT /runs/{id}/credentials answer status
// with code, until called with status 0.
func (h *Host) RefuseCredentials(status int, code string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.creds.refuse = nil
	if status != 0 {
		h.creds.refuse = &refusal{status: status, code: code}
	}
}

// handleCredentials answers PUT /runs/{id}/credentials as the protocol
// says: 404 run_not_found, 409 not_running for a run that ended, 400
// bad_request for a key the run's start did not bring; otherwise the
// values replace the ones held, and the run answers without them missing.
func (h *Host) handleCredentials(w http.ResponseWriter, r *http.Request) {
	var req hostproto.CredentialsRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, hostproto.ErrorBody{Error: "bad credentials request: " + err.Error(), Code: hostproto.CodeBadRequest})
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	run, ok := h.runs[r.PathValue("id")]
	switch {
	case h.creds.refuse != nil:
		writeJSON(w, h.creds.refuse.status, hostproto.ErrorBody{Error: "refused: " + h.creds.refuse.code, Code: h.creds.refuse.code})
		return
	case !ok:
		writeJSON(w, http.StatusNotFound, hostproto.ErrorBody{Error: "no such run", Code: hostproto.CodeRunNotFound})
		return
	case hostproto.TerminalStatus(run.Status):
		writeJSON(w, http.StatusConflict, hostproto.ErrorBody{Error: "the run has no live attempt", Code: hostproto.CodeNotRunning})
		return
	}
	held := h.creds.values[run.RunID]
	for _, v := range req.Credentials {
		if !slices.ContainsFunc(held, func(x hostproto.BrokeredValue) bool { return x.ID() == v.ID() }) {
			writeJSON(w, http.StatusBadRequest, hostproto.ErrorBody{Error: "key " + v.ID() + " is not a brokered key of this run", Code: hostproto.CodeBadRequest})
			return
		}
	}
	for _, v := range req.Credentials {
		i := slices.IndexFunc(held, func(x hostproto.BrokeredValue) bool { return x.ID() == v.ID() })
		held[i] = v
		// A copy: answers copied from the run before share its array.
		run.MissingCredentials = slices.DeleteFunc(slices.Clone(run.MissingCredentials), func(id string) bool { return id == v.ID() })
	}
	if len(run.MissingCredentials) == 0 {
		run.MissingCredentials = nil
	}
	h.creds.puts[run.RunID] = append(h.creds.puts[run.RunID], req)
	writeJSON(w, http.StatusOK, *run)
}
