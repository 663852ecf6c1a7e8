package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/store"
)

// Stream leases live in the idempotency table (id "#stream#<ownerId>#<slot>",
// TTL expiresAt, so DynamoDB reaps a crashed stream's item; the code checks
// expiry itself, as everywhere).
//
// Costs (items ~0.1 KB):
//
//	AcquireStreamLease  BatchGetItem of the slots, strong: 1 RCU per slot;
//	                    then one conditional PutItem per slot tried: 1 WCU
//	                    each (one, unless another stream takes it first).
//	                    A refusal writes nothing.
//	RenewStreamLease    conditional PutItem: 1 WCU
//	ReleaseStreamLease  conditional DeleteItem: 1 WCU
//
// Reading the slots first keeps a caller at its cap (who may retry often)
// from paying a failed write per slot per attempt; the conditional put,
// not the read, decides who holds a slot.
// attrHolder names who holds a lease: a stream slot's or the sweep cursor's.
const attrHolder = "holder"

// condLeaseFree: the slot is absent or expired.
const condLeaseFree = condAbsentOrExpired

// condLeaseFreeOrMine: free, or held by :holder (a renewal).
const condLeaseFreeOrMine = condAbsentOrExpired + " OR #holder = :holder"

func leaseItem(l store.StreamLease) item {
	it := item{}
	it.putS(attrID, store.StreamLeaseKey(l.OwnerID, l.Slot))
	it.putNAlways(attrVersionFormat, formatVersion)
	it.putS(attrHolder, l.Holder)
	it.putExpiry(l.ExpiresAt)
	return it
}

// AcquireStreamLease reads the slots (one strongly consistent
// BatchGetItem), then puts the lease into the first one that looks free,
// conditionally; a slot taken meanwhile is skipped for the next.
func (s *Store) AcquireStreamLease(ctx context.Context, l store.StreamLease, slots int) (store.StreamLease, error) {
	if l.OwnerID == "" || l.Holder == "" || slots < 1 || slots > store.MaxStreamSlots {
		return store.StreamLease{}, fmt.Errorf("dynamostore: acquire stream lease: want an owner, a holder and 1..%d slots", store.MaxStreamSlots)
	}
	now := s.now()
	held := map[string]time.Time{} // by item id: the unexpired holders' expiry
	keys := make([]map[string]types.AttributeValue, slots)
	for i := range keys {
		keys[i] = strKey(attrID, store.StreamLeaseKey(l.OwnerID, i))
	}
	out, err := s.api.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{
		RequestItems: map[string]types.KeysAndAttributes{
			s.tables.Idempotency: {Keys: keys, ConsistentRead: aws.Bool(true)},
		},
	})
	if err != nil {
		return store.StreamLease{}, fault("acquire stream lease: reading the slots", err)
	}
	// A key left unprocessed (throttling) reads as free: the conditional
	// put below finds out.
	for _, it := range out.Responses[s.tables.Idempotency] {
		r := &reader{it: it}
		id, exp := r.s(attrID), r.expiry()
		if !store.Expired(exp, now) {
			held[id] = exp
		}
	}
	earliest := time.Time{}
	note := func(exp time.Time) {
		if earliest.IsZero() || exp.Before(earliest) {
			earliest = exp
		}
	}
	for slot := 0; slot < slots; slot++ {
		id := store.StreamLeaseKey(l.OwnerID, slot)
		if exp, ok := held[id]; ok {
			note(exp)
			continue
		}
		cand := l
		cand.Slot = slot
		holder, err := s.putLease(ctx, cand, condLeaseFree, now)
		if err == nil {
			cand.ExpiresAt = store.RoundExpiry(cand.ExpiresAt)
			return cand, nil
		}
		if !errors.Is(err, store.ErrExists) {
			return store.StreamLease{}, err
		}
		note(holder)
	}
	return store.StreamLease{OwnerID: l.OwnerID, ExpiresAt: earliest},
		fmt.Errorf("dynamostore: stream leases of %q: all %d slots held: %w", l.OwnerID, slots, store.ErrExists)
}

// RenewStreamLease puts the lease again, on condition that the slot is
// free or still its holder's.
func (s *Store) RenewStreamLease(ctx context.Context, l store.StreamLease) error {
	if l.OwnerID == "" || l.Holder == "" {
		return errors.New("dynamostore: renew stream lease: want an owner and a holder")
	}
	_, err := s.putLease(ctx, l, condLeaseFreeOrMine, s.now())
	return err
}

// putLease is the conditional put of a lease; on a failed condition it
// returns ErrExists with the holder's expiry (ALL_OLD).
func (s *Store) putLease(ctx context.Context, l store.StreamLease, cond string, now time.Time) (time.Time, error) {
	names := expiryNames(attrID)
	values := map[string]types.AttributeValue{":now": nowValue(now)}
	if cond == condLeaseFreeOrMine {
		names["#holder"] = attrHolder
		values[":holder"] = &types.AttributeValueMemberS{Value: l.Holder}
	}
	_, err := s.api.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           aws.String(s.tables.Idempotency),
		Item:                                leaseItem(l),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if failed, old := conditionFailed(err); failed {
		var exp time.Time
		if old != nil {
			exp = (&reader{it: old}).expiry()
		}
		return exp, fmt.Errorf("dynamostore: stream lease %q: %w", store.StreamLeaseKey(l.OwnerID, l.Slot), store.ErrExists)
	}
	if err != nil {
		return time.Time{}, fault("put stream lease", err)
	}
	return time.Time{}, nil
}

// ReleaseStreamLease deletes the lease on condition that l.Holder holds it.
func (s *Store) ReleaseStreamLease(ctx context.Context, l store.StreamLease) error {
	_, err := s.api.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:                 aws.String(s.tables.Idempotency),
		Key:                       strKey(attrID, store.StreamLeaseKey(l.OwnerID, l.Slot)),
		ConditionExpression:       aws.String("#holder = :holder"),
		ExpressionAttributeNames:  map[string]string{"#holder": attrHolder},
		ExpressionAttributeValues: map[string]types.AttributeValue{":holder": &types.AttributeValueMemberS{Value: l.Holder}},
	})
	if failed, _ := conditionFailed(err); failed {
		return nil // absent, or another stream's now: not ours to free
	}
	if err != nil {
		return fault("release stream lease "+strconv.Itoa(l.Slot), err)
	}
	return nil
}
