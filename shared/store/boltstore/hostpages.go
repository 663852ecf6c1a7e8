package boltstore

import (
	"bytes"
	"context"

	bolt "go.etcd.io/bbolt"

	"github.com/runfleet/runfleet/shared/store"
)

// ListHostsPage returns up to limit hosts after the id after, by id.
func (s *Store) ListHostsPage(ctx context.Context, after string, limit int) (store.HostPage, error) {
	limit = store.PageLimit(limit)
	var page store.HostPage
	err := s.view(ctx, func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketHosts).Cursor()
		k, v := c.First()
		if after != "" {
			if k, v = c.Seek([]byte(after)); bytes.Equal(k, []byte(after)) {
				k, v = c.Next()
			}
		}
		for ; k != nil; k, v = c.Next() {
			if len(page.Hosts) == limit {
				page.Next = page.Hosts[limit-1].ID
				return nil
			}
			it, err := decode[hostItem](v)
			if err != nil {
				return err
			}
			page.Hosts = append(page.Hosts, it.record())
		}
		return nil
	})
	if err != nil {
		return store.HostPage{}, wrap("list a page of hosts", err)
	}
	return page, nil
}
