package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/internal/routeview"
)

// The routing view lives in the hosts table under ids no host can have
// (host ids begin with a letter or digit): a shard "#route#<list>#<n>" and
// one index "#route#index" naming every list with its shard count, which
// lets a pass delete what the previous one wrote and this one did not.
const (
	routePrefix   = "#"
	routeIndexID  = "#route#index"
	attrEntries   = "e"
	attrEntriesV  = "ev"
	attrShards    = "n"
	attrKept      = "k"
	attrTotal     = "tot"
	attrRouteAt   = "at"
	attrRouteList = "lists"
)

func routeShardID(list string, n int) string { return "#route#" + list + "#" + strconv.Itoa(n) }

// PutRouteView writes each list's shards with BatchWriteItem, then deletes
// what the previous view had beyond them, keeping the index in step: it
// names the union of both views while shards are written, so a pass that
// dies midway leaves nothing the next one cannot find.
func (s *Store) PutRouteView(ctx context.Context, v store.RouteView) (map[string]int, error) {
	old, err := s.routeIndex(ctx)
	if err != nil {
		return nil, fault("put route view: reading its index", err)
	}
	names := make([]string, 0, len(v.Lists))
	for name := range v.Lists {
		names = append(names, name)
	}
	sort.Strings(names)
	type packed struct {
		blobs [][]byte
		kept  int
	}
	lists := map[string]packed{}
	next := map[string]int{}
	union := map[string]int{}
	for name, n := range old {
		union[name] = n
	}
	grown := false
	for _, name := range names {
		blobs, kept := routeview.Pack(v.Lists[name], store.RouteShardsMax, routeview.ShardBytes)
		if len(blobs) == 0 {
			blobs = [][]byte{routeview.Encode(nil)}
		}
		lists[name] = packed{blobs, kept}
		next[name] = len(blobs)
		if len(blobs) > union[name] {
			union[name], grown = len(blobs), true
		}
	}
	if grown {
		if err := s.putRouteIndex(ctx, union); err != nil {
			return nil, fault("put route view: writing its index", err)
		}
	}
	var puts, deletes []types.WriteRequest
	keptBy := map[string]int{}
	for _, name := range names {
		p := lists[name]
		keptBy[name] = p.kept
		for i, blob := range p.blobs {
			it := item{}
			it.putS(attrID, routeShardID(name, i))
			it.putNAlways(attrVersionFormat, formatVersion)
			it.putNAlways(attrEntriesV, routeview.Version)
			it[attrEntries] = &types.AttributeValueMemberB{Value: blob}
			it.putNAlways(attrShards, int64(len(p.blobs)))
			it.putNAlways(attrKept, int64(p.kept))
			it.putNAlways(attrTotal, int64(v.Total))
			it.putTime(attrRouteAt, v.At)
			puts = append(puts, types.WriteRequest{PutRequest: &types.PutRequest{Item: it}})
		}
	}
	for name, n := range union {
		for i := next[name]; i < n; i++ {
			deletes = append(deletes, types.WriteRequest{DeleteRequest: &types.DeleteRequest{Key: strKey(attrID, routeShardID(name, i))}})
		}
	}
	for _, reqs := range [][]types.WriteRequest{puts, deletes} {
		for start := 0; start < len(reqs); start += batchWriteMax {
			if err := s.batchWrite(ctx, s.tables.Hosts, reqs[start:min(start+batchWriteMax, len(reqs))]); err != nil {
				return nil, fault("put route view", err)
			}
		}
	}
	if !maps.Equal(union, next) {
		if err := s.putRouteIndex(ctx, next); err != nil {
			return nil, fault("put route view: writing its index", err)
		}
	}
	return keptBy, nil
}

// RouteShard reads one shard, eventually consistent: half a unit.
func (s *Store) RouteShard(ctx context.Context, list string, n int) (store.RouteShard, error) {
	out, err := s.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Hosts), Key: strKey(attrID, routeShardID(list, n)), ConsistentRead: aws.Bool(false),
	})
	if err != nil {
		return store.RouteShard{}, fault("read route shard", err)
	}
	if out.Item == nil {
		return store.RouteShard{}, fmt.Errorf("dynamostore: route list %q shard %d: %w", list, n, store.ErrNotFound)
	}
	r := &reader{it: out.Item}
	r.checkVersion()
	if ev := r.n(attrEntriesV); ev != routeview.Version && r.err == nil {
		r.err = fmt.Errorf("route entries format version %d, want %d", ev, routeview.Version)
	}
	sh := store.RouteShard{Shards: int(r.n(attrShards)), Kept: int(r.n(attrKept)), Total: int(r.n(attrTotal)), At: r.time(attrRouteAt)}
	blob, ok := out.Item[attrEntries].(*types.AttributeValueMemberB)
	if !ok && r.err == nil {
		r.err = errors.New("route shard: no entries")
	}
	if err := r.done(); err != nil {
		return store.RouteShard{}, fault("read route shard", err)
	}
	if sh.Hosts, err = routeview.Decode(blob.Value); err != nil {
		return store.RouteShard{}, fault("read route shard", err)
	}
	return sh, nil
}

// routeIndex reads the view's index, strongly consistent: list -> shards.
func (s *Store) routeIndex(ctx context.Context) (map[string]int, error) {
	out, err := s.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Hosts), Key: strKey(attrID, routeIndexID), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, err
	}
	idx := map[string]int{}
	r := &reader{it: out.Item}
	lists := r.sub(attrRouteList)
	if lists == nil {
		return idx, r.done()
	}
	for name := range lists.it {
		idx[name] = int(lists.n(name))
	}
	return idx, r.done(lists)
}

func (s *Store) putRouteIndex(ctx context.Context, idx map[string]int) error {
	lists := item{}
	for name, n := range idx {
		lists.putNAlways(name, int64(n))
	}
	it := item{}
	it.putS(attrID, routeIndexID)
	it.putNAlways(attrVersionFormat, formatVersion)
	it[attrRouteList] = &types.AttributeValueMemberM{Value: lists}
	// A batch of one, as the shards are written: the view needs no
	// PutItem, so the probe's role grants none.
	return s.batchWrite(ctx, s.tables.Hosts, []types.WriteRequest{{PutRequest: &types.PutRequest{Item: it}}})
}
