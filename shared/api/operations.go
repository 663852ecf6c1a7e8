package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"sort"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/rollup"
	"github.com/runfleet/runfleet/shared/store"
)

// The routes that act on a run through its host (input, cancel, retry:
// answered with outcomeStatus), read its mirror (events, the egress
// ledger) and roll up the hosts' metrics.

func (h *Handler) input(ctx context.Context, rq *request) (int, any, error) {
	value, err := inputValue(rq.body)
	if err != nil {
		return 0, nil, err
	}
	res, err := h.fleet.Input(ctx, rq.caller, rq.params["id"], value)
	if err != nil {
		return 0, nil, err
	}
	status, answer := toInteraction("input", res, rq.links)
	return status, answer, nil
}

func (h *Handler) cancel(ctx context.Context, rq *request) (int, any, error) {
	if err := noBody(rq.body); err != nil {
		return 0, nil, err
	}
	res, err := h.fleet.Cancel(ctx, rq.caller, rq.params["id"])
	if err != nil {
		return 0, nil, err
	}
	status, answer := toInteraction("cancel", res, rq.links)
	return status, answer, nil
}

func (h *Handler) retry(ctx context.Context, rq *request) (int, any, error) {
	if err := noBody(rq.body); err != nil {
		return 0, nil, err
	}
	res, err := h.fleet.Retry(ctx, rq.caller, rq.params["id"])
	if err != nil {
		return 0, nil, err
	}
	status, answer := toInteraction("retry", res, rq.links)
	return status, answer, nil
}

// inputValue reads POST /fleet/runs/{id}/input's body: {"input": v} sends v
// (unwrapped by the key's presence, so {"input": null} sends null), and any
// other JSON value is the input itself. An object with "input" and other
// fields is refused rather than guessed at: the caller either meant the
// wrapper (and the other fields would be lost) or an input object (which
// it must then wrap).
func inputValue(body []byte) (json.RawMessage, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return nil, jsonError(`a JSON body is required: {"input": <any JSON value>}, or the value itself`)
	}
	// The value is the task's, not Fleet's, yet a key given twice in it is
	// refused too: the host would refuse it (or read another value than a
	// reviewer of the request did).
	if err := checkJSON(trimmed); err != nil {
		return nil, err
	}
	if trimmed[0] != '{' {
		return json.RawMessage(trimmed), nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &obj); err != nil {
		return nil, badRequest("malformed object")
	}
	v, wrapped := obj["input"]
	if !wrapped {
		return json.RawMessage(trimmed), nil
	}
	if len(obj) > 1 {
		others := make([]string, 0, len(obj)-1)
		for k := range obj {
			if k != "input" {
				others = append(others, k)
			}
		}
		sort.Strings(others)
		return nil, badRequest(`unknown field %q beside "input": send {"input": <value>} alone, or wrap an object that has an "input" field as {"input": {...}}`, others[0])
	}
	return v, nil
}

// MaxEventsWait bounds the events route's wait (a long-poll): API
// Gateway ends an integration at 30 s, and the api function's timeout
// (template.yaml) must hold the wait, a last poll bounded by the host
// timeout, and a cold start.
const MaxEventsWait = 20 * time.Second

// EventsWaitPoll is the long-poll's time between polls, the stream's
// default (stream.DefaultPollInterval): the same freshness for the same
// DynamoDB reads per second.
const EventsWaitPoll = time.Second

// eventsWaitMargin is kept free before the invocation's deadline for the
// answer.
const eventsWaitMargin = 2 * time.Second

func (h *Handler) events(ctx context.Context, rq *request) (int, any, error) {
	after, _, err := rq.query.nonNegativeInt("after")
	if err != nil {
		return 0, nil, err
	}
	limit, err := rq.query.pageLimit(fleet.MaxEventsLimit)
	if err != nil {
		return 0, nil, err
	}
	wait, _, err := rq.query.nonNegativeInt("wait")
	if err != nil {
		return 0, nil, err
	}
	if wait > int64(MaxEventsWait/time.Second) {
		return 0, nil, badRequest("wait=%d: want at most %d seconds", wait, int64(MaxEventsWait/time.Second))
	}
	run, err := h.fleet.RunFor(ctx, rq.caller, rq.params["id"])
	if err != nil {
		return 0, nil, err
	}
	page, run, err := h.waitForEvents(ctx, rq, run, after, limit, time.Duration(wait)*time.Second)
	if err != nil {
		return 0, nil, err
	}
	// Mirrored events are the host's, as they came (DESIGN.md's event
	// shape on both APIs). live is the run's, not the page's: false once
	// the run has ended and its every event is mirrored, even on a page
	// with more after it (hasMore says that; issue 30).
	return http.StatusOK, toEventPage(page, run.Live()), nil
}

// waitForEvents is the events route's read, as a long-poll when wait > 0:
// each poll brings the run up to date from its host (fleet.SyncRun, the
// stream's pull-through), then reads the mirror after `after`; it answers
// as soon as that holds events, at once for a run that is over (no event
// can come), and with the empty page when wait has passed (or the
// invocation's deadline nears). Without wait it is one read of the mirror.
// run is RunFor's strongly consistent read: an `after` past its cursor is
// past the end for good (the cursor only grows), answered at once rather
// than waited on, since the events up to `after` would never be shown.
func (h *Handler) waitForEvents(ctx context.Context, rq *request, run store.Run, after int64, limit int, wait time.Duration) (fleet.EventsPage, store.Run, error) {
	if wait == 0 || after > run.EventCursor {
		page, err := h.fleet.MirroredEvents(ctx, run, after, limit)
		return page, run, err
	}
	until := h.clock.Now().Add(wait)
	if dl, ok := ctx.Deadline(); ok {
		if d := h.clock.Now().Add(time.Until(dl) - eventsWaitMargin); d.Before(until) {
			until = d
		}
	}
	for {
		// The host gets what is left of the wait: past it the mirror is
		// answered as it is (the sync's writes are conditional, so cutting
		// one short is safe).
		syncCtx, cancel := clock.WithDeadline(ctx, h.clock, until)
		synced, err := h.fleet.SyncRun(syncCtx, run.FleetRunID)
		cancel()
		switch {
		case err == nil || synced.FleetRunID != "":
			// Served from the mirror either way (a host that could not be
			// asked leaves the run as read). SyncRun may read eventually
			// consistent: a record older than the one held is not taken,
			// so the page is never judged against a cursor gone back.
			if synced.Version >= run.Version {
				run = synced
			}
		case ctx.Err() != nil:
			return fleet.EventsPage{}, run, ctx.Err()
		case errors.Is(err, store.ErrNotFound):
			_, err := h.fleet.RunFor(ctx, rq.caller, run.FleetRunID) // deleted meanwhile: its 404
			return fleet.EventsPage{}, run, err
		default:
			return fleet.EventsPage{}, run, err
		}
		page, err := h.fleet.MirroredEvents(ctx, run, after, limit)
		if err != nil {
			return fleet.EventsPage{}, run, err
		}
		now := h.clock.Now()
		if len(page.Events) > 0 || !run.Live() || !now.Before(until) {
			return page, run, nil
		}
		if !h.sleep(ctx, min(EventsWaitPoll, until.Sub(now))) {
			return fleet.EventsPage{}, run, ctx.Err()
		}
	}
}

// egress reads GET /fleet/runs/{id}/egress: a page of the run's ledger
// mirror after cursor (the events pages' conventions), with the ledger's
// summary and seal, and with verify=true the verification of the whole
// mirrored ledger. No long-poll: a ledger is followed on the stream
// (?egress=true) or by paging again.
func (h *Handler) egress(ctx context.Context, rq *request) (int, any, error) {
	after, _, err := rq.query.nonNegativeInt("cursor")
	if err != nil {
		return 0, nil, err
	}
	limit, err := rq.query.pageLimit(fleet.MaxEgressLimit)
	if err != nil {
		return 0, nil, err
	}
	verify, err := rq.query.boolFlag("verify")
	if err != nil {
		return 0, nil, err
	}
	page, err := h.fleet.Egress(ctx, rq.caller, rq.params["id"], after, limit, verify)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, toEgressPage(page), nil
}

// sleep waits d on the handler's clock; false when ctx ended first.
func (h *Handler) sleep(ctx context.Context, d time.Duration) bool {
	t := h.clock.NewTimer(d)
	defer t.Stop()
	if h.parked != nil {
		h.parked(ctx)
	}
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
		return false
	}
}

// metrics answers the rollup in Prometheus text; where the caller's hosts
// may go on past this page, a Link rel="next" header says where (text
// format has no place for it that a scraper would not take for a series).
func (h *Handler) metrics(ctx context.Context, rq *request) (int, any, error) {
	q := fleet.MetricsQuery{Host: rq.query.get("host"), After: rq.query.get("after")}
	for name, v := range map[string]string{"host": q.Host, "after": q.After} {
		if rq.query.has(name) && v == "" {
			return 0, nil, badRequest("%s is empty: omit it", name)
		}
	}
	page, err := h.fleet.MetricsRollup(ctx, rq.caller, q)
	if err != nil {
		return 0, nil, err
	}
	text, err := page.Text()
	if err != nil {
		return 0, nil, err
	}
	answer := textAnswer{contentType: rollup.ContentType, body: text}
	if page.Next != "" {
		answer.headers = map[string]string{"link": "<" + rq.links.api + "/metrics?after=" + url.QueryEscape(page.Next) + `>; rel="next"`}
	}
	return http.StatusOK, answer, nil
}
