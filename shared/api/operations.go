package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"sort"

	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/rollup"
)

// The routes that act on a run through its host (input, cancel, retry),
// read its mirror (events) and roll up the hosts' metrics.

func (h *Handler) input(ctx context.Context, rq *request) (int, any, error) {
	value, err := inputValue(rq.body)
	if err != nil {
		return 0, nil, err
	}
	res, err := h.fleet.Input(ctx, rq.caller, rq.params["id"], value)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, toInteractionAnswer(res, rq.links), nil
}

func (h *Handler) cancel(ctx context.Context, rq *request) (int, any, error) {
	if err := noBody(rq.body); err != nil {
		return 0, nil, err
	}
	res, err := h.fleet.Cancel(ctx, rq.caller, rq.params["id"])
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, toInteractionAnswer(res, rq.links), nil
}

func (h *Handler) retry(ctx context.Context, rq *request) (int, any, error) {
	if err := noBody(rq.body); err != nil {
		return 0, nil, err
	}
	res, err := h.fleet.Retry(ctx, rq.caller, rq.params["id"])
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, toInteractionAnswer(res, rq.links), nil
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
		return nil, badRequest(`a JSON body is required: {"input": <any JSON value>}, or the value itself`)
	}
	if !json.Valid(trimmed) {
		return nil, invalidJSON(trimmed)
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

func (h *Handler) events(ctx context.Context, rq *request) (int, any, error) {
	after, _, err := rq.query.nonNegativeInt("after")
	if err != nil {
		return 0, nil, err
	}
	limit, _, err := rq.query.nonNegativeInt("limit")
	if err != nil {
		return 0, nil, err
	}
	limit = min(limit, fleet.MaxEventsLimit)
	page, err := h.fleet.Events(ctx, rq.caller, rq.params["id"], after, int(limit))
	if err != nil {
		return 0, nil, err
	}
	// Mirrored events are the host's, as they came (hostproto.Event is
	// DESIGN.md's event shape on both APIs).
	return http.StatusOK, map[string]any{"events": page.Events, "nextCursor": page.NextCursor, "hasMore": page.HasMore}, nil
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
