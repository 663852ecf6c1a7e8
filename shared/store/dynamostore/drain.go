package dynamostore

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/store"
)

// RecordDrain sets the probe's draining (and idle) in one conditional
// update, only where a probe exists; the failed condition returns the item,
// which tells a host never probed (kept as it is) from one that is gone.
func (s *Store) RecordDrain(ctx context.Context, id string, draining bool, idle *bool) (store.Host, error) {
	update := "SET probe.#d = :d REMOVE probe.#i"
	values := map[string]types.AttributeValue{":d": &types.AttributeValueMemberBOOL{Value: draining}}
	if idle != nil {
		update = "SET probe.#d = :d, probe.#i = :i"
		values[":i"] = &types.AttributeValueMemberBOOL{Value: *idle}
	}
	out, err := s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.tables.Hosts),
		Key:                                 strKey(attrID, id),
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String("attribute_exists(probe)"),
		ExpressionAttributeNames:            map[string]string{"#d": attrDraining, "#i": attrIdle},
		ExpressionAttributeValues:           values,
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	failed, existing := conditionFailed(err)
	switch {
	case failed && existing == nil:
		return store.Host{}, fmt.Errorf("dynamostore: host %q: %w", id, store.ErrNotFound)
	case failed:
		h, err := hostFromItem(existing)
		if err != nil {
			return store.Host{}, fault("record drain", err)
		}
		return h, nil
	case err != nil:
		return store.Host{}, fault("record drain", err)
	}
	h, err := hostFromItem(out.Attributes)
	if err != nil {
		return store.Host{}, fault("record drain", err)
	}
	return h, nil
}
