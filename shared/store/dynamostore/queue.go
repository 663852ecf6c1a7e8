package dynamostore

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/store"
)

// Every read of the queue index is a Query of its one partition (tables.go),
// eventually consistent as any GSI's: a class's entries are the keys from
// class+"#" up to class+"$" ("$" follows "#"), a range no other class's
// keys fall in because no class holds "#" (store.CheckRun). Entries are
// the keys, qh (a scoped run's hosts, at most 16 ids) and qu (Until),
// ~110 bytes unscoped, so a 4 KB read unit (0.5 RCU eventual) covers
// about 35 of them.

// classEnd is the first key after every entry of class.
func classEnd(class string) string { return class + "$" }

// queueQuery is a Query of the queue index whose sort key is between lo
// and hi (both included).
func (s *Store) queueQuery(lo, hi string) *dynamodb.QueryInput {
	return &dynamodb.QueryInput{
		TableName:                aws.String(s.tables.Runs),
		IndexName:                aws.String(indexQueue),
		KeyConditionExpression:   aws.String("#qp = :qp AND #qk BETWEEN :lo AND :hi"),
		ExpressionAttributeNames: map[string]string{"#qp": attrQueuePart, "#qk": attrQueueKey},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":qp": &types.AttributeValueMemberS{Value: queuePart},
			":lo": &types.AttributeValueMemberS{Value: lo},
			":hi": &types.AttributeValueMemberS{Value: hi},
		},
	}
}

// queueEntryOf reads an index entry of class.
func queueEntryOf(class string, it item) (store.QueueEntry, error) {
	r := &reader{it: it}
	k, hosts := r.s(attrQueueKey), r.s(attrQueueHosts)
	until := r.time(attrQueueEntryUntil)
	if r.err != nil {
		return store.QueueEntry{}, r.err
	}
	order, ok := strings.CutPrefix(k, class+store.QueueClassSeparator)
	if !ok {
		return store.QueueEntry{}, fmt.Errorf("queue entry %q outside class %q", k, class)
	}
	since, id, err := store.ParseQueueOrder(order)
	if err != nil {
		return store.QueueEntry{}, err
	}
	return store.QueueEntry{FleetRunID: id, Order: order, Since: since, Until: until, Hosts: splitHosts(hosts)}, nil
}

// QueueClasses implements store.Queue: QueueHeads' classes.
func (s *Store) QueueClasses(ctx context.Context) ([]string, error) {
	heads, err := s.QueueHeads(ctx)
	if err != nil {
		return nil, err
	}
	classes := make([]string, len(heads))
	for i, h := range heads {
		classes[i] = h.Class
	}
	return classes, nil
}

// QueueHeads skips through the index: the first entry, then the first
// past its class, and so on, one Query of one entry per class (0.5 RCU
// each, and one more to find none left), whatever the number of runs.
func (s *Store) QueueHeads(ctx context.Context) ([]store.QueueHead, error) {
	var heads []store.QueueHead
	from := ""
	for {
		in := &dynamodb.QueryInput{
			TableName:                aws.String(s.tables.Runs),
			IndexName:                aws.String(indexQueue),
			KeyConditionExpression:   aws.String("#qp = :qp"),
			ExpressionAttributeNames: map[string]string{"#qp": attrQueuePart},
			ExpressionAttributeValues: map[string]types.AttributeValue{
				":qp": &types.AttributeValueMemberS{Value: queuePart},
			},
			Limit: aws.Int32(1),
		}
		if from != "" {
			in.KeyConditionExpression = aws.String("#qp = :qp AND #qk >= :from")
			in.ExpressionAttributeNames["#qk"] = attrQueueKey
			in.ExpressionAttributeValues[":from"] = &types.AttributeValueMemberS{Value: from}
		}
		out, err := s.api.Query(ctx, in)
		if err != nil {
			return nil, fault("queue classes", err)
		}
		if len(out.Items) == 0 {
			break
		}
		r := &reader{it: out.Items[0]}
		k := r.s(attrQueueKey)
		class, _, ok := strings.Cut(k, store.QueueClassSeparator)
		if r.err != nil || !ok {
			return nil, fault("queue classes", fmt.Errorf("queue entry %q (%v): no class", k, r.err))
		}
		head, err := queueEntryOf(class, out.Items[0])
		if err != nil {
			return nil, fault("queue classes", err)
		}
		heads = append(heads, store.QueueHead{Class: class, Head: head})
		from = classEnd(class)
	}
	// Key order is not class order when one class extends another with
	// a byte below "#" ("a" and "a!"): sort.
	sort.Slice(heads, func(i, j int) bool { return heads[i].Class < heads[j].Class })
	return heads, nil
}

// ListQueue reads class's entries from after on, limit+1 of them to tell
// whether one follows.
func (s *Store) ListQueue(ctx context.Context, class, after string, limit int) (store.QueuePage, error) {
	limit = store.PageLimit(limit)
	lo := queueKey(class, after)
	in := s.queueQuery(lo, classEnd(class))
	var page store.QueuePage
	for {
		in.Limit = aws.Int32(int32(limit + 2 - len(page.Entries)))
		out, err := s.api.Query(ctx, in)
		if err != nil {
			return store.QueuePage{}, fault("list queue", err)
		}
		for _, it := range out.Items {
			e, err := queueEntryOf(class, it)
			if err != nil {
				return store.QueuePage{}, fault("list queue", err)
			}
			if after != "" && e.Order == after {
				continue
			}
			if len(page.Entries) == limit {
				page.Next = page.Entries[limit-1].Order
				return page, nil
			}
			page.Entries = append(page.Entries, e)
		}
		if len(out.LastEvaluatedKey) == 0 {
			return page, nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// QueueAhead counts (Select COUNT) the entries from class's first up to
// order's key, backwards from that key excluded: the start key need not
// be an entry, so an order no run holds (any more) counts as well.
// ceil(entries x ~110 B / 4 KB) x 0.5 RCU: 0.5 up to ~35 ahead.
func (s *Store) QueueAhead(ctx context.Context, class, order string) (int, error) {
	_, id, err := store.ParseQueueOrder(order)
	if err != nil {
		return 0, fmt.Errorf("dynamostore: queue ahead: %w", err)
	}
	key := queueKey(class, order)
	in := s.queueQuery(class+store.QueueClassSeparator, key)
	in.Select = types.SelectCount
	in.ScanIndexForward = aws.Bool(false)
	in.ExclusiveStartKey = map[string]types.AttributeValue{
		attrQueuePart:  &types.AttributeValueMemberS{Value: queuePart},
		attrQueueKey:   &types.AttributeValueMemberS{Value: key},
		attrFleetRunID: &types.AttributeValueMemberS{Value: id},
	}
	n := 0
	for {
		out, err := s.api.Query(ctx, in)
		if err != nil {
			return 0, fault("queue ahead", err)
		}
		n += int(out.Count)
		if len(out.LastEvaluatedKey) == 0 {
			return n, nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// QueueStats reads every entry of class: the count, and the earliest
// Since, which is not the head's when a priority overtook.
func (s *Store) QueueStats(ctx context.Context, class string) (store.QueueStats, error) {
	in := s.queueQuery(class+store.QueueClassSeparator, classEnd(class))
	var st store.QueueStats
	for {
		out, err := s.api.Query(ctx, in)
		if err != nil {
			return store.QueueStats{}, fault("queue stats", err)
		}
		for _, it := range out.Items {
			e, err := queueEntryOf(class, it)
			if err != nil {
				return store.QueueStats{}, fault("queue stats", err)
			}
			st.Waiting++
			if st.Oldest.IsZero() || e.Since.Before(st.Oldest) {
				st.Oldest = e.Since
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			return st, nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}
