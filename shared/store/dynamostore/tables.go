package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Attribute names that are keys somewhere; the rest live in items.go.
const (
	attrID         = "id"
	attrFleetRunID = "fleetRunId"
	attrSequence   = "sequence"
	attrOwnerID    = "ownerId"
	attrHostID     = "hostId"
	attrCreatedAt  = "createdAt"
	attrLive       = "live"
	attrExpiresAt  = "expiresAt"
	attrAllShard   = "allShard"
	attrSeq        = "seq"
	attrAlerted    = "alerted"
	attrAlertKey   = "alertKey"
	attrQueuePart  = "qp"
	attrQueueKey   = "qk"
	// attrQueueHosts is a waiting run's QueueInfo.Hosts, comma-separated,
	// while it is in the queue index (projected there); absent when nil.
	attrQueueHosts = "qh"
	// attrQueueEntryUntil is a waiting run's QueueInfo.Until (N, Unix
	// nanoseconds), projected into the queue index: not a key, but the
	// index's one non-key attribute.
	attrQueueEntryUntil = "qu"
)

// Index names on the runs table.
const (
	indexLive    = "live"
	indexByOwner = "byOwner"
	indexByHost  = "byHost"
	indexAll     = "all"
	indexQueue   = "queue"
)

// The queue index (store.Queue) is sparse: only runs whose Waiting() is
// true carry its keys, qp = queuePart and qk = class, "#", then
// store.QueueOrder (queueKey). One partition holds every waiting run: a
// class is a range of it (so a class's order, a position and the classes
// themselves are each one Query), and its writes are two per run that
// waits (in, then out), well within a partition's 1,000 a second up to
// bursts of ~500 runs queued a second; shard it (and merge) beyond.
// INCLUDE qh (QueueEntry.Hosts, on a run that has them) and qu (the
// run's Until): the order holds the rest of what a store.QueueEntry says,
// so a dispatcher passes over runs its host may not take and the sweep
// times runs out from the index alone. Neither changes while the run
// waits (both are fixed at enqueue), so an offer or a return to the queue
// still costs the index nothing.
const queuePart = "q"

// indexAlerted is the egress table's sparse index of the heads of runs
// with alerts, by first alert (ListAlertedRuns): one partition
// (alertedValue), written once per alerted run, a trickle.
const (
	indexAlerted = "alerted"
	alertedValue = "1"
)

// liveValue is the one value of the sparse live index's partition key. One
// partition serves a fleet's live runs (a few thousand at most) well within
// a partition's limits; shard it here if that ever changes.
const liveValue = "1"

// allShards is how many partitions the "all" index (every run by
// createdAt, for the admin listing) spreads its entries over; a run's shard
// is allShardOf(its id, allShards). One partition takes up to 1,000 writes
// a second; each run costs that index one write when created and one when
// deleted (KEYS_ONLY, and the key never changes, so updates cost it
// nothing). A million runs a day is ~12 creates a second, ~1% of one
// partition, and DynamoDB cannot split a partition whose writes all land at
// the newest sort key, so shard before sustained creates near ~500/s (~40
// million runs a day): raise allShards, and ListRuns merges that many
// partitions per page (one Query each). Only ever raise it: existing
// entries keep their shard, which stays below the new count and so is
// still merged.
const allShards = 1

// allShardOf is the "all" index partition of a run among n.
func allShardOf(fleetRunID string, n int) string {
	if n <= 1 {
		return "0"
	}
	h := fnv.New32a()
	h.Write([]byte(fleetRunID))
	return strconv.Itoa(int(h.Sum32() % uint32(n)))
}

// indexSchema describes a GSI: its key attributes and what it projects.
type indexSchema struct {
	name       string
	keys       []string // partition, then sort (if any)
	projection types.ProjectionType
	include    []string // for INCLUDE
}

// tableSchema describes a table for CreateTables and the Meter.
type tableSchema struct {
	// logical is the table's role ("runs"), the name the Meter reports.
	logical string
	name    string
	keys    []string // partition, then sort (if any)
	// attrTypes gives the scalar type of every key attribute (table and index).
	attrTypes map[string]types.ScalarAttributeType
	indexes   []indexSchema
	// ttl is the TTL attribute, empty for none.
	ttl string
}

func schemaList(n TableNames) []tableSchema {
	s, num := types.ScalarAttributeTypeS, types.ScalarAttributeTypeN
	return []tableSchema{
		{logical: "hosts", name: n.Hosts, keys: []string{attrID}, attrTypes: map[string]types.ScalarAttributeType{attrID: s}},
		{
			logical: "runs", name: n.Runs, keys: []string{attrFleetRunID}, ttl: attrExpiresAt,
			attrTypes: map[string]types.ScalarAttributeType{
				attrFleetRunID: s, attrLive: s, attrOwnerID: s, attrHostID: s, attrCreatedAt: s, attrAllShard: s,
				attrQueuePart: s, attrQueueKey: s,
			},
			indexes: []indexSchema{
				{name: indexLive, keys: []string{attrLive, attrFleetRunID}, projection: types.ProjectionTypeKeysOnly},
				{name: indexByOwner, keys: []string{attrOwnerID, attrCreatedAt}, projection: types.ProjectionTypeKeysOnly},
				{name: indexByHost, keys: []string{attrHostID, attrCreatedAt}, projection: types.ProjectionTypeKeysOnly},
				{name: indexAll, keys: []string{attrAllShard, attrCreatedAt}, projection: types.ProjectionTypeKeysOnly},
				{name: indexQueue, keys: []string{attrQueuePart, attrQueueKey}, projection: types.ProjectionTypeInclude,
					include: []string{attrQueueHosts, attrQueueEntryUntil}},
			},
		},
		{
			logical: "events", name: n.Events, keys: []string{attrFleetRunID, attrSequence}, ttl: attrExpiresAt,
			attrTypes: map[string]types.ScalarAttributeType{attrFleetRunID: s, attrSequence: num},
		},
		{
			logical: "egress", name: n.Egress, keys: []string{attrFleetRunID, attrSeq}, ttl: attrExpiresAt,
			attrTypes: map[string]types.ScalarAttributeType{attrFleetRunID: s, attrSeq: num, attrAlerted: s, attrAlertKey: s},
			indexes: []indexSchema{
				{name: indexAlerted, keys: []string{attrAlerted, attrAlertKey}, projection: types.ProjectionTypeKeysOnly},
			},
		},
		{logical: "callers", name: n.Callers, keys: []string{attrID}, attrTypes: map[string]types.ScalarAttributeType{attrID: s}},
		{
			logical: "idempotency", name: n.Idempotency, keys: []string{attrID}, ttl: attrExpiresAt,
			attrTypes: map[string]types.ScalarAttributeType{attrID: s},
		},
	}
}

// schemasFor indexes the schemas by physical table name.
func schemasFor(n TableNames) map[string]tableSchema {
	m := map[string]tableSchema{}
	for _, t := range schemaList(n) {
		m[t.name] = t
	}
	return m
}

func keySchema(keys []string) []types.KeySchemaElement {
	out := []types.KeySchemaElement{{AttributeName: aws.String(keys[0]), KeyType: types.KeyTypeHash}}
	if len(keys) > 1 {
		out = append(out, types.KeySchemaElement{AttributeName: aws.String(keys[1]), KeyType: types.KeyTypeRange})
	}
	return out
}

// tableWait bounds how long CreateTables waits for a new table to become
// active (DynamoDB: seconds; moto: at once).
const tableWait = 5 * time.Minute

// CreateTables creates the six tables with their indexes and turns on their
// TTL. Tables that exist already are left as they are (their TTL is still
// turned on if it is off), so it is safe to call on every start of the local
// stack; production tables come from template.yaml instead.
func (s *Store) CreateTables(ctx context.Context) error {
	for _, t := range schemaList(s.tables) {
		if err := s.createTable(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) createTable(ctx context.Context, t tableSchema) error {
	in := &dynamodb.CreateTableInput{
		TableName:   aws.String(t.name),
		KeySchema:   keySchema(t.keys),
		BillingMode: types.BillingModePayPerRequest,
	}
	used := map[string]bool{}
	for _, k := range t.keys {
		used[k] = true
	}
	for _, ix := range t.indexes {
		in.GlobalSecondaryIndexes = append(in.GlobalSecondaryIndexes, types.GlobalSecondaryIndex{
			IndexName:  aws.String(ix.name),
			KeySchema:  keySchema(ix.keys),
			Projection: &types.Projection{ProjectionType: ix.projection, NonKeyAttributes: ix.include},
		})
		for _, k := range ix.keys {
			used[k] = true
		}
	}
	for name := range used {
		in.AttributeDefinitions = append(in.AttributeDefinitions, types.AttributeDefinition{
			AttributeName: aws.String(name), AttributeType: t.attrTypes[name],
		})
	}
	_, err := s.api.CreateTable(ctx, in)
	var inUse *types.ResourceInUseException
	switch {
	case errors.As(err, &inUse):
		// Exists already (or is being created): fine.
	case err != nil:
		return fault("creating table "+t.name, err)
	}
	if err := dynamodb.NewTableExistsWaiter(s.api).Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(t.name)}, tableWait); err != nil {
		return fault("waiting for table "+t.name, err)
	}
	if t.ttl == "" {
		return nil
	}
	desc, err := s.api.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(t.name)})
	if err != nil {
		return fault("reading the TTL of "+t.name, err)
	}
	if d := desc.TimeToLiveDescription; d != nil && aws.ToString(d.AttributeName) == t.ttl &&
		(d.TimeToLiveStatus == types.TimeToLiveStatusEnabled || d.TimeToLiveStatus == types.TimeToLiveStatusEnabling) {
		return nil
	}
	_, err = s.api.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName:               aws.String(t.name),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String(t.ttl), Enabled: aws.Bool(true)},
	})
	if err != nil {
		return fault(fmt.Sprintf("turning on the TTL of %s", t.name), err)
	}
	return nil
}
