package dynamostore

import (
	"context"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/runfleet/runfleet/shared/store"
)

// SetAllShards spreads the runs s creates over n partitions of the "all"
// index, as raising allShards would, so that tests exercise the merged
// listing that a sharded index takes.
func SetAllShards(s *Store, n int) { s.allShards = n }

// PutChunk writes recs as one chunk, unconditionally and without looking
// at what is stored: what two mirrors racing may leave behind.
func PutChunk(ctx context.Context, s *Store, fleetRunID string, recs []store.EgressRecord, expiresAt time.Time) error {
	_, err := s.api.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(s.tables.Egress), Item: chunkItem(fleetRunID, recs, expiresAt),
	})
	return err
}

// ChunkItemBytes bounds a chunk's item size.
const ChunkItemBytes = chunkItemBytes
