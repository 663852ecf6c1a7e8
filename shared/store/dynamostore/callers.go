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

// transactAttempts bounds retries of a transaction canceled only because it
// collided with another one on the same items (TransactionConflict): the
// retry then sees the other's outcome as a failed condition.
const transactAttempts = 3

// CreateCaller writes the owner and token items in one transaction, each
// conditional on its key being free; ErrExists if either is taken. A retry
// that finds both items carrying this call's token (a lost response,
// ownwrites.go) succeeds.
func (s *Store) CreateCaller(ctx context.Context, c store.Caller) error {
	if c.OwnerID == "" || c.TokenHash == "" {
		return errors.New("dynamostore: create caller: empty ownerId or token hash")
	}
	token, err := s.newWriteToken()
	if err != nil {
		return err
	}
	keys := []string{ownerPrefix + c.OwnerID, tokenPrefix + c.TokenHash}
	in := &dynamodb.TransactWriteItemsInput{}
	for _, id := range keys {
		it := callerItem(id, c)
		it[attrWriteToken] = token
		in.TransactItems = append(in.TransactItems, types.TransactWriteItem{Put: &types.Put{
			TableName:                           aws.String(s.tables.Callers),
			Item:                                it,
			ConditionExpression:                 aws.String("attribute_not_exists(id)"),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		}})
	}
	err = s.transact(ctx, in)
	if _, condition, _ := canceledBy(err); condition {
		own, oerr := s.transactionWroteBy(ctx, err, keys, token)
		if oerr != nil {
			return fault("create caller: reading the holders", oerr)
		}
		if own {
			return nil
		}
		// The hash is never echoed: it identifies a credential.
		return fmt.Errorf("dynamostore: caller %q or its token: %w", c.OwnerID, store.ErrExists)
	}
	if err != nil {
		return fault("create caller", err)
	}
	return nil
}

// transactionWroteBy reports whether a transaction of puts to the callers
// table (ids in order) was canceled only because every item already
// carries token: the transaction is atomic, so that is this call's own
// commit, retried after a lost response.
func (s *Store) transactionWroteBy(ctx context.Context, err error, ids []string, token types.AttributeValue) (bool, error) {
	var tce *types.TransactionCanceledException
	if !errors.As(err, &tce) || len(tce.CancellationReasons) != len(ids) {
		return false, nil
	}
	for i, r := range tce.CancellationReasons {
		if aws.ToString(r.Code) != "ConditionalCheckFailed" {
			return false, nil
		}
		held, herr := s.holder(ctx, s.tables.Callers, strKey(attrID, ids[i]), r.Item)
		if herr != nil {
			return false, herr
		}
		if !wroteBy(held, token) {
			return false, nil
		}
	}
	return true, nil
}

// CallerByTokenHash reads the token item, which holds the whole caller: one
// strongly consistent read, so a revoked token fails at once.
func (s *Store) CallerByTokenHash(ctx context.Context, tokenHash string) (store.Caller, error) {
	out, err := s.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Callers), Key: strKey(attrID, tokenPrefix+tokenHash),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return store.Caller{}, fault("caller by token", err)
	}
	if out.Item == nil {
		return store.Caller{}, fmt.Errorf("dynamostore: caller (by token): %w", store.ErrNotFound)
	}
	c, err := callerFromItem(out.Item)
	if err != nil {
		return store.Caller{}, fault("caller by token", err)
	}
	return c, nil
}

// ListCallers scans the callers table (strongly consistent: an admin lists
// right after minting or revoking) and keeps the owner items. The token
// items are skipped in code rather than by a FilterExpression, which would
// cost the same reads and hide them from the Meter.
func (s *Store) ListCallers(ctx context.Context) ([]store.Caller, error) {
	var callers []store.Caller
	in := &dynamodb.ScanInput{TableName: aws.String(s.tables.Callers), ConsistentRead: aws.Bool(true)}
	for {
		out, err := s.api.Scan(ctx, in)
		if err != nil {
			return nil, fault("list callers", err)
		}
		for _, it := range out.Items {
			if id, ok := it[attrID].(*types.AttributeValueMemberS); !ok || !strings.HasPrefix(id.Value, ownerPrefix) {
				continue
			}
			c, err := callerFromItem(it)
			if err != nil {
				return nil, fault("list callers", err)
			}
			callers = append(callers, c)
		}
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
	sort.Slice(callers, func(i, j int) bool { return callers[i].OwnerID < callers[j].OwnerID })
	return callers, nil
}

// DeleteCaller reads the owner item for its token hash, then deletes both
// items in one transaction, conditional on the owner item still naming that
// hash; ErrNotFound when the caller is gone.
func (s *Store) DeleteCaller(ctx context.Context, ownerID string) error {
	out, err := s.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Callers), Key: strKey(attrID, ownerPrefix+ownerID),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return fault("delete caller", err)
	}
	if out.Item == nil {
		return fmt.Errorf("dynamostore: caller %q: %w", ownerID, store.ErrNotFound)
	}
	c, err := callerFromItem(out.Item)
	if err != nil {
		return fault("delete caller", err)
	}
	in := &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Delete: &types.Delete{
			TableName:                 aws.String(s.tables.Callers),
			Key:                       strKey(attrID, ownerPrefix+ownerID),
			ConditionExpression:       aws.String("tokenHash = :h"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":h": &types.AttributeValueMemberS{Value: c.TokenHash}},
		}},
		{Delete: &types.Delete{
			TableName:           aws.String(s.tables.Callers),
			Key:                 strKey(attrID, tokenPrefix+c.TokenHash),
			ConditionExpression: aws.String("attribute_exists(id)"),
		}},
	}}
	err = s.transact(ctx, in)
	if _, condition, _ := canceledBy(err); condition {
		return fmt.Errorf("dynamostore: caller %q: %w", ownerID, store.ErrNotFound)
	}
	if err != nil {
		return fault("delete caller", err)
	}
	return nil
}

// transact runs a transaction, retrying one that only collided with a
// concurrent transaction on the same items.
func (s *Store) transact(ctx context.Context, in *dynamodb.TransactWriteItemsInput) error {
	var err error
	for attempt := 0; attempt < transactAttempts; attempt++ {
		_, err = s.api.TransactWriteItems(ctx, in)
		canceled, condition, conflict := canceledBy(err)
		if !canceled || condition || !conflict {
			return err
		}
	}
	return err
}
