package boltstore

import (
	"context"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/internal/routeview"
)

// bucketRouteView holds the routing view: list name -> its shards, each
// packed as dynamostore packs them (package routeview), so both stores keep
// the same hosts in the same shards. Made by the first PutRouteView.
var bucketRouteView = []byte("routeView")

// routeListItem is one list with all its shards: one transaction writes
// and reads it whole.
type routeListItem struct {
	V      int       `json:"v"`
	Shards [][]byte  `json:"shards"`
	Kept   int       `json:"kept"`
	Total  int       `json:"total"`
	At     time.Time `json:"at"`
}

func (it routeListItem) version() int { return it.V }

// PutRouteView replaces the whole view in one transaction.
func (s *Store) PutRouteView(ctx context.Context, v store.RouteView) (map[string]int, error) {
	kept := map[string]int{}
	err := s.update(ctx, func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(bucketRouteView); err != nil && err != bolt.ErrBucketNotFound {
			return err
		}
		b, err := tx.CreateBucket(bucketRouteView)
		if err != nil {
			return err
		}
		for name, hosts := range v.Lists {
			blobs, n := routeview.Pack(hosts, store.RouteShardsMax, routeview.ShardBytes)
			if len(blobs) == 0 {
				blobs = [][]byte{routeview.Encode(nil)}
			}
			kept[name] = n
			it := routeListItem{V: formatVersion, Shards: blobs, Kept: n, Total: v.Total, At: utc(v.At)}
			if err := putItem(b, []byte(name), it); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, wrap("put route view", err)
	}
	return kept, nil
}

// RouteShard reads one shard of list; ErrNotFound.
func (s *Store) RouteShard(ctx context.Context, list string, n int) (store.RouteShard, error) {
	var sh store.RouteShard
	err := s.view(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRouteView)
		var raw []byte
		if b != nil {
			raw = b.Get([]byte(list))
		}
		if raw == nil {
			return notFound("route list", list)
		}
		it, err := decode[routeListItem](raw)
		if err != nil {
			return err
		}
		if n < 0 || n >= len(it.Shards) {
			return notFound("route list", fmt.Sprintf("%s#%d", list, n))
		}
		hosts, err := routeview.Decode(it.Shards[n])
		if err != nil {
			return err
		}
		sh = store.RouteShard{Hosts: hosts, Shards: len(it.Shards), Kept: it.Kept, Total: it.Total, At: utc(it.At)}
		return nil
	})
	return sh, wrap("read route shard", err)
}

// RecordDrain sets the probe's draining and idle, where a probe exists.
func (s *Store) RecordDrain(ctx context.Context, id string, draining bool, idle *bool) (store.Host, error) {
	var h store.Host
	err := s.update(ctx, func(tx *bolt.Tx) error {
		it, err := getHost(tx, id)
		if err != nil {
			return err
		}
		if it.Probe != nil {
			it.Probe.Draining = draining
			it.Probe.Idle = clonePtr(idle)
			if err := putItem(tx.Bucket(bucketHosts), []byte(id), it); err != nil {
				return err
			}
		}
		h = it.record()
		return nil
	})
	return h, wrap("record drain", err)
}
