package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/internal/cursor"
)

// Conditions shared by the writes. An expired item counts as absent: ":now"
// is the current epoch second, and an item whose expiresAt (whole seconds)
// is at or before it has expired (store.Expired).
const (
	condAbsentOrExpired  = "attribute_not_exists(#pk) OR #exp <= :now"
	condPresentUnexpired = "attribute_exists(#pk) AND (attribute_not_exists(#exp) OR #exp > :now)"
)

// batchGetMax is BatchGetItem's limit on keys per call.
const batchGetMax = 100

// unprocessedBackoff is the first pause before re-asking for keys DynamoDB
// left unprocessed (throttling); it doubles per retry.
const (
	unprocessedBackoff  = 50 * time.Millisecond
	unprocessedAttempts = 8
)

func nowValue(now time.Time) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(now.Unix(), 10)}
}

func expiryNames(pk string) map[string]string {
	return map[string]string{"#pk": pk, "#exp": attrExpiresAt}
}

// GetIdempotency reads the item, strongly consistent unless ctx carries
// store.EventualRead; ErrNotFound when absent or expired.
func (s *Store) GetIdempotency(ctx context.Context, key string) (store.Idempotency, error) {
	out, err := s.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Idempotency), Key: strKey(attrID, key),
		ConsistentRead: aws.Bool(!store.AllowsEventualRead(ctx)),
	})
	if err != nil {
		return store.Idempotency{}, fault("get idempotency", err)
	}
	if out.Item == nil {
		return store.Idempotency{}, fmt.Errorf("dynamostore: idempotency key %q: %w", key, store.ErrNotFound)
	}
	it, err := idempotencyFromItem(out.Item)
	if err != nil {
		return store.Idempotency{}, fault("get idempotency", err)
	}
	if store.Expired(it.ExpiresAt, s.now()) {
		return store.Idempotency{}, fmt.Errorf("dynamostore: idempotency key %q: %w", key, store.ErrNotFound)
	}
	return it, nil
}

// PutIdempotency is one conditional put: it succeeds when the key is free or
// its item expired; otherwise DynamoDB hands back the holder (ALL_OLD on the
// failed condition), returned with ErrExists without a second read, unless
// the holder is this call's own item (a retry after a lost response,
// ownwrites.go), which is success.
func (s *Store) PutIdempotency(ctx context.Context, i store.Idempotency) (store.Idempotency, error) {
	if i.Key == "" {
		return store.Idempotency{}, errors.New("dynamostore: put idempotency: empty key")
	}
	token, err := s.newWriteToken()
	if err != nil {
		return store.Idempotency{}, err
	}
	it := idempotencyItem(i)
	it[attrWriteToken] = token
	_, err = s.api.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           aws.String(s.tables.Idempotency),
		Item:                                it,
		ConditionExpression:                 aws.String(condAbsentOrExpired),
		ExpressionAttributeNames:            expiryNames(attrID),
		ExpressionAttributeValues:           map[string]types.AttributeValue{":now": nowValue(s.now())},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if failed, old := conditionFailed(err); failed {
		held, herr := s.holder(ctx, s.tables.Idempotency, strKey(attrID, i.Key), old)
		if herr != nil {
			return store.Idempotency{}, fault("put idempotency: reading the holder", herr)
		}
		if held == nil {
			return store.Idempotency{}, fault("put idempotency", fmt.Errorf("key %q: the condition failed but the holder is gone", i.Key))
		}
		existing, derr := idempotencyFromItem(held)
		if derr != nil {
			return store.Idempotency{}, fault("put idempotency: reading the holder", derr)
		}
		if wroteBy(held, token) {
			return existing, nil
		}
		return existing, fmt.Errorf("dynamostore: idempotency key %q: %w", i.Key, store.ErrExists)
	}
	if err != nil {
		return store.Idempotency{}, fault("put idempotency", err)
	}
	stored, err := idempotencyFromItem(it)
	if err != nil {
		return store.Idempotency{}, fault("put idempotency", err)
	}
	return stored, nil
}

// CreateRun is one conditional put of the whole run at Version 1; the item
// carries the live index key when the run is live, the queue index's when
// it is waiting, and no hostId while it is queued (an index key cannot be
// an empty string: the run is in no host's partition). A retry that finds
// this call's own item (a lost response, ownwrites.go) succeeds.
func (s *Store) CreateRun(ctx context.Context, r store.Run) error {
	if r.FleetRunID == "" || r.OwnerID == "" || (r.HostID == "" && r.Status != store.StatusQueued) || r.CreatedAt.IsZero() {
		return errors.New("dynamostore: create run: fleetRunId, ownerId, hostId (unless queued) and createdAt are required")
	}
	if err := store.CheckRun(r); err != nil {
		return fmt.Errorf("dynamostore: create run: %w", err)
	}
	r.Version = 1
	token, err := s.newWriteToken()
	if err != nil {
		return err
	}
	it := runItem(r, allShardOf(r.FleetRunID, s.allShards))
	it[attrWriteToken] = token
	_, err = s.api.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           aws.String(s.tables.Runs),
		Item:                                it,
		ConditionExpression:                 aws.String(condAbsentOrExpired),
		ExpressionAttributeNames:            expiryNames(attrFleetRunID),
		ExpressionAttributeValues:           map[string]types.AttributeValue{":now": nowValue(s.now())},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if failed, old := conditionFailed(err); failed {
		held, herr := s.holder(ctx, s.tables.Runs, strKey(attrFleetRunID, r.FleetRunID), old)
		if herr != nil {
			return fault("create run: reading the holder", herr)
		}
		if wroteBy(held, token) {
			return nil
		}
		return fmt.Errorf("dynamostore: run %q: %w", r.FleetRunID, store.ErrExists)
	}
	if err != nil {
		return fault("create run", err)
	}
	return nil
}

// GetRun reads a run, strongly consistent unless ctx carries
// store.EventualRead; ErrNotFound when absent or expired.
func (s *Store) GetRun(ctx context.Context, id string) (store.Run, error) {
	out, err := s.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Runs), Key: strKey(attrFleetRunID, id),
		ConsistentRead: aws.Bool(!store.AllowsEventualRead(ctx)),
	})
	if err != nil {
		return store.Run{}, fault("get run", err)
	}
	if out.Item == nil {
		return store.Run{}, fmt.Errorf("dynamostore: run %q: %w", id, store.ErrNotFound)
	}
	r, err := runFromItem(out.Item)
	if err != nil {
		return store.Run{}, fault("get run", err)
	}
	if store.Expired(r.ExpiresAt, s.now()) {
		return store.Run{}, fmt.Errorf("dynamostore: run %q: %w", id, store.ErrNotFound)
	}
	return r, nil
}

// UpdateRun sets every mutable attribute (and removes those r leaves empty,
// the live and queue keys included when the run is no longer live or
// waiting) in one update conditional on the stored version; the fields
// fixed at creation are not in the expression, so they cannot move. The
// host follows store.UpdatedHost, as conditions on the stored one (see
// hostUpdate). A failed condition brings the
// stored item back (ALL_OLD) to tell ErrConflict from ErrNotFound, and from
// this call's own update applied by an attempt whose response was lost
// (ownwrites.go): the stored item at Version+1 carrying the call's token,
// returned as the update's result. If another update followed ours before
// the retry, the retry cannot tell and answers ErrConflict; the caller's
// re-read then shows both.
func (s *Store) UpdateRun(ctx context.Context, r store.Run) (store.Run, error) {
	if err := store.CheckRun(r); err != nil {
		return store.Run{}, fmt.Errorf("dynamostore: update run: %w", err)
	}
	token, err := s.newWriteToken()
	if err != nil {
		return store.Run{}, err
	}
	expect := r.Version
	r.Version = expect + 1
	set := runMutable(r, allShardOf(r.FleetRunID, s.allShards))
	names := expiryNames(attrFleetRunID)
	values := map[string]types.AttributeValue{
		":now":    nowValue(s.now()),
		":expect": &types.AttributeValueMemberN{Value: strconv.FormatInt(expect, 10)},
		":wt":     token,
	}
	names["#version"] = attrRunVersion
	names["#wt"] = attrWriteToken
	sets := []string{"#wt = :wt"}
	cond := condPresentUnexpired + " AND #version = :expect"
	var removes []string
	if hc, set, remove := hostUpdate(r, names, values); hc != "" {
		cond += " AND " + hc
		if set {
			sets = append(sets, "#host = :host")
		}
		if remove {
			removes = append(removes, "#host")
		}
	}
	for i, name := range runMutableNames {
		ph := "#a" + strconv.Itoa(i)
		names[ph] = name
		if v, ok := set[name]; ok {
			vp := ":a" + strconv.Itoa(i)
			values[vp] = v
			sets = append(sets, ph+" = "+vp)
		} else {
			removes = append(removes, ph)
		}
	}
	expr := "SET " + strings.Join(sets, ", ")
	if len(removes) > 0 {
		expr += " REMOVE " + strings.Join(removes, ", ")
	}
	out, err := s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.tables.Runs),
		Key:                                 strKey(attrFleetRunID, r.FleetRunID),
		UpdateExpression:                    aws.String(expr),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           values,
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if failed, old := conditionFailed(err); failed {
		if old == nil {
			return store.Run{}, fmt.Errorf("dynamostore: run %q: %w", r.FleetRunID, store.ErrNotFound)
		}
		stored, derr := runFromItem(old)
		if derr != nil {
			return store.Run{}, fault("update run", derr)
		}
		if store.Expired(stored.ExpiresAt, s.now()) {
			return store.Run{}, fmt.Errorf("dynamostore: run %q: %w", r.FleetRunID, store.ErrNotFound)
		}
		if stored.Version == r.Version && wroteBy(old, token) {
			return stored, nil
		}
		if stored.Version == expect {
			if _, herr := store.UpdatedHost(stored, r); herr != nil {
				return store.Run{}, fmt.Errorf("dynamostore: %w", herr)
			}
			return store.Run{}, fmt.Errorf("dynamostore: run %q changed under the update: %w", r.FleetRunID, store.ErrConflict)
		}
		return store.Run{}, fmt.Errorf("dynamostore: run %q is at version %d, not %d: %w", r.FleetRunID, stored.Version, expect, store.ErrConflict)
	}
	if err != nil {
		return store.Run{}, fault("update run", err)
	}
	stored, err := runFromItem(out.Attributes)
	if err != nil {
		return store.Run{}, fault("update run", err)
	}
	return stored, nil
}

// hostUpdate is store.UpdatedHost as a condition on the stored run
// (empty: none), and whether the update sets the host to ":host" or
// removes it; it fills names and values for both. Setting the host to
// the value it has changes no index key: no index write.
func hostUpdate(r store.Run, names map[string]string, values map[string]types.AttributeValue) (cond string, set, remove bool) {
	movable := func() string {
		names["#st"] = attrStatus
		values[":dispatching"] = &types.AttributeValueMemberS{Value: store.StatusDispatching}
		values[":queued"] = &types.AttributeValueMemberS{Value: store.StatusQueued}
		return "#st IN (:dispatching, :queued)"
	}
	names["#host"] = attrHostID
	switch {
	case r.Status == store.StatusQueued:
		// CheckRun made sure r has no host: one stored goes, if it may.
		return "(attribute_not_exists(#host) OR " + movable() + ")", false, true
	case r.HostID != "":
		values[":host"] = &types.AttributeValueMemberS{Value: r.HostID}
		return "(#host = :host OR " + movable() + ")", true, false
	case store.Terminal(r.Status):
		// Keeps the stored host, or none: a run that ended queued.
		delete(names, "#host")
		return "", false, false
	}
	return "attribute_exists(#host)", false, false
}

// ListLive pages the sparse live index in run-id order.
func (s *Store) ListLive(ctx context.Context, cur string, limit int) (store.LivePage, error) {
	in := &dynamodb.QueryInput{
		TableName:                aws.String(s.tables.Runs),
		IndexName:                aws.String(indexLive),
		KeyConditionExpression:   aws.String("#live = :live"),
		ExpressionAttributeNames: map[string]string{"#live": attrLive},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":live": &types.AttributeValueMemberS{Value: liveValue},
		},
	}
	if cur != "" {
		after, err := cursor.DecodeLive(cur)
		if err != nil {
			return store.LivePage{}, err
		}
		in.ExclusiveStartKey = map[string]types.AttributeValue{
			attrLive:       &types.AttributeValueMemberS{Value: liveValue},
			attrFleetRunID: &types.AttributeValueMemberS{Value: after},
		}
	}
	limit = store.PageLimit(limit)
	var ids []string
	for len(ids) <= limit {
		in.Limit = aws.Int32(int32(limit + 1 - len(ids)))
		out, err := s.api.Query(ctx, in)
		if err != nil {
			return store.LivePage{}, fault("list live runs", err)
		}
		for _, it := range out.Items {
			r := &reader{it: it}
			ids = append(ids, r.s(attrFleetRunID))
			if r.err != nil {
				return store.LivePage{}, fault("list live runs", r.err)
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
	page := store.LivePage{FleetRunIDs: ids}
	if len(ids) > limit {
		page.FleetRunIDs = ids[:limit]
		page.NextCursor = cursor.EncodeLive(ids[limit-1])
	}
	return page, nil
}

// LiveCursorAfter is the ListLive cursor continuing after fleetRunID.
func (s *Store) LiveCursorAfter(fleetRunID string) string { return cursor.EncodeLive(fleetRunID) }

// runKey is a run's entry in the byOwner or byHost index.
type runKey struct {
	fleetRunID string
	created    string // the createdAt index key
}

func runKeyFromItem(it item) (runKey, error) {
	r := &reader{it: it}
	k := runKey{fleetRunID: r.s(attrFleetRunID), created: r.s(attrCreatedAt)}
	if r.err != nil {
		return runKey{}, r.err
	}
	if k.fleetRunID == "" || k.created == "" {
		return runKey{}, fmt.Errorf("index entry without fleetRunId or createdAt: %v", sortedKeys(it))
	}
	return k, nil
}

// batchGetRuns reads runs by id (eventually consistent), in the order of
// keys, nil where a run is gone. Expired runs are returned: callers decide.
func (s *Store) batchGetRuns(ctx context.Context, keys []runKey) ([]*store.Run, error) {
	req := make([]item, len(keys))
	for i, k := range keys {
		req[i] = strKey(attrFleetRunID, k.fleetRunID)
	}
	items, err := s.batchGet(ctx, s.tables.Runs, req, false)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]*store.Run, len(items))
	for _, it := range items {
		r, err := runFromItem(it)
		if err != nil {
			return nil, err
		}
		byID[r.FleetRunID] = &r
	}
	runs := make([]*store.Run, len(keys))
	for i, k := range keys {
		runs[i] = byID[k.fleetRunID]
	}
	return runs, nil
}

// batchGet reads the items at keys in table, batchGetMax a call,
// re-asking for what DynamoDB left unprocessed after a growing pause. The
// items come in no particular order; a missing one is simply absent.
func (s *Store) batchGet(ctx context.Context, table string, keys []item, consistent bool) ([]item, error) {
	var items []item
	for start := 0; start < len(keys); start += batchGetMax {
		chunk := keys[start:min(start+batchGetMax, len(keys))]
		req := make([]map[string]types.AttributeValue, len(chunk))
		for i, k := range chunk {
			req[i] = k
		}
		pending := map[string]types.KeysAndAttributes{table: {Keys: req, ConsistentRead: aws.Bool(consistent)}}
		backoff := unprocessedBackoff
		for attempt := 0; len(pending) > 0; attempt++ {
			if attempt == unprocessedAttempts {
				return nil, errors.New("batch get: keys still unprocessed after retries")
			}
			if attempt > 0 && !clock.Sleep(s.clock, backoff, ctx.Done()) {
				return nil, ctx.Err()
			}
			backoff *= 2
			out, err := s.api.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: pending})
			if err != nil {
				return nil, err
			}
			for _, it := range out.Responses[table] {
				items = append(items, it)
			}
			pending = out.UnprocessedKeys
		}
	}
	return items, nil
}
