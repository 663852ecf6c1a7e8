package storetest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
)

// routeViewContract is store.RouteStore's contract.
var routeViewContract = []contractCase{
	roleCase("RouteView/PutRead", testRouteViewPutRead),
	roleCase("RouteView/ReplacesLists", testRouteViewReplaces),
	roleCase("RouteView/TruncatesToShards", testRouteViewTruncates),
	roleCase("RouteView/LeavesOutAHostLargerThanAShard", testRouteViewFatHost),
}

// routesAndHosts: the routing view lives beside the hosts (dynamostore:
// in their table) and is never listed as one.
type routesAndHosts interface {
	store.RouteStore
	store.Hosts
}

// testRouteViewPutRead: a list reads back in its order, each entry holding
// exactly what routing decides from, and nothing of the address,
// credential or CA.
func testRouteViewPutRead(t *testing.T, s store.RouteStore, clk *clock.Fake) {
	now := clk.Now()
	ok := host("b-ok", now)
	p := probe(now, store.ProbeOK)
	p.Storage.Low = true
	ok.Probe = &p
	sick := host("a-sick", now)
	sp := probe(now.Add(-time.Minute), store.ProbeUnreachable)
	sick.Probe = &sp
	never := host("c-never", now)
	never.Enabled = false
	never.Labels, never.LocalPaths = nil, nil

	kept, err := s.PutRouteView(bg, store.RouteView{
		Lists: map[string][]store.Host{"a:shell": {ok, sick, never}, "any": {sick}},
		Total: 3, At: now,
	})
	noErr(t, "PutRouteView", err)
	sameJSON(t, "kept", kept, map[string]int{"a:shell": 3, "any": 1})

	sh, err := s.RouteShard(bg, "a:shell", 0)
	noErr(t, "RouteShard", err)
	wantOK := store.Host{ID: "b-ok", Enabled: true, Labels: ok.Labels, LocalPaths: ok.LocalPaths, Probe: &store.Probe{
		Status: store.ProbeOK, At: now, LatencyMs: 42, Draining: true, Agents: []string{"claude", "shell"},
		Features: store.Features{SecretsProxy: true, ExecRequire: true}, Storage: &store.Storage{Low: true},
		Load: &store.Load{Active: 0, MaxConcurrent: 4},
	}}
	wantSick := store.Host{ID: "a-sick", Enabled: true, Labels: sick.Labels, LocalPaths: sick.LocalPaths,
		Probe: &store.Probe{Status: store.ProbeUnreachable, At: now.Add(-time.Minute)}}
	wantNever := store.Host{ID: "c-never"}
	sameJSON(t, "shard", sh, store.RouteShard{Hosts: []store.Host{wantOK, wantSick, wantNever}, Shards: 1, Kept: 3, Total: 3, At: now})

	_, err = s.RouteShard(bg, "a:shell", 1)
	wantErr(t, "RouteShard past the last shard", err, store.ErrNotFound)
	_, err = s.RouteShard(bg, "a:claude", 0)
	wantErr(t, "RouteShard of a list the view lacks", err, store.ErrNotFound)
}

// testRouteViewReplaces: a new view drops the lists the previous one had
// and it lacks; an empty list is one shard of no host; the view is never
// listed as a host.
func testRouteViewReplaces(t *testing.T, s routesAndHosts, clk *clock.Fake) {
	now := clk.Now()
	noErr(t, "CreateHost", s.CreateHost(bg, host("h1", now)))
	_, err := s.PutRouteView(bg, store.RouteView{Lists: map[string][]store.Host{"a:shell": {host("h1", now)}, "any": {host("h1", now)}}, Total: 1, At: now})
	noErr(t, "PutRouteView", err)
	_, err = s.PutRouteView(bg, store.RouteView{Lists: map[string][]store.Host{"any": nil}, Total: 0, At: now.Add(time.Minute)})
	noErr(t, "PutRouteView again", err)
	_, err = s.RouteShard(bg, "a:shell", 0)
	wantErr(t, "RouteShard of a dropped list", err, store.ErrNotFound)
	sh, err := s.RouteShard(bg, "any", 0)
	noErr(t, "RouteShard any", err)
	if len(sh.Hosts) != 0 || sh.Shards != 1 || sh.Kept != 0 || !sh.At.Equal(now.Add(time.Minute)) {
		t.Fatalf("empty list: %+v, want one shard of no host at the new time", sh)
	}
	hosts, err := s.ListHosts(bg)
	noErr(t, "ListHosts", err)
	if len(hosts) != 1 || hosts[0].ID != "h1" {
		t.Fatalf("ListHosts = %+v, want h1 alone (never the view)", hosts)
	}
}

// testRouteViewTruncates: a list larger than RouteShardsMax shards keeps
// its leading hosts, in order, across exactly that many shards; a smaller
// one later leaves no shard of the larger behind.
func testRouteViewTruncates(t *testing.T, s store.RouteStore, clk *clock.Fake) {
	now := clk.Now()
	var many []store.Host
	for i := 0; i < 3000; i++ {
		h := store.Host{ID: fmt.Sprintf("host-%05d", i), Enabled: true, Labels: map[string]string{"rack": fmt.Sprintf("r%d", i)}}
		p := store.Probe{Status: store.ProbeOK, At: now.Add(time.Duration(i) * time.Millisecond), LatencyMs: int64(i % 97), Agents: []string{"shell"}}
		h.Probe = &p
		many = append(many, h)
	}
	kept, err := s.PutRouteView(bg, store.RouteView{Lists: map[string][]store.Host{"any": many}, Total: len(many), At: now})
	noErr(t, "PutRouteView", err)
	var got []string
	for n := 0; n < store.RouteShardsMax; n++ {
		sh, err := s.RouteShard(bg, "any", n)
		noErr(t, fmt.Sprintf("RouteShard %d", n), err)
		if sh.Shards != store.RouteShardsMax || sh.Kept != kept["any"] || sh.Total != len(many) {
			t.Fatalf("shard %d: %d shards, %d kept, %d total; want %d, %d, %d", n, sh.Shards, sh.Kept, sh.Total, store.RouteShardsMax, kept["any"], len(many))
		}
		for _, h := range sh.Hosts {
			got = append(got, h.ID)
		}
	}
	if len(got) != kept["any"] || kept["any"] < 100 || kept["any"] >= len(many) {
		t.Fatalf("%d hosts read over the shards, %d kept of %d", len(got), kept["any"], len(many))
	}
	for i, id := range got {
		if id != many[i].ID {
			t.Fatalf("entry %d is %s, want %s: the list's order", i, id, many[i].ID)
		}
	}
	_, err = s.RouteShard(bg, "any", store.RouteShardsMax)
	wantErr(t, "RouteShard past the bound", err, store.ErrNotFound)

	_, err = s.PutRouteView(bg, store.RouteView{Lists: map[string][]store.Host{"any": many[:2]}, Total: 2, At: now})
	noErr(t, "PutRouteView smaller", err)
	_, err = s.RouteShard(bg, "any", 1)
	wantErr(t, "RouteShard of a shard the list no longer fills", err, store.ErrNotFound)
}

// testRouteViewFatHost: a host whose entry alone outgrows a shard (labels
// at their bounds, which do not compress) is left out; the hosts after it
// are kept, in order.
func testRouteViewFatHost(t *testing.T, s store.RouteStore, clk *clock.Fake) {
	now := clk.Now()
	fat := store.Host{ID: "fat", Enabled: true, Labels: map[string]string{}}
	for i := 0; i < 64; i++ {
		var v []byte
		for j := 0; len(v) < 256; j++ {
			sum := sha256.Sum256([]byte(fmt.Sprint(i, j)))
			v = append(v, hex.EncodeToString(sum[:])...)
		}
		fat.Labels[fmt.Sprintf("k%02d", i)] = string(v[:256])
	}
	hosts := []store.Host{{ID: "a", Enabled: true}, fat, {ID: "b", Enabled: true}}
	kept, err := s.PutRouteView(bg, store.RouteView{Lists: map[string][]store.Host{"any": hosts}, Total: 3, At: now})
	noErr(t, "PutRouteView", err)
	var got []string
	for n := 0; ; n++ {
		sh, err := s.RouteShard(bg, "any", n)
		if errors.Is(err, store.ErrNotFound) {
			break
		}
		noErr(t, "RouteShard", err)
		for _, h := range sh.Hosts {
			got = append(got, h.ID)
		}
	}
	if kept["any"] != 2 || fmt.Sprint(got) != "[a b]" {
		t.Fatalf("kept %d, read %v; want a and b, without the host too large for a shard", kept["any"], got)
	}
}
