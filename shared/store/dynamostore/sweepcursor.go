package dynamostore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/store"
)

// The sweep cursor item (store.SweepCursorKey in the idempotency table),
// about 0.2 KB: ClaimSweepCursor and SaveSweepCursor are 1 WCU each, and
// neither reads (the claim's UpdateItem returns the item it wrote, a lost
// claim gets the holder's item back with the failed condition). It has no
// expiresAt, so the table's TTL never removes it. Attribute names are a
// contract with the stored item: never rename one.
const (
	attrLap            = "lap"
	attrAfter          = "after"
	attrLapStarted     = "lapStarted"
	attrPrevLapStarted = "prevLapStarted"
	attrPrevLapEnded   = "prevLapEnded"
	attrLeaseUntil     = "leaseUntil"
)

// condClaimable: no cursor yet, no holder, the claimer's own lease, or a
// lease that has lapsed (":now" in epoch nanoseconds, as the times are).
const condClaimable = "attribute_not_exists(#pk) OR attribute_not_exists(#holder) OR #holder = :holder OR #lease <= :now"

func nanosValue(t time.Time) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(t.UnixNano(), 10)}
}

// ClaimSweepCursor takes the lease in one conditional UpdateItem that also
// creates the cursor at lap 1 when there is none.
func (s *Store) ClaimSweepCursor(ctx context.Context, holder string, leaseUntil time.Time) (store.SweepCursor, error) {
	if holder == "" {
		return store.SweepCursor{}, fmt.Errorf("dynamostore: claim sweep cursor: empty holder")
	}
	now := s.now()
	out, err := s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(s.tables.Idempotency),
		Key:       strKey(attrID, store.SweepCursorKey),
		UpdateExpression: aws.String("SET #fmt = :fmt, #holder = :holder, #lease = :lease, " +
			"#ver = if_not_exists(#ver, :zero) + :one, #lap = if_not_exists(#lap, :one), #ls = if_not_exists(#ls, :now)"),
		ConditionExpression: aws.String(condClaimable),
		ExpressionAttributeNames: map[string]string{
			"#pk": attrID, "#fmt": attrVersionFormat, "#holder": attrHolder, "#lease": attrLeaseUntil,
			"#ver": attrRunVersion, "#lap": attrLap, "#ls": attrLapStarted,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":fmt":    &types.AttributeValueMemberN{Value: strconv.Itoa(formatVersion)},
			":holder": &types.AttributeValueMemberS{Value: holder},
			":lease":  nanosValue(leaseUntil),
			":zero":   &types.AttributeValueMemberN{Value: "0"},
			":one":    &types.AttributeValueMemberN{Value: "1"},
			":now":    nanosValue(now),
		},
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if failed, old := conditionFailed(err); failed {
		if old == nil {
			// No holder came back (an emulator that ignores ALL_OLD): read it.
			c, gerr := s.getSweepCursor(ctx)
			if gerr != nil {
				return store.SweepCursor{}, fault("claim sweep cursor: reading the holder", gerr)
			}
			return c, fmt.Errorf("dynamostore: sweep cursor held by another sweep: %w", store.ErrConflict)
		}
		c, derr := sweepCursorFromItem(old)
		if derr != nil {
			return store.SweepCursor{}, fault("claim sweep cursor", derr)
		}
		return c, fmt.Errorf("dynamostore: sweep cursor held by another sweep: %w", store.ErrConflict)
	}
	if err != nil {
		return store.SweepCursor{}, fault("claim sweep cursor", err)
	}
	c, err := sweepCursorFromItem(out.Attributes)
	if err != nil {
		return store.SweepCursor{}, fault("claim sweep cursor", err)
	}
	return c, nil
}

// SaveSweepCursor is one PutItem conditional on the stored version.
func (s *Store) SaveSweepCursor(ctx context.Context, c store.SweepCursor) (store.SweepCursor, error) {
	next := c
	next.Version = c.Version + 1
	it := sweepCursorItem(next)
	_, err := s.api.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           aws.String(s.tables.Idempotency),
		Item:                                it,
		ConditionExpression:                 aws.String("attribute_exists(#pk) AND #ver = :ver"),
		ExpressionAttributeNames:            map[string]string{"#pk": attrID, "#ver": attrRunVersion},
		ExpressionAttributeValues:           map[string]types.AttributeValue{":ver": &types.AttributeValueMemberN{Value: strconv.FormatInt(c.Version, 10)}},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if failed, old := conditionFailed(err); failed {
		if old == nil {
			if _, gerr := s.getSweepCursor(ctx); gerr != nil {
				return store.SweepCursor{}, fmt.Errorf("dynamostore: save sweep cursor: %w", gerr)
			}
		}
		return store.SweepCursor{}, fmt.Errorf("dynamostore: sweep cursor version %d moved on: %w", c.Version, store.ErrConflict)
	}
	if err != nil {
		return store.SweepCursor{}, fault("save sweep cursor", err)
	}
	return sweepCursorFromItem(it)
}

// getSweepCursor reads the cursor, strongly consistent; ErrNotFound.
func (s *Store) getSweepCursor(ctx context.Context) (store.SweepCursor, error) {
	out, err := s.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Idempotency), Key: strKey(attrID, store.SweepCursorKey), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return store.SweepCursor{}, err
	}
	if out.Item == nil {
		return store.SweepCursor{}, fmt.Errorf("dynamostore: sweep cursor: %w", store.ErrNotFound)
	}
	return sweepCursorFromItem(out.Item)
}

func sweepCursorItem(c store.SweepCursor) item {
	it := item{}
	it.putS(attrID, store.SweepCursorKey)
	it.putNAlways(attrVersionFormat, formatVersion)
	it.putNAlways(attrLap, c.Lap)
	it.putS(attrAfter, c.After)
	it.putTime(attrLapStarted, c.LapStarted)
	it.putTime(attrPrevLapStarted, c.PrevLapStarted)
	it.putTime(attrPrevLapEnded, c.PrevLapEnded)
	it.putS(attrHolder, c.Holder)
	if c.Holder != "" {
		it.putTime(attrLeaseUntil, c.LeaseUntil)
	}
	it.putNAlways(attrRunVersion, c.Version)
	return it
}

func sweepCursorFromItem(it item) (store.SweepCursor, error) {
	r := &reader{it: it}
	r.checkVersion()
	c := store.SweepCursor{
		Lap: r.n(attrLap), After: r.s(attrAfter),
		LapStarted: r.time(attrLapStarted), PrevLapStarted: r.time(attrPrevLapStarted), PrevLapEnded: r.time(attrPrevLapEnded),
		Holder: r.s(attrHolder), LeaseUntil: r.time(attrLeaseUntil), Version: r.n(attrRunVersion),
	}
	if err := r.done(); err != nil {
		return store.SweepCursor{}, fmt.Errorf("sweep cursor item: %w", err)
	}
	return c, nil
}
