package dynamostore

import (
	"container/heap"
	"context"
	"errors"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/internal/cursor"
)

// ListRuns pages runs newest first. One owner or one host is one partition
// of byOwner or byHost; everyone is the "all" index, one partition per
// shard (allShards, merged k-way when there are several): the cost of a
// page does not depend on the number of hosts (see the package comment).
// Either way the index gives keys in order, strictly older than the
// cursor's position, and the page's runs are then fetched with
// BatchGetItem; expired or vanished runs are skipped and more keys pulled
// until the page (plus one, to know whether there is a next page) is full.
func (s *Store) ListRuns(ctx context.Context, q store.RunQuery) (store.RunPage, error) {
	if q.OwnerID != "" && q.HostID != "" {
		return store.RunPage{}, errors.New("dynamostore: list runs: ownerId and hostId together are not supported")
	}
	scope := cursor.Scope(q)
	before := ""
	if q.Cursor != "" {
		pos, err := cursor.DecodeRuns(q.Cursor, scope)
		if err != nil {
			return store.RunPage{}, err
		}
		before = createdKey(pos.CreatedAt, pos.FleetRunID)
	}
	limit := store.PageLimit(q.Limit)
	want := limit + 1

	var parts []*partition
	switch {
	case q.OwnerID != "":
		parts = []*partition{{index: indexByOwner, attr: attrOwnerID, value: q.OwnerID, before: before}}
	case q.HostID != "":
		parts = []*partition{{index: indexByHost, attr: attrHostID, value: q.HostID, before: before}}
	default:
		for i := range s.allShards {
			parts = append(parts, &partition{index: indexAll, attr: attrAllShard, value: strconv.Itoa(i), before: before})
		}
	}
	chunk := want
	if len(parts) > 1 {
		// Read units are priced by the 4 KB, and index entries are ~0.1 KB:
		// a chunk of mergeChunk keys costs what one key costs, and a
		// partition contributing more is simply asked again.
		chunk = min(want, mergeChunk)
	}
	m := s.newMerge(parts, chunk)
	now := s.now()
	var runs []store.Run
	for len(runs) < want {
		keys, err := m.take(ctx, want-len(runs))
		if err != nil {
			return store.RunPage{}, fault("list runs", err)
		}
		if len(keys) == 0 {
			break
		}
		got, err := s.batchGetRuns(ctx, keys)
		if err != nil {
			return store.RunPage{}, fault("list runs", err)
		}
		for _, r := range got {
			if r != nil && !store.Expired(r.ExpiresAt, now) {
				runs = append(runs, *r)
			}
		}
	}
	page := store.RunPage{Runs: runs}
	if len(runs) > limit {
		page.Runs = runs[:limit]
		last := runs[limit-1]
		page.NextCursor = cursor.EncodeRuns(cursor.Runs{Scope: scope, CreatedAt: last.CreatedAt, FleetRunID: last.FleetRunID})
	}
	return page, nil
}

// mergeChunk is how many keys a merged partition is asked for at a time:
// about what fits in 4 KB of index entries.
const mergeChunk = 32

// partition reads one partition of a runs index newest first, in chunks,
// from strictly before a position.
type partition struct {
	index, attr, value string
	// before is the exclusive upper bound on createdAt; empty: none.
	before string
	buf    []runKey
	start  map[string]types.AttributeValue // continuation of the last query
	done   bool
}

func (p *partition) fill(ctx context.Context, s *Store, n int) error {
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Runs),
		IndexName:                 aws.String(p.index),
		KeyConditionExpression:    aws.String("#k = :v"),
		ExpressionAttributeNames:  map[string]string{"#k": p.attr},
		ExpressionAttributeValues: map[string]types.AttributeValue{":v": &types.AttributeValueMemberS{Value: p.value}},
		ScanIndexForward:          aws.Bool(false),
		Limit:                     aws.Int32(int32(n)),
		ExclusiveStartKey:         p.start,
	}
	if p.before != "" {
		in.KeyConditionExpression = aws.String("#k = :v AND #c < :before")
		in.ExpressionAttributeNames["#c"] = attrCreatedAt
		in.ExpressionAttributeValues[":before"] = &types.AttributeValueMemberS{Value: p.before}
	}
	out, err := s.api.Query(ctx, in)
	if err != nil {
		return err
	}
	for _, it := range out.Items {
		k, err := runKeyFromItem(it)
		if err != nil {
			return err
		}
		p.buf = append(p.buf, k)
	}
	p.start = out.LastEvaluatedKey
	p.done = len(out.LastEvaluatedKey) == 0
	return nil
}

// merge yields the keys of several partitions in one newest-first order.
// A partition whose buffer runs dry is read again only when more keys are
// wanted, so a page never pays for a Query it does not use.
type merge struct {
	s     *Store
	chunk int
	heap  partitionHeap
	// dry are partitions with an empty buffer and more to read.
	dry []*partition
}

func (s *Store) newMerge(parts []*partition, chunk int) *merge {
	return &merge{s: s, chunk: chunk, dry: parts}
}

// take returns up to n next keys.
func (m *merge) take(ctx context.Context, n int) ([]runKey, error) {
	var keys []runKey
	for len(keys) < n {
		for _, p := range m.dry {
			if err := p.fill(ctx, m.s, m.chunk); err != nil {
				return nil, err
			}
			if len(p.buf) > 0 {
				heap.Push(&m.heap, p)
			}
		}
		m.dry = m.dry[:0]
		if len(m.heap) == 0 {
			break
		}
		p := m.heap[0]
		keys = append(keys, p.buf[0])
		p.buf = p.buf[1:]
		if len(p.buf) > 0 {
			heap.Fix(&m.heap, 0)
			continue
		}
		heap.Pop(&m.heap)
		if !p.done {
			m.dry = append(m.dry, p)
		}
	}
	return keys, nil
}

// partitionHeap orders partitions by their newest buffered key, newest on
// top. createdAt keys are unique (they end with the run id), so the order
// is total.
type partitionHeap []*partition

func (h partitionHeap) Len() int           { return len(h) }
func (h partitionHeap) Less(i, j int) bool { return h[i].buf[0].created > h[j].buf[0].created }
func (h partitionHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *partitionHeap) Push(x any)        { *h = append(*h, x.(*partition)) }
func (h *partitionHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	*h = old[:len(old)-1]
	return p
}
