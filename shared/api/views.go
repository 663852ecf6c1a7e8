package api

import (
	"encoding/json"
	"time"

	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
)

// The API's JSON shapes. They are converted explicitly from the store's
// records so a stored field never leaks into an answer by accident.

type hostView struct {
	ID            string            `json:"id"`
	BaseURL       string            `json:"baseUrl"`
	CredentialRef string            `json:"credentialRef,omitempty"`
	Labels        map[string]string `json:"labels"`
	LocalPaths    []string          `json:"localPaths"`
	CAPEM         string            `json:"caPem,omitempty"`
	Enabled       bool              `json:"enabled"`
	CreatedAt     time.Time         `json:"createdAt"`
	// Probe is null until the host is first probed.
	Probe *probeView `json:"probe"`
}

type probeView struct {
	Status    string             `json:"status"`
	At        time.Time          `json:"at"`
	LatencyMs int64              `json:"latencyMs"`
	Version   string             `json:"version,omitempty"`
	Agents    []string           `json:"agents"`
	Features  hostproto.Features `json:"features"`
	CA        *hostproto.CAInfo  `json:"ca,omitempty"`
	Draining  bool               `json:"draining"`
	// Idle: the host runs no task (absent when it does not say). A
	// draining host that is idle can be suspended.
	Idle *bool `json:"idle,omitempty"`
	// Storage and Limits are absent for a host older than the fields.
	Storage *hostproto.Storage `json:"storage,omitempty"`
	Limits  *hostproto.Limits  `json:"limits,omitempty"`
	Detail  string             `json:"detail,omitempty"`
}

// toHostView shows admins how the host is reached (credentialRef, caPem);
// other callers see what routing uses.
func toHostView(h store.Host, admin bool) hostView {
	v := hostView{
		ID: h.ID, BaseURL: h.BaseURL, Labels: h.Labels, LocalPaths: h.LocalPaths,
		Enabled: h.Enabled, CreatedAt: h.CreatedAt,
	}
	if v.Labels == nil {
		v.Labels = map[string]string{}
	}
	if v.LocalPaths == nil {
		v.LocalPaths = []string{}
	}
	if admin {
		v.CredentialRef, v.CAPEM = h.CredentialRef, h.CAPEM
	}
	if h.Probe != nil {
		p := toProbeView(*h.Probe)
		v.Probe = &p
	}
	return v
}

func toProbeView(p store.Probe) probeView {
	h := fleet.HealthOf(p) // what the host reported, in the protocol's shapes
	v := probeView{
		Status: p.Status, At: p.At, LatencyMs: p.LatencyMs, Detail: p.Detail,
		Version: h.Version, Agents: h.Agents, Features: h.Features, CA: h.CA, Draining: h.Draining, Idle: h.Idle,
		Storage: h.Storage, Limits: h.Limits,
	}
	if v.Agents == nil {
		v.Agents = []string{}
	}
	return v
}

type runView struct {
	FleetRunID       string     `json:"fleetRunId"`
	OwnerID          string     `json:"ownerId"`
	HostID           string     `json:"hostId"`
	ChildRunID       string     `json:"childRunId,omitempty"`
	Status           string     `json:"status"`
	Pending          bool       `json:"pending"`
	Attempt          int        `json:"attempt"`
	ExitCode         *int       `json:"exitCode,omitempty"`
	Reason           string     `json:"reason,omitempty"`
	Detail           string     `json:"detail,omitempty"`
	Agent            string     `json:"agent"`
	IdempotencyKey   string     `json:"idempotencyKey,omitempty"`
	RewroteLocalPath bool       `json:"rewroteLocalPath,omitempty"`
	CreatedAt        time.Time  `json:"createdAt"`
	UpdatedAt        time.Time  `json:"updatedAt"`
	Deadline         *time.Time `json:"deadline,omitempty"`
	EndedAt          *time.Time `json:"endedAt,omitempty"`
	Links            runLinks   `json:"links"`
}

func toRunView(r store.Run, l linker) runView {
	v := runView{
		FleetRunID: r.FleetRunID, OwnerID: r.OwnerID, HostID: r.HostID, ChildRunID: r.ChildRunID,
		Status: r.Status, Pending: r.Status == store.StatusDispatching, Attempt: r.Attempt,
		ExitCode: r.ExitCode, Reason: r.Reason, Detail: r.Detail, Agent: r.Agent, IdempotencyKey: r.IdempotencyKey,
		RewroteLocalPath: r.RewroteLocalPath, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, EndedAt: r.EndedAt,
		Links: l.run(r.FleetRunID),
	}
	if r.Status == store.StatusDispatching {
		d := r.Deadline
		v.Deadline = &d
	}
	return v
}

// dispatchAnswer is POST /fleet/runs' answer (DESIGN.md), with the run's
// end when it ended at once (reason, detail) and its links.
type dispatchAnswer struct {
	FleetRunID       string   `json:"fleetRunId"`
	HostID           string   `json:"hostId"`
	ChildRunID       string   `json:"childRunId,omitempty"`
	Status           string   `json:"status"`
	Pending          bool     `json:"pending"`
	Reused           bool     `json:"reused"`
	RewroteLocalPath bool     `json:"rewroteLocalPath,omitempty"`
	Reason           string   `json:"reason,omitempty"`
	Detail           string   `json:"detail,omitempty"`
	Note             string   `json:"note,omitempty"`
	Links            runLinks `json:"links"`
}

type callerView struct {
	OwnerID         string    `json:"ownerId"`
	Admin           bool      `json:"admin"`
	AllowedHosts    scopeJSON `json:"allowedHosts"`
	AllowedProjects scopeJSON `json:"allowedProjects"`
	CreatedAt       time.Time `json:"createdAt"`
}

func toCallerView(c store.Caller) callerView {
	return callerView{
		OwnerID: c.OwnerID, Admin: c.Admin, AllowedHosts: scopeJSON(c.AllowedHosts),
		AllowedProjects: scopeJSON(c.AllowedProjects), CreatedAt: c.CreatedAt,
	}
}

// scopeJSON is a scope on the wire: "*" or a list of ids.
type scopeJSON store.Scope

func (s scopeJSON) MarshalJSON() ([]byte, error) {
	if s.All {
		return []byte(`"*"`), nil
	}
	ids := s.IDs
	if ids == nil {
		ids = []string{}
	}
	return json.Marshal(ids)
}

// parseScope reads a scope field of a request: "*" or an array of strings.
func parseScope(field string, raw json.RawMessage) (*store.Scope, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var star string
	if json.Unmarshal(raw, &star) == nil {
		if star != "*" {
			return nil, badRequest(`%s: want "*" or an array of ids, got the string %q`, field, truncate(star, 40))
		}
		return &store.Scope{All: true}, nil
	}
	var ids []string
	if err := json.Unmarshal(raw, &ids); err != nil {
		return nil, badRequest(`%s: want "*" or an array of ids`, field)
	}
	if ids == nil {
		ids = []string{}
	}
	return &store.Scope{IDs: ids}, nil
}

// interactionAnswer is the answer of the verbs (input, cancel, retry):
// accepted true, false or "unknown", with the host's status, code and the
// detail when it was not plainly accepted, and the run as recorded after.
type interactionAnswer struct {
	FleetRunID string `json:"fleetRunId"`
	hostproto.Outcome
	Run runView `json:"run"`
}

func toInteractionAnswer(i fleet.Interaction, l linker) interactionAnswer {
	return interactionAnswer{FleetRunID: i.Run.FleetRunID, Outcome: i.Outcome, Run: toRunView(i.Run, l)}
}
