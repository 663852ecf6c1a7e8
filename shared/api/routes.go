package api

import (
	"context"
	"net/http"

	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/fleetapi"
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
		{method: http.MethodGet, pattern: "/fleet/capacity", access: adminOnly, handle: h.capacity},

		{method: http.MethodPost, pattern: "/fleet/callers", access: adminOnly, handle: h.mintCaller},
		{method: http.MethodGet, pattern: "/fleet/callers", access: adminOnly, handle: h.listCallers},
		{method: http.MethodDelete, pattern: "/fleet/callers/{ownerId}", access: adminOnly, handle: h.revokeCaller},

		{method: http.MethodPost, pattern: "/fleet/runs", access: callerOnly, handle: h.dispatch},
		{method: http.MethodGet, pattern: "/fleet/runs", access: callerOnly, query: []string{"cursor", "limit", "alerts", "status", "agent", "host"}, handle: h.listRuns},
		{method: http.MethodGet, pattern: "/fleet/runs/{id}", access: callerOnly, handle: h.getRun},
		{method: http.MethodPost, pattern: "/fleet/runs/{id}/input", access: callerOnly, handle: h.input},
		{method: http.MethodPost, pattern: "/fleet/runs/{id}/cancel", access: callerOnly, handle: h.cancel},
		{method: http.MethodPost, pattern: "/fleet/runs/{id}/retry", access: callerOnly, handle: h.retry},
		{method: http.MethodGet, pattern: "/fleet/runs/{id}/events", access: callerOnly, query: []string{"after", "limit", "wait"}, handle: h.events},
		{method: http.MethodGet, pattern: "/fleet/runs/{id}/egress", access: callerOnly, query: []string{"cursor", "limit", "verify"}, handle: h.egress},

		{method: http.MethodGet, pattern: "/metrics", access: callerOnly, query: []string{"host", "after"}, handle: h.metrics},

		{method: http.MethodGet, pattern: "/ui", access: public, handle: h.uiPage},
		{method: http.MethodGet, pattern: "/ui/{file}", access: public, handle: h.uiFile},
	}
}

func (h *Handler) healthz(context.Context, *request) (int, any, error) {
	return http.StatusOK, fleetapi.Health{OK: true, TS: h.now(), Product: version.Product, Version: version.Version}, nil
}

func (h *Handler) listHosts(ctx context.Context, rq *request) (int, any, error) {
	hosts, err := h.fleet.Hosts(ctx, rq.caller)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, fleetapi.HostList{Hosts: toHostViews(hosts, rq.caller.Admin)}, nil
}

func (h *Handler) registerHost(ctx context.Context, rq *request) (int, any, error) {
	var b fleetapi.RegisterHost
	if err := decodeObject(rq.body, &b); err != nil {
		return 0, nil, err
	}
	for _, f := range []struct{ name, value string }{{"id", b.ID}, {"baseUrl", b.BaseURL}, {"credentialRef", b.CredentialRef}} {
		if err := requiredString(f.name, f.value); err != nil {
			return 0, nil, err
		}
	}
	if err := optionalString(rq.body, "caPem"); err != nil {
		return 0, nil, err
	}
	host, err := h.fleet.RegisterHost(ctx, toHostSpec(b))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, fleetapi.HostAnswer{Host: toHostView(host, true)}, nil
}

func (h *Handler) enableHost(ctx context.Context, rq *request) (int, any, error) {
	var b fleetapi.SetEnabled
	if err := decodeObject(rq.body, &b); err != nil {
		return 0, nil, err
	}
	if !given(rq.body, "enabled") {
		return 0, nil, badRequest("enabled is required: true or false")
	}
	host, err := h.fleet.SetHostEnabled(ctx, rq.params["id"], b.Enabled)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, fleetapi.HostAnswer{Host: toHostView(host, true)}, nil
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
		// One call does a bounded step; the client repeats it (202:
		// accepted, not finished).
		return http.StatusAccepted, toHostDeleting(id, force, res), nil
	}
	return http.StatusOK, toHostDeleted(id, force, res), nil
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
	return http.StatusOK, fleetapi.ProbeAnswer{Probe: toProbeView(p)}, nil
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
	return http.StatusOK, fleetapi.ProbeAll{Probed: len(results), Hosts: toHostViews(hosts, true)}, nil
}

// mintCaller reads POST /fleet/callers. A scope that is neither "*" nor a
// list of ids is refused while decoding (fleetapi.Scope's UnmarshalJSON),
// the message naming the field.
func (h *Handler) mintCaller(ctx context.Context, rq *request) (int, any, error) {
	var b fleetapi.MintCaller
	if err := decodeObject(rq.body, &b); err != nil {
		return 0, nil, err
	}
	if err := requiredString("ownerId", b.OwnerID); err != nil {
		return 0, nil, err
	}
	c, token, err := h.fleet.MintCaller(ctx, toCallerSpec(b))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, fleetapi.Minted{OwnerID: c.OwnerID, Token: token}, nil
}

func (h *Handler) listCallers(ctx context.Context, _ *request) (int, any, error) {
	cs, err := h.fleet.Callers(ctx)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, fleetapi.CallerList{Callers: toCallerViews(cs)}, nil
}

func (h *Handler) revokeCaller(ctx context.Context, rq *request) (int, any, error) {
	owner := rq.params["ownerId"]
	if err := h.fleet.RevokeCaller(ctx, owner); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, fleetapi.Revoked{Revoked: owner}, nil
}

// dispatch reads POST /fleet/runs (DESIGN.md, section "The run request"):
// the run request's caller fields, and Fleet's own (host, labels,
// idempotency, queue). A run that waits for a host with room is 202. An optional string given empty is refused rather than
// taken for absent (runspec.RefuseEmpty; host and idempotency here).
func (h *Handler) dispatch(ctx context.Context, rq *request) (int, any, error) {
	var b fleetapi.DispatchRequest
	if err := decodeObject(rq.body, &b); err != nil {
		return 0, nil, err
	}
	if err := runspec.RefuseEmpty(rq.body); err != nil {
		return 0, nil, badRequest("%s", err.Error())
	}
	if err := optionalString(rq.body, "host"); err != nil {
		return 0, nil, err
	}
	key, err := idempotencyKey(rq, b.Idempotency)
	if err != nil {
		return 0, nil, err
	}
	req, err := toDispatchRequest(b)
	if err != nil {
		return 0, nil, err
	}
	res, err := h.fleet.Dispatch(ctx, rq.caller, req, key)
	if err != nil {
		return 0, nil, err
	}
	switch {
	case res.Refused:
		// The run exists (failed, with its reason) but nothing started: a
		// 2xx would tell a client that checks statuses it did. 409, as for
		// a dispatch routing refuses: the fleet's state (the host's policy,
		// broker or capacity) refuses the request; code is the reason.
		return http.StatusConflict, toDispatchRefused(res, rq.links), nil
	case res.Reused:
		return http.StatusOK, toDispatchAnswer(res, rq.links), nil
	case res.Run.Waiting():
		// Accepted, not started: it waits for a host with room.
		return http.StatusAccepted, toDispatchAnswer(res, rq.links), nil
	}
	return http.StatusCreated, toDispatchAnswer(res, rq.links), nil
}

// idempotencyKey takes the key from the Idempotency-Key header or the
// body's idempotency field (fromBody); both, and different, is a 400.
func idempotencyKey(rq *request, fromBody string) (string, error) {
	header, inHeader := rq.header("idempotency-key")
	if err := optionalString(rq.body, "idempotency"); err != nil {
		return "", err
	}
	if inHeader && header == "" {
		return "", badRequest("the Idempotency-Key header is empty")
	}
	if inHeader && fromBody != "" && header != fromBody {
		return "", badRequest("the Idempotency-Key header and the idempotency field differ; send one")
	}
	if inHeader {
		return header, nil
	}
	return fromBody, nil
}

// listRuns reads GET /fleet/runs: the caller's runs, narrowed by the
// status, agent and host filters, or with alerts=true (admins only: it
// spans every owner) the runs whose egress ledgers hold alerts, which
// takes no filter (its index is by alert, not by run).
func (h *Handler) listRuns(ctx context.Context, rq *request) (int, any, error) {
	limit, err := rq.query.pageLimit(store.MaxLimit)
	if err != nil {
		return 0, nil, err
	}
	q := fleet.RunsQuery{Cursor: rq.query.get("cursor"), Limit: limit,
		Status: rq.query.get("status"), Agent: rq.query.get("agent"), HostID: rq.query.get("host")}
	if rq.query.has("cursor") && q.Cursor == "" {
		return 0, nil, badRequest("cursor is empty: omit it to start at the newest run")
	}
	filters := []string{"status", "agent", "host"}
	for _, name := range filters {
		if rq.query.has(name) && rq.query.get(name) == "" {
			return 0, nil, badRequest("%s is empty: omit it to list runs of any %s", name, name)
		}
	}
	alerts, err := rq.query.boolFlag("alerts")
	if err != nil {
		return 0, nil, err
	}
	if alerts {
		if !rq.caller.Admin {
			return 0, nil, adminRequired("alerts=true lists every owner's runs with egress alerts: it requires an admin token")
		}
		for _, name := range filters {
			if rq.query.has(name) {
				return 0, nil, badRequest("%s does not apply with alerts=true: the alerts listing takes no filter", name)
			}
		}
		page, err := h.fleet.AlertedRuns(ctx, q.Cursor, limit)
		if err != nil {
			return 0, nil, err
		}
		return http.StatusOK, toAlertedPage(page, rq.links), nil
	}
	page, err := h.fleet.Runs(ctx, rq.caller, q)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, toRunPage(page, rq.links), nil
}

func (h *Handler) getRun(ctx context.Context, rq *request) (int, any, error) {
	st, err := h.fleet.Run(ctx, rq.caller, rq.params["id"])
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, toRunAnswer(st, rq.links), nil
}

// requiredString refuses a required string absent, null or empty.
func requiredString(field, v string) error {
	if v == "" {
		return badRequest("%s is required and must be a non-empty string", field)
	}
	return nil
}

// optionalString refuses an optional string the body gives empty: omitting
// it is how to leave it out.
func optionalString(body []byte, field string) error {
	if v, ok := givenValue(body, field); ok && string(v) == `""` {
		return badRequest("%s must not be empty (omit it instead)", field)
	}
	return nil
}
