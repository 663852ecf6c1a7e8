package fleetclient

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/runfleet/runfleet/shared/fleetapi"
)

// Health is GET /healthz: the API's product and version (no token needed).
func (c *Client) Health(ctx context.Context) (fleetapi.Health, error) {
	var h fleetapi.Health
	_, err := c.send(ctx, call{method: http.MethodGet, path: "/healthz", retry: true}, &h, false)
	return h, err
}

// Hosts is GET /fleet/hosts: the hosts the caller may use (an admin sees
// each host's full record).
func (c *Client) Hosts(ctx context.Context) ([]fleetapi.Host, error) {
	var l fleetapi.HostList
	_, err := c.send(ctx, call{method: http.MethodGet, path: "/fleet/hosts", retry: true}, &l, false)
	return l.Hosts, err
}

// Host is one host of Hosts' list (the API lists hosts whole, unpaged): a
// host the caller may not see is a not-found *Error, as the API answers
// for a run it may not see.
func (c *Client) Host(ctx context.Context, id string) (fleetapi.Host, error) {
	hosts, err := c.Hosts(ctx)
	if err != nil {
		return fleetapi.Host{}, err
	}
	for _, h := range hosts {
		if h.ID == id {
			return h, nil
		}
	}
	return fleetapi.Host{}, &Error{Status: http.StatusNotFound, Code: "host_not_found",
		Message: fmt.Sprintf("no host %q among the hosts this token may use", id)}
}

// RegisterHost is POST /fleet/hosts (admin).
func (c *Client) RegisterHost(ctx context.Context, r fleetapi.RegisterHost) (fleetapi.Host, error) {
	var a fleetapi.HostAnswer
	// Not retried: a repeat of a registration that landed is refused as
	// a duplicate, hiding the success.
	_, err := c.send(ctx, call{method: http.MethodPost, path: "/fleet/hosts", body: r}, &a, false)
	return a.Host, err
}

// EnableHost is POST /fleet/hosts/{id}/enable (admin).
func (c *Client) EnableHost(ctx context.Context, id string, enabled bool) (fleetapi.Host, error) {
	var a fleetapi.HostAnswer
	_, err := c.send(ctx, call{method: http.MethodPost, path: "/fleet/hosts/" + url.PathEscape(id) + "/enable",
		body: fleetapi.SetEnabled{Enabled: enabled}, retry: true}, &a, false)
	return a.Host, err
}

// DeleteHost is DELETE /fleet/hosts/{id} (admin), repeated while the API
// answers 202 (one call deletes a bounded number of the host's runs).
func (c *Client) DeleteHost(ctx context.Context, id string, force bool) (fleetapi.HostDeleted, error) {
	q := url.Values{}
	if force {
		q.Set("force", "true")
	}
	for {
		a, err := c.do(ctx, call{method: http.MethodDelete, path: "/fleet/hosts/" + url.PathEscape(id), query: q, retry: true})
		if err != nil {
			return fleetapi.HostDeleted{}, err
		}
		if a.status == http.StatusAccepted {
			continue
		}
		var d fleetapi.HostDeleted
		return d, decodeInto(call{method: http.MethodDelete, path: "/fleet/hosts/" + id}, a, &d)
	}
}

// ProbeHost is POST /fleet/hosts/{id}/probe (admin): the probe's result.
func (c *Client) ProbeHost(ctx context.Context, id string) (fleetapi.Probe, error) {
	var a fleetapi.ProbeAnswer
	_, err := c.send(ctx, call{method: http.MethodPost, path: "/fleet/hosts/" + url.PathEscape(id) + "/probe", retry: true}, &a, false)
	return a.Probe, err
}

// ProbeAll is POST /fleet/probe (admin).
func (c *Client) ProbeAll(ctx context.Context) (fleetapi.ProbeAll, error) {
	var a fleetapi.ProbeAll
	_, err := c.send(ctx, call{method: http.MethodPost, path: "/fleet/probe", retry: true}, &a, false)
	return a, err
}

// HostDrained is a drain's or a resume's answer: 200 the host took it,
// 202 unknown, 409 refused (with the *Error).
type HostDrained struct {
	fleetapi.HostDrain
	HTTPStatus int
}

// DrainHost is POST /fleet/hosts/{id}/drain (admin): the host takes no new
// run; its running runs go on.
func (c *Client) DrainHost(ctx context.Context, id string) (HostDrained, error) {
	return c.drainVerb(ctx, id, "drain")
}

// ResumeHost is POST /fleet/hosts/{id}/resume (admin).
func (c *Client) ResumeHost(ctx context.Context, id string) (HostDrained, error) {
	return c.drainVerb(ctx, id, "resume")
}

func (c *Client) drainVerb(ctx context.Context, id, name string) (HostDrained, error) {
	var d HostDrained
	status, err := c.send(ctx, call{method: http.MethodPost, path: "/fleet/hosts/" + url.PathEscape(id) + "/" + name, retry: true}, &d.HostDrain, true)
	d.HTTPStatus = status
	return d, err
}

// MintCaller is POST /fleet/callers (admin): the new caller's token, shown
// this once.
func (c *Client) MintCaller(ctx context.Context, m fleetapi.MintCaller) (fleetapi.Minted, error) {
	var a fleetapi.Minted
	// Not retried: a lost answer's token is unrecoverable, and a second
	// mint would leave a live token nobody holds.
	_, err := c.send(ctx, call{method: http.MethodPost, path: "/fleet/callers", body: m}, &a, false)
	return a, err
}

// Callers is GET /fleet/callers (admin).
func (c *Client) Callers(ctx context.Context) ([]fleetapi.Caller, error) {
	var l fleetapi.CallerList
	_, err := c.send(ctx, call{method: http.MethodGet, path: "/fleet/callers", retry: true}, &l, false)
	return l.Callers, err
}

// RevokeCaller is DELETE /fleet/callers/{ownerId} (admin).
func (c *Client) RevokeCaller(ctx context.Context, ownerID string) error {
	var r fleetapi.Revoked
	_, err := c.send(ctx, call{method: http.MethodDelete, path: "/fleet/callers/" + url.PathEscape(ownerID), retry: true}, &r, false)
	return err
}

// Metrics is GET /metrics: one page of the hosts' metrics (Prometheus
// text), and the cursor of the next page ("" at the end).
func (c *Client) Metrics(ctx context.Context, host, after string) (text []byte, next string, err error) {
	q := url.Values{}
	if host != "" {
		q.Set("host", host)
	}
	if after != "" {
		q.Set("after", after)
	}
	a, err := c.do(ctx, call{method: http.MethodGet, path: "/metrics", query: q, retry: true,
		headers: map[string]string{"Accept": "text/plain"}})
	if err != nil {
		return nil, "", err
	}
	if link := a.header.Get("Link"); link != "" {
		next = nextAfter(link)
	}
	return a.body, next, nil
}

// nextAfter reads the after= of a Link: <...?after=X>; rel="next".
func nextAfter(link string) string {
	start, end := 0, len(link)
	for i, r := range link {
		switch r {
		case '<':
			start = i + 1
		case '>':
			end = i
		}
	}
	if start >= end {
		return ""
	}
	u, err := url.Parse(link[start:end])
	if err != nil {
		return ""
	}
	return u.Query().Get("after")
}
