package api

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/version"
)

// routeTable enumerates every route. Adding a route is one entry here (and
// its handler): nothing else routes requests.
func (h *Handler) routeTable() []route {
	return []route{
		{method: http.MethodGet, pattern: "/healthz", access: public, handle: h.healthz},

		{method: http.MethodGet, pattern: "/fleet/hosts", access: callerOnly, handle: h.listHosts},
		{method: http.MethodPost, pattern: "/fleet/hosts", access: adminOnly, handle: h.registerHost},
		{method: http.MethodPost, pattern: "/fleet/hosts/{id}/enable", access: adminOnly, handle: h.enableHost},
		{method: http.MethodDelete, pattern: "/fleet/hosts/{id}", access: adminOnly, query: []string{"force"}, handle: h.deleteHost},
		{method: http.MethodPost, pattern: "/fleet/hosts/{id}/probe", access: adminOnly, handle: h.probeHost},
		{method: http.MethodPost, pattern: "/fleet/probe", access: adminOnly, handle: h.probeAll},
		{method: http.MethodPost, pattern: "/fleet/hosts/{id}/drain", access: adminOnly, handle: h.drainHost},
		{method: http.MethodPost, pattern: "/fleet/hosts/{id}/resume", access: adminOnly, handle: h.resumeHost},

		{method: http.MethodPost, pattern: "/fleet/callers", access: adminOnly, handle: h.mintCaller},
		{method: http.MethodGet, pattern: "/fleet/callers", access: adminOnly, handle: h.listCallers},
		{method: http.MethodDelete, pattern: "/fleet/callers/{ownerId}", access: adminOnly, handle: h.revokeCaller},

		{method: http.MethodPost, pattern: "/fleet/runs", access: callerOnly, handle: h.dispatch},
		{method: http.MethodGet, pattern: "/fleet/runs", access: callerOnly, query: []string{"cursor", "limit"}, handle: h.listRuns},
		{method: http.MethodGet, pattern: "/fleet/runs/{id}", access: callerOnly, handle: h.getRun},
		{method: http.MethodPost, pattern: "/fleet/runs/{id}/input", access: callerOnly, handle: h.input},
		{method: http.MethodPost, pattern: "/fleet/runs/{id}/cancel", access: callerOnly, handle: h.cancel},
		{method: http.MethodPost, pattern: "/fleet/runs/{id}/retry", access: callerOnly, handle: h.retry},
		{method: http.MethodGet, pattern: "/fleet/runs/{id}/events", access: callerOnly, query: []string{"after", "limit", "wait"}, handle: h.events},

		{method: http.MethodGet, pattern: "/metrics", access: callerOnly, query: []string{"host", "after"}, handle: h.metrics},
	}
}

func (h *Handler) healthz(context.Context, *request) (int, any, error) {
	return http.StatusOK, map[string]any{
		"ok": true, "ts": h.now(), "product": version.Product, "version": version.Version,
	}, nil
}

func (h *Handler) listHosts(ctx context.Context, rq *request) (int, any, error) {
	hosts, err := h.fleet.Hosts(ctx, rq.caller)
	if err != nil {
		return 0, nil, err
	}
	views := make([]hostView, len(hosts))
	for i, x := range hosts {
		views[i] = toHostView(x, rq.caller.Admin)
	}
	return http.StatusOK, map[string]any{"hosts": views}, nil
}

// registerBody is POST /fleet/hosts.
type registerBody struct {
	ID            *string           `json:"id"`
	BaseURL       *string           `json:"baseUrl"`
	CredentialRef *string           `json:"credentialRef"`
	Labels        map[string]string `json:"labels"`
	LocalPaths    []string          `json:"localPaths"`
	CAPEM         *string           `json:"caPem"`
	Enabled       *bool             `json:"enabled"`
}

func (h *Handler) registerHost(ctx context.Context, rq *request) (int, any, error) {
	var b registerBody
	if err := decodeObject(rq.body, &b); err != nil {
		return 0, nil, err
	}
	id, err := requiredString("id", b.ID)
	if err != nil {
		return 0, nil, err
	}
	base, err := requiredString("baseUrl", b.BaseURL)
	if err != nil {
		return 0, nil, err
	}
	ref, err := requiredString("credentialRef", b.CredentialRef)
	if err != nil {
		return 0, nil, err
	}
	ca, err := optionalString("caPem", b.CAPEM)
	if err != nil {
		return 0, nil, err
	}
	host, err := h.fleet.RegisterHost(ctx, fleet.HostSpec{
		ID: id, BaseURL: base, CredentialRef: ref, Labels: b.Labels, LocalPaths: b.LocalPaths, CAPEM: ca, Enabled: b.Enabled,
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, map[string]any{"host": toHostView(host, true)}, nil
}

type enableBody struct {
	Enabled *bool `json:"enabled"`
}

func (h *Handler) enableHost(ctx context.Context, rq *request) (int, any, error) {
	var b enableBody
	if err := decodeObject(rq.body, &b); err != nil {
		return 0, nil, err
	}
	if b.Enabled == nil {
		return 0, nil, badRequest("enabled is required: true or false")
	}
	host, err := h.fleet.SetHostEnabled(ctx, rq.params["id"], *b.Enabled)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, map[string]any{"host": toHostView(host, true)}, nil
}

func (h *Handler) deleteHost(ctx context.Context, rq *request) (int, any, error) {
	force, err := rq.query.boolFlag("force")
	if err != nil {
		return 0, nil, err
	}
	id := rq.params["id"]
	res, err := h.fleet.DeleteHost(ctx, id, force)
	if err != nil {
		return 0, nil, err
	}
	if !res.Done {
		// One call does a bounded step; the client repeats it (202: accepted,
		// not finished). runsDeleted counts this step only: counting what is
		// left would read every remaining run's key.
		return http.StatusAccepted, map[string]any{
			"id": id, "deleting": true, "forced": force, "runsDeleted": res.RunsDeleted,
			"note": "runs of this host remain: repeat this DELETE to continue",
		}, nil
	}
	return http.StatusOK, map[string]any{"removed": id, "forced": force, "runsDeleted": res.RunsDeleted}, nil
}

// noBody accepts an absent body or an empty object, for POST routes that
// take no fields.
func noBody(body []byte) error {
	if len(body) == 0 {
		return nil
	}
	var empty struct{}
	return decodeObject(body, &empty)
}

func (h *Handler) probeHost(ctx context.Context, rq *request) (int, any, error) {
	if err := noBody(rq.body); err != nil {
		return 0, nil, err
	}
	p, err := h.fleet.ProbeHost(ctx, rq.params["id"])
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, map[string]any{"probe": toProbeView(p)}, nil
}

func (h *Handler) probeAll(ctx context.Context, rq *request) (int, any, error) {
	if err := noBody(rq.body); err != nil {
		return 0, nil, err
	}
	results, err := h.fleet.ProbeAll(ctx, false)
	if err != nil {
		return 0, nil, err
	}
	hosts, err := h.fleet.Hosts(ctx, rq.caller)
	if err != nil {
		return 0, nil, err
	}
	views := make([]hostView, len(hosts))
	for i, x := range hosts {
		views[i] = toHostView(x, true)
	}
	return http.StatusOK, map[string]any{"probed": len(results), "hosts": views}, nil
}

// mintBody is POST /fleet/callers. The scopes are "*" or a list, read by
// parseScope so the message names the field.
type mintBody struct {
	OwnerID         *string         `json:"ownerId"`
	AllowedHosts    json.RawMessage `json:"allowedHosts"`
	AllowedProjects json.RawMessage `json:"allowedProjects"`
	Admin           *bool           `json:"admin"`
}

func (h *Handler) mintCaller(ctx context.Context, rq *request) (int, any, error) {
	var b mintBody
	if err := decodeObject(rq.body, &b); err != nil {
		return 0, nil, err
	}
	owner, err := requiredString("ownerId", b.OwnerID)
	if err != nil {
		return 0, nil, err
	}
	hosts, err := parseScope("allowedHosts", b.AllowedHosts)
	if err != nil {
		return 0, nil, err
	}
	projects, err := parseScope("allowedProjects", b.AllowedProjects)
	if err != nil {
		return 0, nil, err
	}
	c, token, err := h.fleet.MintCaller(ctx, fleet.CallerSpec{
		OwnerID: owner, AllowedHosts: hosts, AllowedProjects: projects, Admin: b.Admin != nil && *b.Admin,
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, map[string]any{"ownerId": c.OwnerID, "token": token}, nil
}

func (h *Handler) listCallers(ctx context.Context, _ *request) (int, any, error) {
	cs, err := h.fleet.Callers(ctx)
	if err != nil {
		return 0, nil, err
	}
	views := make([]callerView, len(cs))
	for i, c := range cs {
		views[i] = toCallerView(c)
	}
	return http.StatusOK, map[string]any{"callers": views}, nil
}

func (h *Handler) revokeCaller(ctx context.Context, rq *request) (int, any, error) {
	owner := rq.params["ownerId"]
	if err := h.fleet.RevokeCaller(ctx, owner); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, map[string]any{"revoked": owner}, nil
}

// dispatchBody is POST /fleet/runs (DESIGN.md, section "The run request"):
// the run request's caller fields, and Fleet's own (host, labels,
// idempotency). An empty optional string is refused rather than taken for
// absent (runspec.RefuseEmpty; host and idempotency here).
type dispatchBody struct {
	Host        *string           `json:"host"`
	Agent       string            `json:"agent"`
	Prompt      string            `json:"prompt"`
	Argv        []string          `json:"argv"`
	Labels      map[string]string `json:"labels"`
	Repository  string            `json:"repository"`
	LocalPath   string            `json:"localPath"`
	Env         map[string]string `json:"env"`
	Secrets     []runspec.Secret  `json:"secrets"`
	Idempotency *string           `json:"idempotency"`
}

func (h *Handler) dispatch(ctx context.Context, rq *request) (int, any, error) {
	var b dispatchBody
	if err := decodeObject(rq.body, &b); err != nil {
		return 0, nil, err
	}
	if err := runspec.RefuseEmpty(rq.body); err != nil {
		return 0, nil, badRequest("%s", err.Error())
	}
	req := fleet.DispatchRequest{Labels: b.Labels, Run: runspec.Request{
		Agent: b.Agent, Prompt: b.Prompt, Argv: b.Argv, Repository: b.Repository, LocalPath: b.LocalPath,
		Env: b.Env, Secrets: b.Secrets,
	}}
	var err error
	if req.Host, err = optionalString("host", b.Host); err != nil {
		return 0, nil, err
	}
	key, err := idempotencyKey(rq, b.Idempotency)
	if err != nil {
		return 0, nil, err
	}
	res, err := h.fleet.Dispatch(ctx, rq.caller, req, key)
	if err != nil {
		return 0, nil, err
	}
	r := res.Run
	answer := dispatchAnswer{
		FleetRunID: r.FleetRunID, HostID: r.HostID, ChildRunID: r.ChildRunID, Status: r.Status,
		Pending: r.Status == store.StatusDispatching, Reused: res.Reused,
		RewroteLocalPath: r.RewroteLocalPath, Reason: r.Reason, Detail: r.Detail, Note: res.Note,
		Links: rq.links.run(r.FleetRunID),
	}
	switch {
	case res.Refused:
		// The run exists (failed, with its reason) but nothing started: a
		// 2xx would tell a client that checks statuses it did. 409, as for
		// a dispatch routing refuses: the fleet's state (the host's policy,
		// broker or capacity) refuses the request; code is the reason.
		return http.StatusConflict, refusedAnswer{Error: refusalMessage(r), Code: r.Reason, dispatchAnswer: answer}, nil
	case res.Reused:
		return http.StatusOK, answer, nil
	}
	return http.StatusCreated, answer, nil
}

// refusedAnswer is a dispatch the host refused: an error body (error, code)
// and the dispatch answer in one object, so a generic error handler and a
// client that follows the run both find what they read.
type refusedAnswer struct {
	Error string `json:"error"`
	Code  string `json:"code"`
	dispatchAnswer
}

func refusalMessage(r store.Run) string {
	msg := "host " + r.HostID + " refused the run (" + r.Reason + ")"
	if r.Detail != "" {
		msg += ": " + r.Detail
	}
	return msg
}

// idempotencyKey takes the key from the Idempotency-Key header or the body's
// idempotency field; both, and different, is a 400.
func idempotencyKey(rq *request, fromBody *string) (string, error) {
	header, inHeader := rq.header("idempotency-key")
	body, err := optionalString("idempotency", fromBody)
	if err != nil {
		return "", err
	}
	if inHeader && header == "" {
		return "", badRequest("the Idempotency-Key header is empty")
	}
	if inHeader && fromBody != nil && header != body {
		return "", badRequest("the Idempotency-Key header and the idempotency field differ; send one")
	}
	if inHeader {
		return header, nil
	}
	return body, nil
}

func (h *Handler) listRuns(ctx context.Context, rq *request) (int, any, error) {
	limit, _, err := rq.query.nonNegativeInt("limit")
	if err != nil {
		return 0, nil, err
	}
	if limit > store.MaxLimit {
		limit = store.MaxLimit
	}
	cursor := rq.query.get("cursor")
	if rq.query.has("cursor") && cursor == "" {
		return 0, nil, badRequest("cursor is empty: omit it to start at the newest run")
	}
	page, err := h.fleet.Runs(ctx, rq.caller, cursor, int(limit))
	if err != nil {
		return 0, nil, err
	}
	views := make([]runView, len(page.Runs))
	for i, r := range page.Runs {
		views[i] = toRunView(r, rq.links)
	}
	return http.StatusOK, map[string]any{"runs": views, "nextCursor": page.NextCursor, "hasMore": page.NextCursor != ""}, nil
}

func (h *Handler) getRun(ctx context.Context, rq *request) (int, any, error) {
	st, err := h.fleet.Run(ctx, rq.caller, rq.params["id"])
	if err != nil {
		return 0, nil, err
	}
	answer := map[string]any{"run": toRunView(st.Run, rq.links), "refreshed": st.Refreshed}
	if st.Note != "" {
		answer["note"] = st.Note
	}
	return http.StatusOK, answer, nil
}

func requiredString(field string, v *string) (string, error) {
	if v == nil || *v == "" {
		return "", badRequest("%s is required and must be a non-empty string", field)
	}
	return *v, nil
}

func optionalString(field string, v *string) (string, error) {
	if v == nil {
		return "", nil
	}
	if *v == "" {
		return "", badRequest("%s must not be empty (omit it instead)", field)
	}
	return *v, nil
}
