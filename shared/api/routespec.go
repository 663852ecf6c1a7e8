package api

// RouteSpec is one route of the table as the outside sees it: what
// template.yaml declares on the HTTP API and infra/openapi.yaml documents.
// Tests keep both identical to the table through Routes.
type RouteSpec struct {
	Method  string
	Pattern string
	// Public routes take no token; Admin ones need an admin token; the
	// rest need any caller's token.
	Public, Admin bool
	// Query lists the query parameters the route takes (any other is a 400).
	Query []string
}

// Routes lists every route of the table, in its order.
func Routes() []RouteSpec {
	var h Handler // only the table's shape is read: no handler runs
	table := h.routeTable()
	specs := make([]RouteSpec, len(table))
	for i, r := range table {
		specs[i] = RouteSpec{
			Method: r.method, Pattern: r.pattern, Public: r.access == public, Admin: r.access == adminOnly,
			Query: append([]string(nil), r.query...),
		}
	}
	return specs
}
