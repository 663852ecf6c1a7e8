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

	"github.com/runfleet/runfleet/shared/store"
)

// A broker state is one item in the idempotency table,
// store.BrokerStateKey(id), with no expiresAt: the table's TTL never
// removes it (a refresh token family outlives any lease). The sealed
// tokens are B, the times epoch nanoseconds; the lease reuses the sweep
// cursor's holder and leaseUntil. Attribute names are a contract with the
// stored item: never rename one.
//
// Costs: every write is one UpdateItem, ceil(item bytes / 1 KB) WCU (the
// larger of the item before and after, so a lease write pays for the
// sealed tokens it leaves alone): 1 WCU while the sealed tokens stay
// under ~0.8 KB together, 2 to 4 with a JWT access token. A commit whose
// committer no longer holds the lease writes twice (the first write's
// condition names the holder). GetBrokerState: GetItem, strong, 1 RCU up
// to 4 KB. A lost condition returns the stored item (ALL_OLD): no read.
const (
	attrGeneration         = "generation"
	attrSealedRefreshToken = "sealedRefreshToken"
	attrSealedAccessToken  = "sealedAccessToken"
	attrAccessExpiresAt    = "accessExpiresAt"
	attrSeed               = "seed"
)

// brokerKey is the item key of credential id.
func brokerKey(id string) item { return strKey(attrID, store.BrokerStateKey(id)) }

// GetBrokerState reads the item, strongly consistent.
func (s *Store) GetBrokerState(ctx context.Context, id string) (store.BrokerState, error) {
	st, found, err := s.readBrokerState(ctx, id)
	if err != nil {
		return store.BrokerState{}, fault("get broker state", err)
	}
	if !found {
		return store.BrokerState{}, fmt.Errorf("dynamostore: broker state %q: %w", id, store.ErrNotFound)
	}
	return st, nil
}

func (s *Store) readBrokerState(ctx context.Context, id string) (store.BrokerState, bool, error) {
	out, err := s.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Idempotency), Key: brokerKey(id), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return store.BrokerState{}, false, err
	}
	if out.Item == nil {
		return store.BrokerState{}, false, nil
	}
	st, err := brokerStateFromItem(out.Item)
	return st, err == nil, err
}

// AcquireBrokerLease takes the lease in one conditional UpdateItem that
// also creates the item at generation 0 when there is none; the
// condition is the sweep cursor's (condClaimable).
func (s *Store) AcquireBrokerLease(ctx context.Context, id, holder string, until time.Time) (store.BrokerState, error) {
	if id == "" || holder == "" || until.IsZero() {
		return store.BrokerState{}, errors.New("dynamostore: acquire broker lease: want an id, a holder and an expiry")
	}
	out, err := s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(s.tables.Idempotency),
		Key:       brokerKey(id),
		UpdateExpression: aws.String("SET #fmt = :fmt, #holder = :holder, #lease = :lease, " +
			"#gen = if_not_exists(#gen, :zero), #upd = :now"),
		ConditionExpression: aws.String(condClaimable),
		ExpressionAttributeNames: map[string]string{
			"#pk": attrID, "#fmt": attrVersionFormat, "#holder": attrHolder, "#lease": attrLeaseUntil,
			"#gen": attrGeneration, "#upd": attrUpdatedAt,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":fmt":    &types.AttributeValueMemberN{Value: strconv.Itoa(formatVersion)},
			":holder": &types.AttributeValueMemberS{Value: holder},
			":lease":  nanosValue(until),
			":zero":   &types.AttributeValueMemberN{Value: "0"},
			":now":    nanosValue(s.now()),
		},
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if failed, returned := conditionFailed(err); failed {
		old, err := s.holder(ctx, s.tables.Idempotency, brokerKey(id), returned)
		if err == nil && old == nil {
			err = errors.New("the condition failed but the item is gone")
		}
		if err != nil {
			return store.BrokerState{}, fault("acquire broker lease: reading the holder", err)
		}
		held, err := brokerStateFromItem(old)
		if err != nil {
			return store.BrokerState{}, fault("acquire broker lease: reading the holder", err)
		}
		return held, fmt.Errorf("dynamostore: broker state %q: lease held by another holder: %w", id, store.ErrConflict)
	}
	if err != nil {
		return store.BrokerState{}, fault("acquire broker lease", err)
	}
	st, err := brokerStateFromItem(out.Attributes)
	if err != nil {
		return store.BrokerState{}, fault("acquire broker lease", err)
	}
	return st, nil
}

// CommitBrokerState is one UpdateItem conditional on the generation. When
// st names a lease holder, the first write also requires that holder and
// removes the lease; if the generation matched but the lease is
// another's (or free), a second write commits without touching it. The
// write carries a token (ownwrites.go), so a retry of a commit whose
// answer was lost recognises its own write instead of a moved generation.
func (s *Store) CommitBrokerState(ctx context.Context, st store.BrokerState) (store.BrokerState, error) {
	if st.ID == "" || st.Generation < 0 {
		return store.BrokerState{}, errors.New("dynamostore: commit broker state: want an id and a generation >= 0")
	}
	token, err := s.newWriteToken()
	if err != nil {
		return store.BrokerState{}, err
	}
	if st.LeaseHolder != "" {
		stored, err := s.commitBrokerState(ctx, st, token, true)
		if !errors.Is(err, errLeaseNotHeld) {
			return stored, err
		}
	}
	stored, err := s.commitBrokerState(ctx, st, token, false)
	if errors.Is(err, errLeaseNotHeld) {
		// Unreachable: without the holder in the condition only the
		// generation can fail it.
		err = fmt.Errorf("dynamostore: broker state %q: %w", st.ID, store.ErrConflict)
	}
	return stored, err
}

// errLeaseNotHeld: the generation matched, the lease was not the
// committer's.
var errLeaseNotHeld = errors.New("lease not held by the committer")

func (s *Store) commitBrokerState(ctx context.Context, st store.BrokerState, token types.AttributeValue, release bool) (store.BrokerState, error) {
	names := map[string]string{
		"#pk": attrID, "#fmt": attrVersionFormat, "#gen": attrGeneration, "#upd": attrUpdatedAt, "#wt": attrWriteToken,
	}
	values := map[string]types.AttributeValue{
		":fmt":  &types.AttributeValueMemberN{Value: strconv.Itoa(formatVersion)},
		":gen":  &types.AttributeValueMemberN{Value: strconv.FormatInt(st.Generation, 10)},
		":next": &types.AttributeValueMemberN{Value: strconv.FormatInt(st.Generation+1, 10)},
		":now":  nanosValue(s.now()),
		":wt":   token,
	}
	sets := []string{"#fmt = :fmt", "#gen = :next", "#upd = :now", "#wt = :wt"}
	var removes []string
	set := item{}
	set.putB(attrSealedRefreshToken, st.SealedRefreshToken)
	set.putB(attrSealedAccessToken, st.SealedAccessToken)
	set.putTime(attrAccessExpiresAt, st.AccessExpiresAt)
	set.putS(attrSeed, st.Seed)
	for i, name := range []string{attrSealedRefreshToken, attrSealedAccessToken, attrAccessExpiresAt, attrSeed} {
		ph := "#t" + strconv.Itoa(i)
		names[ph] = name
		if v, ok := set[name]; ok {
			values[":t"+strconv.Itoa(i)] = v
			sets = append(sets, ph+" = :t"+strconv.Itoa(i))
		} else {
			removes = append(removes, ph)
		}
	}
	cond := "attribute_exists(#pk) AND #gen = :gen"
	if release {
		names["#holder"], names["#lease"] = attrHolder, attrLeaseUntil
		values[":holder"] = &types.AttributeValueMemberS{Value: st.LeaseHolder}
		cond += " AND #holder = :holder"
		removes = append(removes, "#holder", "#lease")
	}
	expr := "SET " + strings.Join(sets, ", ")
	if len(removes) > 0 {
		expr += " REMOVE " + strings.Join(removes, ", ")
	}
	out, err := s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.tables.Idempotency),
		Key:                                 brokerKey(st.ID),
		UpdateExpression:                    aws.String(expr),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           values,
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if failed, returned := conditionFailed(err); failed {
		old, err := s.holder(ctx, s.tables.Idempotency, brokerKey(st.ID), returned)
		if err != nil {
			return store.BrokerState{}, fault("commit broker state: reading the item", err)
		}
		if old == nil {
			return store.BrokerState{}, fmt.Errorf("dynamostore: broker state %q: %w", st.ID, store.ErrNotFound)
		}
		stored, derr := brokerStateFromItem(old)
		if derr != nil {
			return store.BrokerState{}, fault("commit broker state", derr)
		}
		switch {
		case stored.Generation == st.Generation+1 && wroteBy(old, token):
			return stored, nil
		case stored.Generation == st.Generation:
			return store.BrokerState{}, errLeaseNotHeld
		}
		return store.BrokerState{}, fmt.Errorf("dynamostore: broker state %q is at generation %d, not %d: %w", st.ID, stored.Generation, st.Generation, store.ErrConflict)
	}
	if err != nil {
		return store.BrokerState{}, fault("commit broker state", err)
	}
	stored, err := brokerStateFromItem(out.Attributes)
	if err != nil {
		return store.BrokerState{}, fault("commit broker state", err)
	}
	return stored, nil
}

// ReleaseBrokerLease removes the lease on condition that holder holds it.
func (s *Store) ReleaseBrokerLease(ctx context.Context, id, holder string) error {
	if id == "" || holder == "" {
		return errors.New("dynamostore: release broker lease: want an id and a holder")
	}
	_, err := s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:           aws.String(s.tables.Idempotency),
		Key:                 brokerKey(id),
		UpdateExpression:    aws.String("SET #upd = :now REMOVE #holder, #lease"),
		ConditionExpression: aws.String("#holder = :holder"),
		ExpressionAttributeNames: map[string]string{
			"#holder": attrHolder, "#lease": attrLeaseUntil, "#upd": attrUpdatedAt,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":holder": &types.AttributeValueMemberS{Value: holder},
			":now":    nanosValue(s.now()),
		},
	})
	if failed, _ := conditionFailed(err); failed {
		return nil // absent, free, or another's: not ours to free
	}
	if err != nil {
		return fault("release broker lease", err)
	}
	return nil
}

func brokerStateFromItem(it item) (store.BrokerState, error) {
	r := &reader{it: it}
	r.checkVersion()
	st := store.BrokerState{
		Generation:         r.n(attrGeneration),
		SealedRefreshToken: r.b(attrSealedRefreshToken), SealedAccessToken: r.b(attrSealedAccessToken),
		AccessExpiresAt: r.time(attrAccessExpiresAt), Seed: r.s(attrSeed),
		LeaseHolder: r.s(attrHolder), LeaseExpiresAt: r.time(attrLeaseUntil), UpdatedAt: r.time(attrUpdatedAt),
	}
	key := r.s(attrID)
	if err := r.done(); err != nil {
		return store.BrokerState{}, fmt.Errorf("broker state item: %w", err)
	}
	id, ok := strings.CutPrefix(key, store.BrokerStateKey(""))
	if !ok {
		return store.BrokerState{}, fmt.Errorf("broker state item: id %q is not a broker state's", key)
	}
	st.ID = id
	return st, nil
}
