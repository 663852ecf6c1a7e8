package dynamostore

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Own writes, recognised after a lost response.
//
// The SDK retries a call whose response never came (a reset connection, a
// timeout: aws/retry.RetryableConnectionError) by sending the same request
// again. When the first attempt was applied, the retry of a conditional
// write fails its condition against the item that attempt wrote, and the
// store would answer ErrExists (ErrConflict for UpdateRun) for its own
// write: dispatch answered 409 without calling the host, minting and
// registration a spurious 409.
//
// So every conditional create, UpdateRun and CommitBrokerState write a
// token made for the call into the item (attrWriteToken), the same in
// every attempt the SDK makes of it, and ask DynamoDB for the item when
// the condition fails
// (ReturnValuesOnConditionCheckFailure ALL_OLD: "There is no additional
// cost associated with requesting a return value ... No read capacity units
// are consumed", Amazon DynamoDB API Reference, PutItem and UpdateItem). An
// item that carries the call's token is the call's own earlier write: the
// store answers as the first attempt would have. Any other holder is
// someone else's item, as before.
//
// The token is random (Config.Random), never a secret, and tells nothing
// about the caller; it stays in the item, 26 bytes (name and value) that
// push a write into one more unit only when the item was within 26 bytes
// under a 1 KB boundary.
//
// On DynamoDB a TransactWriteItems retry is idempotent by itself: the SDK
// fills ClientRequestToken once per call, and DynamoDB answers a repeat of
// a committed request with success for 10 minutes (API Reference,
// TransactWriteItems). moto_server ignores ClientRequestToken (checked with
// moto 5.2.1: the repeat is canceled with ConditionalCheckFailed), so
// CreateCaller checks its token in the cancellation reasons too, which holds
// on both.

// writeTokenBytes is the token's randomness: 96 bits, so two calls racing
// for one key never draw the same token.
const writeTokenBytes = 12

// newWriteToken makes the token of one call.
func (s *Store) newWriteToken() (types.AttributeValue, error) {
	var b [writeTokenBytes]byte
	if _, err := io.ReadFull(s.random, b[:]); err != nil {
		return nil, fmt.Errorf("dynamostore: making a write token: %w", err)
	}
	return &types.AttributeValueMemberS{Value: base64.RawURLEncoding.EncodeToString(b[:])}, nil
}

// wroteBy reports whether the stored item carries token: the item is the
// write of the call that made token.
func wroteBy(stored map[string]types.AttributeValue, token types.AttributeValue) bool {
	got, ok := stored[attrWriteToken].(*types.AttributeValueMemberS)
	want, _ := token.(*types.AttributeValueMemberS)
	return ok && want != nil && got.Value == want.Value
}

// holder is the item that failed a put's "key absent" condition: the one
// DynamoDB returned (ALL_OLD), or, from an emulator that returns none, a
// strongly consistent read of it (then one read unit more). Nil when the
// item is gone by the time it is read.
func (s *Store) holder(ctx context.Context, table string, key, returned map[string]types.AttributeValue) (map[string]types.AttributeValue, error) {
	if returned != nil {
		return returned, nil
	}
	out, err := s.api.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: key, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, err
	}
	return out.Item, nil
}
