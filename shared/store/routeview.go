package store

import (
	"context"
	"time"
)

// RouteStore keeps the routing view: bounded reads for dispatch, in place
// of a scan of every host.
//
// An entry keeps of a Host its ID, Enabled, Labels and LocalPaths and, of
// its probe, Status, At, LatencyMs, Draining, Agents, Features, Load and
// Storage.Low (a Storage holding only Low, nil when not low); a probe that
// is not ok keeps Status and At only. Everything else is left out.
type RouteStore interface {
	// PutRouteView replaces the view: each list's hosts, in order, are
	// packed into at most RouteShardsMax shards of at most 4 KB each (a
	// DynamoDB item an eventually consistent GetItem reads for half a
	// unit); the hosts that do not fit are left out, and so is a host
	// whose entry alone outgrows a shard. Lists of the previous
	// view that v lacks are deleted, and so are shards a list no longer
	// fills. It returns, per list, how many hosts were kept. Lists are
	// written one after the other: a reader may see a list of the new view
	// beside one of the old.
	PutRouteView(ctx context.Context, v RouteView) (map[string]int, error)
	// RouteShard reads shard n of list, eventually consistent; ErrNotFound
	// when the view has no such list or shard.
	RouteShard(ctx context.Context, list string, n int) (RouteShard, error)
}

// RouteShardsMax is how many shards a list of the routing view holds at
// most: the hosts that do not fit are left out of it.
const RouteShardsMax = 3

// RouteView is the routing view as the probe pass writes it: for each list
// ("a:<agent>" or "any"), every host in the order routing should consider
// them. The view keeps of each host only what routing decides from (see
// RouteStore); never its address, credential or CA.
type RouteView struct {
	Lists map[string][]Host
	// Total is how many hosts the fleet had when the view was built.
	Total int
	// At is when it was built.
	At time.Time
}

// RouteShard is one shard of a list of the routing view.
type RouteShard struct {
	// Hosts are the shard's entries, in the list's order.
	Hosts []Host
	// Shards is how many shards the list has; Kept how many hosts they
	// hold together; Total how many the fleet had (Kept < Total: the list
	// was truncated).
	Shards, Kept, Total int
	// At is when the view was built.
	At time.Time
}
