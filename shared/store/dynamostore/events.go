package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
)

// putEventsParallel bounds the conditional puts PutEvents has in flight.
// BatchWriteItem cannot carry a condition, and without one a re-run would
// rewrite stored events.
const putEventsParallel = 8

// batchWriteMax is BatchWriteItem's limit on requests per call.
const batchWriteMax = 25

// PutEvents writes each event with a put conditional on its sequence being
// free (or expired); a failed condition means it is stored already and is
// not an error.
func (s *Store) PutEvents(ctx context.Context, events []store.Event) error {
	for _, e := range events {
		if e.FleetRunID == "" || e.Sequence < 1 {
			return fmt.Errorf("dynamostore: put events: event needs a fleetRunId and a sequence >= 1 (got %q, %d)", e.FleetRunID, e.Sequence)
		}
	}
	now := nowValue(s.now())
	sem := make(chan struct{}, putEventsParallel)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for _, e := range events {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			_, err := s.api.PutItem(ctx, &dynamodb.PutItemInput{
				TableName:                 aws.String(s.tables.Events),
				Item:                      eventItem(e),
				ConditionExpression:       aws.String(condAbsentOrExpired),
				ExpressionAttributeNames:  expiryNames(attrFleetRunID),
				ExpressionAttributeValues: map[string]types.AttributeValue{":now": now},
			})
			if failed, _ := conditionFailed(err); failed || err == nil {
				return
			}
			mu.Lock()
			if first == nil {
				first = fault(fmt.Sprintf("put event %d of run %q", e.Sequence, e.FleetRunID), err)
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return first
}

// ListEvents queries the run's events after a sequence, strongly consistent,
// skipping expired ones, and reads one more than limit to set HasMore.
func (s *Store) ListEvents(ctx context.Context, fleetRunID string, after int64, limit int) (store.EventPage, error) {
	if after < 0 {
		after = 0
	}
	limit = store.PageLimit(limit)
	in := &dynamodb.QueryInput{
		TableName:                aws.String(s.tables.Events),
		KeyConditionExpression:   aws.String("#r = :r AND #s > :after"),
		ExpressionAttributeNames: map[string]string{"#r": attrFleetRunID, "#s": attrSequence},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":r":     &types.AttributeValueMemberS{Value: fleetRunID},
			":after": &types.AttributeValueMemberN{Value: strconv.FormatInt(after, 10)},
		},
		ConsistentRead: aws.Bool(true),
	}
	now := s.now()
	var events []store.Event
	for len(events) <= limit {
		in.Limit = aws.Int32(int32(limit + 1 - len(events)))
		out, err := s.api.Query(ctx, in)
		if err != nil {
			return store.EventPage{}, fault("list events", err)
		}
		for _, it := range out.Items {
			e, err := eventFromItem(it)
			if err != nil {
				return store.EventPage{}, fault("list events", err)
			}
			if !store.Expired(e.ExpiresAt, now) {
				events = append(events, e)
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
	page := store.EventPage{Events: events}
	if len(events) > limit {
		page.Events, page.HasMore = events[:limit], true
	}
	return page, nil
}

// ExtendEventsExpiry moves the expiry of the run's unexpired events that
// expire before to (extendExpiry).
func (s *Store) ExtendEventsExpiry(ctx context.Context, fleetRunID string, to time.Time) error {
	if err := s.extendExpiry(ctx, s.tables.Events, attrSequence, fleetRunID, to); err != nil {
		return fault(fmt.Sprintf("extend the expiry of the events of run %q", fleetRunID), err)
	}
	return nil
}

// extendExpiry finds the items of a run's partition in table (sort key
// sortAttr) that are unexpired and expire before to (a Query whose filter
// still reads, and is priced for, every item of the run) and moves each
// one's expiry to to with an update conditional on it still being earlier,
// so a concurrent extension is never undone.
func (s *Store) extendExpiry(ctx context.Context, table, sortAttr, fleetRunID string, to time.Time) error {
	toValue := &types.AttributeValueMemberN{Value: strconv.FormatInt(store.RoundExpiry(to).Unix(), 10)}
	names := map[string]string{"#r": attrFleetRunID, "#s": sortAttr, "#e": attrExpiresAt}
	in := &dynamodb.QueryInput{
		TableName:                aws.String(table),
		KeyConditionExpression:   aws.String("#r = :r"),
		FilterExpression:         aws.String("#e < :to AND #e > :now"),
		ProjectionExpression:     aws.String("#r, #s"),
		ExpressionAttributeNames: names,
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":r": &types.AttributeValueMemberS{Value: fleetRunID}, ":to": toValue, ":now": nowValue(s.now()),
		},
		ConsistentRead: aws.Bool(true),
	}
	var keys []item
	for {
		out, err := s.api.Query(ctx, in)
		if err != nil {
			return fmt.Errorf("listing them: %w", err)
		}
		for _, it := range out.Items {
			keys = append(keys, item{attrFleetRunID: it[attrFleetRunID], sortAttr: it[sortAttr]})
		}
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
	sem := make(chan struct{}, putEventsParallel)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for _, key := range keys {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			_, err := s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
				TableName:                 aws.String(table),
				Key:                       key,
				UpdateExpression:          aws.String("SET #e = :to"),
				ConditionExpression:       aws.String("#e < :to"),
				ExpressionAttributeNames:  map[string]string{"#e": attrExpiresAt},
				ExpressionAttributeValues: map[string]types.AttributeValue{":to": toValue},
			})
			if failed, _ := conditionFailed(err); failed || err == nil {
				return
			}
			mu.Lock()
			if first == nil {
				first = err
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return first
}

// deletesWithin reads the keys of up to budget items of a run's partition
// in table (sort key sortAttr; a strong Query that stops at the budget)
// and returns their deletes; done reports that these are all the run's
// items there.
func (s *Store) deletesWithin(ctx context.Context, table, sortAttr, fleetRunID string, budget int) (deletes []types.WriteRequest, done bool, err error) {
	if budget <= 0 {
		return nil, false, nil
	}
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(table),
		KeyConditionExpression:    aws.String("#r = :r"),
		ProjectionExpression:      aws.String("#r, #s"),
		ExpressionAttributeNames:  map[string]string{"#r": attrFleetRunID, "#s": sortAttr},
		ExpressionAttributeValues: map[string]types.AttributeValue{":r": &types.AttributeValueMemberS{Value: fleetRunID}},
		ConsistentRead:            aws.Bool(true),
	}
	for len(deletes) < budget {
		in.Limit = aws.Int32(int32(budget - len(deletes)))
		out, err := s.api.Query(ctx, in)
		if err != nil {
			return nil, false, err
		}
		for _, it := range out.Items {
			deletes = append(deletes, types.WriteRequest{DeleteRequest: &types.DeleteRequest{Key: item{
				attrFleetRunID: it[attrFleetRunID], sortAttr: it[sortAttr],
			}}})
		}
		// Without a continuation, these were the last; with one at the
		// budget, more may follow (the next step sees).
		done = len(out.LastEvaluatedKey) == 0
		if done {
			break
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
	return deletes, done, nil
}

// batchWriteAll sends requests to one table, batchWriteMax a call.
func (s *Store) batchWriteAll(ctx context.Context, table string, reqs []types.WriteRequest) error {
	for start := 0; start < len(reqs); start += batchWriteMax {
		if err := s.batchWrite(ctx, table, reqs[start:min(start+batchWriteMax, len(reqs))]); err != nil {
			return err
		}
	}
	return nil
}

// batchWrite sends requests to one table, re-sending what DynamoDB left
// unprocessed after a growing pause.
func (s *Store) batchWrite(ctx context.Context, table string, reqs []types.WriteRequest) error {
	pending := map[string][]types.WriteRequest{table: reqs}
	backoff := unprocessedBackoff
	for attempt := 0; len(pending[table]) > 0; attempt++ {
		if attempt == unprocessedAttempts {
			return errors.New("batch write: requests still unprocessed after retries")
		}
		if attempt > 0 && !clock.Sleep(s.clock, backoff, ctx.Done()) {
			return ctx.Err()
		}
		backoff *= 2
		out, err := s.api.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: pending})
		if err != nil {
			return err
		}
		pending = out.UnprocessedItems
	}
	return nil
}
