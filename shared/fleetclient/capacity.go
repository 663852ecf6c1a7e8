package fleetclient

import (
	"context"
	"net/http"

	"github.com/runfleet/runfleet/shared/fleetapi"
)

// Capacity is GET /fleet/capacity (admin): per routing class, the runs
// waiting and the room the fleet has for them.
func (c *Client) Capacity(ctx context.Context) (fleetapi.Capacity, error) {
	var cp fleetapi.Capacity
	_, err := c.send(ctx, call{method: http.MethodGet, path: "/fleet/capacity", retry: true}, &cp, false)
	return cp, err
}
