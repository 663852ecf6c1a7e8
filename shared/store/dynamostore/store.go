// Package dynamostore owns the DynamoDB implementation of every role of
// store.Store, the production store, and the capacity Meter that prices
// its calls by DynamoDB's documented rules.
//
// Its contracts, beyond the store's:
//
//   - Six on-demand tables (TableNames, from RUNFLEET_TABLE_* in Fleet's
//     config), every item carrying its format version in "v". New never
//     touches them: CreateTables makes them where the stack owns them
//     (tests, the local stack); template.yaml owns them in AWS.
//   - Single-item reads are strongly consistent (a revoked token stops at
//     once); GetHost, GetRun and GetIdempotency read eventually consistent,
//     for half the units, under store.EventualRead. Index queries (the
//     listings, DeleteHost's in-use check) are eventually consistent, as
//     every GSI is; events and egress ledgers are read strongly
//     consistent.
//   - A run's egress ledger is packed into compressed chunks of records
//     (egress.go): a fraction of a write unit a record.
//   - Every index is KEYS_ONLY, so an update costs its one write (plus one
//     when a run enters or leaves the live index); a listing fetches its
//     page with BatchGetItem.
//   - A write whose answer was lost and that the SDK retries recognises
//     its own earlier success by the token it carries (ownwrites.go).
//   - Dispatch routes from the routing view (RouteStore: a few shards in
//     the hosts table), not a scan: about 3 RCU whatever the fleet's size.
//
// The tables and indexes, projections, consistency, the cost of every call
// and the routing view's sizing are in DESIGN.md, section "Fleet's state:
// the stores".
package dynamostore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
)

// API is the part of the DynamoDB client the store uses. *dynamodb.Client
// implements it; so does the metering wrapper a Meter installs.
type API interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	Query(ctx context.Context, in *dynamodb.QueryInput, opts ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	Scan(ctx context.Context, in *dynamodb.ScanInput, opts ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
	BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	BatchWriteItem(ctx context.Context, in *dynamodb.BatchWriteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error)
	TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)

	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	DescribeTimeToLive(ctx context.Context, in *dynamodb.DescribeTimeToLiveInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTimeToLiveOutput, error)
	UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

var _ API = (*dynamodb.Client)(nil)

// TableNames names the six tables.
type TableNames struct {
	Hosts, Runs, Events, Egress, Callers, Idempotency string
}

// DefaultTableNames are the names used when Config.Tables is zero.
func DefaultTableNames() TableNames {
	return TableNames{
		Hosts:       "runfleet-hosts",
		Runs:        "runfleet-runs",
		Events:      "runfleet-events",
		Egress:      "runfleet-egress",
		Callers:     "runfleet-callers",
		Idempotency: "runfleet-idempotency",
	}
}

// Prefixed returns names with prefix before each default name, for tests
// and stacks that share an account.
func Prefixed(prefix string) TableNames {
	d := DefaultTableNames()
	return TableNames{
		Hosts: prefix + d.Hosts, Runs: prefix + d.Runs, Events: prefix + d.Events, Egress: prefix + d.Egress,
		Callers: prefix + d.Callers, Idempotency: prefix + d.Idempotency,
	}
}

// Names lists every table's name, in the order of the fields.
func (n TableNames) Names() []string {
	return []string{n.Hosts, n.Runs, n.Events, n.Egress, n.Callers, n.Idempotency}
}

// Config configures the store.
type Config struct {
	// Tables names the tables; the zero value means DefaultTableNames().
	Tables TableNames
	// Clock decides expiry; nil means the wall clock.
	Clock clock.Clock
	// Meter, when set, counts every call and prices it by DynamoDB's
	// documented capacity rules (for benchmarks; it adds unmetered reads of
	// the items being written, see Meter). Nil: no metering.
	Meter *Meter
	// Random makes the write tokens that let a retried write recognise its
	// own earlier success (ownwrites.go); it must be safe for concurrent
	// use. Nil is crypto/rand.
	Random io.Reader
}

// Validate reports a table name that is empty (in a partly set Tables) or
// used twice.
func (c Config) Validate() error {
	if c.Tables == (TableNames{}) {
		return nil
	}
	seen := map[string]bool{}
	for _, n := range c.Tables.Names() {
		if n == "" {
			return fmt.Errorf("dynamostore: config: every table needs a name (got %+v)", c.Tables)
		}
		if seen[n] {
			return fmt.Errorf("dynamostore: config: table name %q used twice", n)
		}
		seen[n] = true
	}
	return nil
}

// Store is the DynamoDB store. It is safe for concurrent use.
type Store struct {
	api    API
	tables TableNames
	clock  clock.Clock
	random io.Reader
	// allShards is the "all" index's partition count: the constant, except
	// in tests that exercise the sharded listing (export_test.go).
	allShards int
}

// Store plays every role of the store (store.Store is their union); each
// is checked here so that a role's contract names its implementation.
var (
	_ store.Store            = (*Store)(nil)
	_ store.Hosts            = (*Store)(nil)
	_ store.Callers          = (*Store)(nil)
	_ store.IdempotencyKeys  = (*Store)(nil)
	_ store.Runs             = (*Store)(nil)
	_ store.Events           = (*Store)(nil)
	_ store.Egress           = (*Store)(nil)
	_ store.SweepCursorStore = (*Store)(nil)
	_ store.StreamLeases     = (*Store)(nil)
	_ store.RouteStore       = (*Store)(nil)
	_ store.BrokerStates     = (*Store)(nil)
	_ store.Queue            = (*Store)(nil)
)

// New returns a store on client. It does not touch the tables: call
// CreateTables where the stack owns them (tests, the local stack).
func New(client API, cfg Config) (*Store, error) {
	if client == nil {
		return nil, errors.New("dynamostore: nil client")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Tables == (TableNames{}) {
		cfg.Tables = DefaultTableNames()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Random == nil {
		cfg.Random = rand.Reader
	}
	s := &Store{api: client, tables: cfg.Tables, clock: cfg.Clock, random: cfg.Random, allShards: allShards}
	if cfg.Meter != nil {
		s.api = &metered{next: client, meter: cfg.Meter, schemas: schemasFor(cfg.Tables)}
	}
	return s, nil
}

func (s *Store) now() time.Time { return s.clock.Now() }

// conditionFailed reports whether err is a failed condition, and returns the
// item DynamoDB sent back with it (ALL_OLD), nil when there was none.
func conditionFailed(err error) (bool, map[string]types.AttributeValue) {
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return true, ccf.Item
	}
	return false, nil
}

// canceledBy reports, for a canceled transaction, whether any action's
// condition failed and whether any conflicted with another transaction.
func canceledBy(err error) (canceled, conditionFailed, conflict bool) {
	var tce *types.TransactionCanceledException
	if !errors.As(err, &tce) {
		return false, false, false
	}
	for _, r := range tce.CancellationReasons {
		switch aws.ToString(r.Code) {
		case "ConditionalCheckFailed":
			conditionFailed = true
		case "TransactionConflict":
			conflict = true
		}
	}
	return true, conditionFailed, conflict
}

// fault wraps an unexpected error with the operation, keeping the cause.
func fault(op string, err error) error {
	return fmt.Errorf("dynamostore: %s: %w", op, err)
}
