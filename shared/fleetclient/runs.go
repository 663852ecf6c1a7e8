package fleetclient

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"

	"github.com/runfleet/runfleet/shared/fleetapi"
)

// Dispatched is POST /fleet/runs' answer: the run as dispatched, and the
// idempotency key the request carried (the caller's, or the one generated
// for it), with which the same dispatch can be sent again safely.
type Dispatched struct {
	fleetapi.DispatchAnswer
	// Status is the HTTP status: 201 created, 202 queued (the run waits
	// for an eligible host with room: Status queued, Queue set, no host
	// yet), 200 an earlier dispatch of the same key (Reused), 409 refused
	// (with the *Error).
	HTTPStatus     int
	IdempotencyKey string
}

// Queued reports whether the run waits in Fleet's queue: no host has it
// yet, and following it waits for its start.
func (d Dispatched) Queued() bool { return d.Status == fleetapi.StatusQueued }

// Dispatch sends POST /fleet/runs. Without r.Idempotency a key is
// generated, so a retry after a lost answer finds the run the first try
// created rather than starting a second. A run that waits for capacity
// (r.Queue, or Fleet's default) is an answer like any other, with no
// error: 202, status queued, its Queue; follow its links.stream to see it
// start. A refused dispatch (409) returns the answer (Reason, Detail: the
// host's refusal) with its *Error; a dispatch no host can take (and that
// does not wait) returns the *Error alone (code no_eligible_host, its
// NoEligibleHost details).
func (c *Client) Dispatch(ctx context.Context, r fleetapi.DispatchRequest) (Dispatched, error) {
	key := r.Idempotency
	if key == "" {
		var err error
		if key, err = c.newKey(); err != nil {
			return Dispatched{}, err
		}
		r.Idempotency = key
	}
	var d Dispatched
	d.IdempotencyKey = key
	status, err := c.send(ctx, call{method: http.MethodPost, path: "/fleet/runs", body: r, retry: true}, &d.DispatchAnswer, true)
	d.HTTPStatus = status
	return d, err
}

// RunFilter selects GET /fleet/runs' page: the newest first, from Cursor
// (a page's NextCursor), at most Limit (zero: the API's default), of one
// Status, Agent or Host when set. Alerts (admins only) lists every owner's
// runs whose egress ledgers hold alerts.
type RunFilter struct {
	Cursor string
	Limit  int
	Status string
	Agent  string
	Host   string
	Alerts bool
}

// Runs lists one page of the runs the caller may see.
func (c *Client) Runs(ctx context.Context, f RunFilter) (fleetapi.RunPage, error) {
	q := url.Values{}
	set := func(name, v string) {
		if v != "" {
			q.Set(name, v)
		}
	}
	set("cursor", f.Cursor)
	set("status", f.Status)
	set("agent", f.Agent)
	set("host", f.Host)
	if f.Limit != 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	if f.Alerts {
		q.Set("alerts", "true")
	}
	var page fleetapi.RunPage
	_, err := c.send(ctx, call{method: http.MethodGet, path: "/fleet/runs", query: q, retry: true}, &page, false)
	return page, err
}

// Run is GET /fleet/runs/{id}: the run, refreshed from its host when it is
// live.
func (c *Client) Run(ctx context.Context, id string) (fleetapi.RunAnswer, error) {
	var a fleetapi.RunAnswer
	_, err := c.send(ctx, call{method: http.MethodGet, path: "/fleet/runs/" + url.PathEscape(id), retry: true}, &a, false)
	return a, err
}

// EventsQuery is GET /fleet/runs/{id}/events' page: the events after
// After, at most Limit, waiting up to Wait seconds for one when there is
// none yet (a long-poll; zero answers at once).
type EventsQuery struct {
	After int64
	Limit int
	Wait  int
}

// Events reads one page of a run's mirrored events.
func (c *Client) Events(ctx context.Context, id string, q EventsQuery) (fleetapi.EventPage, error) {
	v := url.Values{}
	if q.After > 0 {
		v.Set("after", strconv.FormatInt(q.After, 10))
	}
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Wait != 0 {
		v.Set("wait", strconv.Itoa(q.Wait))
	}
	var page fleetapi.EventPage
	_, err := c.send(ctx, call{method: http.MethodGet, path: "/fleet/runs/" + url.PathEscape(id) + "/events", query: v, retry: true}, &page, false)
	return page, err
}

// Interacted is a forwarded verb's answer (input, cancel, retry): 200 the
// host took it, 202 it may or may not have (no answer in time), 409 it
// refused (with the *Error).
type Interacted struct {
	fleetapi.Interaction
	HTTPStatus int
}

// Input sends value to the run's standard input: POST
// /fleet/runs/{id}/input with {"input": value}. A string is typed as it
// is. Never retried: a repeat would type twice.
func (c *Client) Input(ctx context.Context, id string, value any) (Interacted, error) {
	raw, err := json.Marshal(value)
	if err != nil {
		return Interacted{}, errors.New("fleetclient: the input is not JSON: " + err.Error())
	}
	return c.verb(ctx, id, "input", fleetapi.InputRequest{Input: raw}, false)
}

// Cancel asks the run's host to end it (retried: cancelling twice is
// cancelling once).
func (c *Client) Cancel(ctx context.Context, id string) (Interacted, error) {
	return c.verb(ctx, id, "cancel", nil, true)
}

// Retry starts the run's next attempt. Never retried by the client.
func (c *Client) Retry(ctx context.Context, id string) (Interacted, error) {
	return c.verb(ctx, id, "retry", nil, false)
}

func (c *Client) verb(ctx context.Context, id, name string, body any, retry bool) (Interacted, error) {
	var in Interacted
	status, err := c.send(ctx, call{method: http.MethodPost, path: "/fleet/runs/" + url.PathEscape(id) + "/" + name, body: body, retry: retry}, &in.Interaction, true)
	in.HTTPStatus = status
	return in, err
}

// EgressQuery is GET /fleet/runs/{id}/egress' page: the records after
// Cursor, at most Limit; Verify checks the ledger's chain and seal.
type EgressQuery struct {
	Cursor int64
	Limit  int
	Verify bool
}

// Egress reads one page of a run's egress ledger.
func (c *Client) Egress(ctx context.Context, id string, q EgressQuery) (fleetapi.EgressPage, error) {
	v := url.Values{}
	if q.Cursor > 0 {
		v.Set("cursor", strconv.FormatInt(q.Cursor, 10))
	}
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Verify {
		v.Set("verify", "true")
	}
	var page fleetapi.EgressPage
	_, err := c.send(ctx, call{method: http.MethodGet, path: "/fleet/runs/" + url.PathEscape(id) + "/egress", query: v, retry: true}, &page, false)
	return page, err
}
