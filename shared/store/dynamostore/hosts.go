package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/store"
)

func strKey(name, v string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{name: &types.AttributeValueMemberS{Value: v}}
}

// CreateHost adds h; ErrExists if the id is taken (a conditional put). A
// retry of a put whose response was lost finds its own item and succeeds
// (ownwrites.go).
func (s *Store) CreateHost(ctx context.Context, h store.Host) error {
	if h.ID == "" {
		return errors.New("dynamostore: create host: empty id")
	}
	token, err := s.newWriteToken()
	if err != nil {
		return err
	}
	it := hostItem(h)
	it[attrWriteToken] = token
	_, err = s.api.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           aws.String(s.tables.Hosts),
		Item:                                it,
		ConditionExpression:                 aws.String("attribute_not_exists(id)"),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if failed, old := conditionFailed(err); failed {
		held, herr := s.holder(ctx, s.tables.Hosts, strKey(attrID, h.ID), old)
		if herr != nil {
			return fault("create host: reading the holder", herr)
		}
		if wroteBy(held, token) {
			return nil
		}
		return fmt.Errorf("dynamostore: host %q: %w", h.ID, store.ErrExists)
	}
	if err != nil {
		return fault("create host", err)
	}
	return nil
}

// GetHost reads a host, strongly consistent; ErrNotFound.
func (s *Store) GetHost(ctx context.Context, id string) (store.Host, error) {
	out, err := s.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Hosts), Key: strKey(attrID, id), ConsistentRead: aws.Bool(!store.AllowsEventualRead(ctx)),
	})
	if err != nil {
		return store.Host{}, fault("get host", err)
	}
	if out.Item == nil {
		return store.Host{}, fmt.Errorf("dynamostore: host %q: %w", id, store.ErrNotFound)
	}
	h, err := hostFromItem(out.Item)
	if err != nil {
		return store.Host{}, fault("get host", err)
	}
	return h, nil
}

// ListHosts scans the hosts table (eventually consistent), skipping the
// routing view's items, and sorts by id.
func (s *Store) ListHosts(ctx context.Context) ([]store.Host, error) {
	var hosts []store.Host
	in := &dynamodb.ScanInput{TableName: aws.String(s.tables.Hosts)}
	for {
		out, err := s.api.Scan(ctx, in)
		if err != nil {
			return nil, fault("list hosts", err)
		}
		for _, it := range out.Items {
			if id, ok := it[attrID].(*types.AttributeValueMemberS); ok && strings.HasPrefix(id.Value, routePrefix) {
				continue // the routing view, not a host
			}
			h, err := hostFromItem(it)
			if err != nil {
				return nil, fault("list hosts", err)
			}
			hosts = append(hosts, h)
		}
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
	sort.Slice(hosts, func(i, j int) bool { return hosts[i].ID < hosts[j].ID })
	return hosts, nil
}

// SetHostEnabled flips enabled in one conditional update; ErrNotFound.
func (s *Store) SetHostEnabled(ctx context.Context, id string, enabled bool) (store.Host, error) {
	out, err := s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:           aws.String(s.tables.Hosts),
		Key:                 strKey(attrID, id),
		UpdateExpression:    aws.String("SET enabled = :e"),
		ConditionExpression: aws.String("attribute_exists(id)"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":e": &types.AttributeValueMemberBOOL{Value: enabled},
		},
		ReturnValues: types.ReturnValueAllNew,
	})
	if failed, _ := conditionFailed(err); failed {
		return store.Host{}, fmt.Errorf("dynamostore: host %q: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return store.Host{}, fault("set host enabled", err)
	}
	h, err := hostFromItem(out.Attributes)
	if err != nil {
		return store.Host{}, fault("set host enabled", err)
	}
	return h, nil
}

// RecordProbe replaces the host's probe attribute, only if the host exists.
func (s *Store) RecordProbe(ctx context.Context, id string, p store.Probe) error {
	_, err := s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.tables.Hosts),
		Key:                       strKey(attrID, id),
		UpdateExpression:          aws.String("SET probe = :p"),
		ConditionExpression:       aws.String("attribute_exists(id)"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":p": &types.AttributeValueMemberM{Value: probeItem(p)}},
	})
	if failed, _ := conditionFailed(err); failed {
		return fmt.Errorf("dynamostore: host %q: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return fault("record probe", err)
	}
	return nil
}

// DeleteHost removes a host in bounded steps (store.Store). A step reads
// the host (strong), one page of its byHost partition (at most
// store.DeleteHostRunsPerStep keys) and, without force, those runs
// (BatchGetItem) to refuse while one is unexpired; then, run by run, it
// reads the keys of the run's events, then of its egress ledger's items,
// while the step's budget (store.DeleteHostEventsPerStep items) lasts,
// batch-deletes those (25 a call), then the runs whose items were all
// read. When the page was the partition's last and every run on it
// went, the host is deleted too. A run's deletes within a batch may be
// cut short (a failed call): the repeat finds the run and what is left.
//
// The in-use check reads the byHost index, which is eventually consistent:
// a run created within the last second may be missed, and then outlives
// its host (Fleet sees a run whose host is gone). Closing that window
// would need a transaction on every dispatch (twice the write cost) for a
// rare admin action; it is not worth it. The same lag may show a step keys
// it deleted a moment ago; deleting them again is a no-op.
func (s *Store) DeleteHost(ctx context.Context, id string, force bool) (store.HostDeletion, error) {
	var res store.HostDeletion
	if _, err := s.GetHost(ctx, id); err != nil {
		return res, err
	}
	out, err := s.api.Query(ctx, &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Runs),
		IndexName:                 aws.String(indexByHost),
		KeyConditionExpression:    aws.String("#k = :v"),
		ExpressionAttributeNames:  map[string]string{"#k": attrHostID},
		ExpressionAttributeValues: map[string]types.AttributeValue{":v": &types.AttributeValueMemberS{Value: id}},
		Limit:                     aws.Int32(store.DeleteHostRunsPerStep),
	})
	if err != nil {
		return res, fault("delete host: listing its runs", err)
	}
	keys := make([]runKey, 0, len(out.Items))
	for _, it := range out.Items {
		k, err := runKeyFromItem(it)
		if err != nil {
			return res, fault("delete host: listing its runs", err)
		}
		keys = append(keys, k)
	}
	if !force && len(keys) > 0 {
		runs, err := s.batchGetRuns(ctx, keys)
		if err != nil {
			return res, fault("delete host: reading its runs", err)
		}
		now := s.now()
		for _, r := range runs {
			if r != nil && !store.Expired(r.ExpiresAt, now) {
				return res, fmt.Errorf("dynamostore: host %q is referenced by run %q: %w", id, r.FleetRunID, store.ErrInUse)
			}
		}
	}
	// Every event and egress delete of the step goes before any run
	// delete: a run is deleted only once all its events and its ledger
	// mirror's items are. The budget counts both.
	var events, egress, gone []types.WriteRequest
	for _, k := range keys {
		dels, done, err := s.deletesWithin(ctx, s.tables.Events, attrSequence, k.fleetRunID, store.DeleteHostEventsPerStep-len(events)-len(egress))
		if err != nil {
			return res, fault("delete host: listing the events of run "+k.fleetRunID, err)
		}
		events = append(events, dels...)
		if !done {
			break
		}
		dels, done, err = s.deletesWithin(ctx, s.tables.Egress, attrSeq, k.fleetRunID, store.DeleteHostEventsPerStep-len(events)-len(egress))
		if err != nil {
			return res, fault("delete host: listing the egress ledger of run "+k.fleetRunID, err)
		}
		egress = append(egress, dels...)
		if !done {
			break
		}
		gone = append(gone, types.WriteRequest{DeleteRequest: &types.DeleteRequest{Key: strKey(attrFleetRunID, k.fleetRunID)}})
	}
	if err := s.batchWriteAll(ctx, s.tables.Events, events); err != nil {
		return res, fault("delete host: deleting its runs' events", err)
	}
	if err := s.batchWriteAll(ctx, s.tables.Egress, egress); err != nil {
		return res, fault("delete host: deleting its runs' egress ledgers", err)
	}
	if err := s.batchWriteAll(ctx, s.tables.Runs, gone); err != nil {
		return res, fault("delete host: deleting its runs", err)
	}
	res.RunsDeleted = len(gone)
	if len(gone) < len(keys) || len(out.LastEvaluatedKey) > 0 {
		return res, nil
	}
	_, err = s.api.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:           aws.String(s.tables.Hosts),
		Key:                 strKey(attrID, id),
		ConditionExpression: aws.String("attribute_exists(id)"),
	})
	if failed, _ := conditionFailed(err); failed {
		return res, fmt.Errorf("dynamostore: host %q: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return res, fault("delete host", err)
	}
	res.Done = true
	return res, nil
}
