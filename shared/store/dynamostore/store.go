// Package dynamostore owns the DynamoDB implementation of store.Store, the
// production store, and the capacity Meter that prices its calls by
// DynamoDB's documented rules.
//
// # Tables
//
// Five tables (names in TableNames, from RUNFLEET_TABLE_* in Fleet's config),
// all on-demand, every item carrying its format version in "v":
//
//	hosts        id (S)                    the host and its last probe ("probe", a map);
//	                                       the routing view: "#route#<list>#<n>", "#route#index"
//	runs         fleetRunId (S)            TTL expiresAt
//	  GSI live     live (S) + fleetRunId   KEYS_ONLY, sparse: only runs with Live() carry "live"="1"
//	  GSI byOwner  ownerId (S) + createdAt KEYS_ONLY
//	  GSI byHost   hostId (S) + createdAt  KEYS_ONLY
//	  GSI all      allShard (S) + createdAt KEYS_ONLY: every run, for the admin listing
//	events       fleetRunId (S) + sequence (N)   TTL expiresAt
//	callers      id (S): "owner#<ownerId>" and "token#<sha256>", the full caller in both
//	idempotency  id (S): "<ownerId>#<key>"        TTL expiresAt
//
// The runs' index sort key "createdAt" is the creation time, fixed-width
// RFC 3339 in UTC with nanoseconds, followed by "#" and the run id: ties on
// the time sort by id, so every index has the one total order ListRuns
// promises, and a cursor is a position in it ("strictly older than").
//
// # Projections
//
// Every index is KEYS_ONLY. An index entry is rewritten whenever a projected
// attribute changes, and every UpdateRun changes version and status: with
// any projection beyond the keys, each update would cost one more write per
// index. KEYS_ONLY keeps an update at the base write (plus one when the run
// enters or leaves the live index); the price is paid by listings, which
// fetch the page's runs with BatchGetItem (eventually consistent, half a
// unit per run up to 4 KB).
//
// # Consistency
//
// Single-item reads (GetHost, GetRun, GetIdempotency, CallerByTokenHash)
// are strongly consistent: a revoked token stops working at once. GetRun
// and GetIdempotency read eventually consistent (half the units) when ctx
// carries store.EventualRead, which dispatch uses where a conditional write,
// not the read, guards the invariant. Index queries
// are eventually consistent (DynamoDB offers nothing else on a GSI), so a
// listing or DeleteHost's in-use check may miss a run written in the last
// second. ListHosts scans eventually consistent (the probe pass, listings,
// admin verbs); routing reads the routing view instead (below). Events are read strongly consistent, so a
// stream never declares a drained run done before seeing its last event.
//
// # Costs (per call, by the documented rules; see Meter)
//
// Item sizes: a run ~0.4 KB, an idempotency item ~0.15 KB, a caller item
// ~0.2 KB, index entries ~0.1 KB; each under 1 KB, so:
//
//	CreateRun          PutItem: 1 WCU + 1 per index the run enters (live, byOwner, byHost, all) = 5 WCU
//	UpdateRun          UpdateItem: 1 WCU, +1 live index write when the run leaves (or re-enters) it
//	                   (+1 "all" write, once, for a run written before that index: the migration)
//	GetRun             GetItem: 1 RCU strong, 0.5 with store.EventualRead
//	PutIdempotency     PutItem: 1 WCU, won or lost (a lost one returns the holder: no read)
//	GetIdempotency     GetItem: 1 RCU strong, 0.5 with store.EventualRead
//	CallerByTokenHash  GetItem, strong: 1 RCU (the token item holds the whole caller)
//	CreateCaller       TransactWriteItems of 2 puts: 2 x 2 WCU = 4 WCU
//	DeleteCaller       GetItem 1 RCU + TransactWriteItems of 2 deletes: 4 WCU
//	ListHosts          Scan, eventual: ceil(total host bytes / 4 KB) x 0.5 RCU
//	RouteShard         GetItem, eventual, of an item under 4 KB: 0.5 RCU
//	PutRouteView       GetItem of the index (strong, 1 RCU) + BatchWriteItem of
//	                   the shards: ceil(shard bytes / 1 KB) WCU each, at most
//	                   3 shards x 4 WCU per list, + 1 WCU for the index when the
//	                   lists change, + 1 WCU per shard a list no longer fills
//	RecordDrain        UpdateItem of the host item: ceil(item bytes / 1 KB) WCU
//	ListLive           Query of the live index, eventual: ceil(page bytes / 4 KB) x 0.5 RCU
//	ListRuns           Query of one index partition (byOwner, byHost, or all for everyone)
//	                   + BatchGetItem of the page and one more run: ~1.5 + 0.5 per run;
//	                   a page of 100: 1 Query + 2 BatchGetItem (100 keys a call), ~52 RCU
//	DeleteHost (a step)  GetItem 1 RCU + Query byHost (<= 100 keys) ~1.5 RCU
//	                   (+ BatchGetItem of those runs without force, 0.5 each); per run a
//	                   strong Query of its events (ceil(bytes / 4 KB) RCU) and its share of
//	                   BatchWriteItem deletes: the run 1 WCU + 3 index deletes (+1 live if
//	                   live) + 1 WCU per event KB; the host 1 WCU on the last step
//	PutEvents          one conditional PutItem per event: ceil(event bytes / 1 KB) WCU each
//	ListEvents         Query, strong: ceil(page bytes / 4 KB) RCU
//
// A write whose answer is lost and that the SDK retries (ownwrites.go)
// costs one more write: the retry's failed condition, priced like any
// (ceil(holder bytes / 1 KB) WCU, twice in CreateCaller's transaction). It
// costs no read: the holder comes back with the failure
// (ReturnValuesOnConditionCheckFailure ALL_OLD: "No read capacity units are
// consumed", Amazon DynamoDB API Reference, PutItem and UpdateItem); only
// an emulator that returns no holder costs a strongly consistent GetItem
// more (1 RCU). Before, a lost UpdateRun answer cost its caller a strong
// GetRun (1 RCU) to recover from the ErrConflict. The token each of these
// writes carries, 26 bytes, changes none of the figures above; in the
// hosts table it adds 26 bytes per host to ListHosts' Scan.
//
// Listing everyone reads the "all" index: every run carries "allShard"
// (set by CreateRun; one value today, see allShards), so a page is one
// Query and one or two BatchGetItem whatever the number of hosts: ~52 RCU
// for a page of 100 (the index keys ~1.5, the 101 runs 50.5), where the
// earlier merge of every host's byHost partition cost ~H x 0.5 RCU and H
// calls more. The price is one index write per run created (and deleted):
// 5 WCU per CreateRun instead of 4.
//
// Migration: runs written before the "all" index lack "allShard" and are
// missing from the everyone listing until their next UpdateRun writes it
// (live runs: within a sweep). Ended runs of that time are left out until
// they expire (RUNFLEET_RETENTION_DAYS) unless backfilled: an update
// setting allShard = "0" on each run that lacks it (a Scan with
// attribute_not_exists(allShard)), run once after the deploy.
//
// # Routing without a scan
//
// A routed dispatch once scanned the hosts table: ~40-118 RCU at 1,000
// hosts, ~430-1,180 at 10,000. It now reads the routing view, which the
// probe pass writes into the hosts table from the hosts it has just
// listed and probed (fleet.BuildRouteView): one list per agent the fleet
// offers ("#route#a:<agent>#<n>", at most fleet.MaxRouteLists) and one for
// any agent ("#route#any#<n>"), each every host in routing's order
// (routable for the agent first, by latency then id; the rest by id),
// gzip-compressed JSON in a binary attribute, packed into at most
// store.RouteShardsMax = 3 shards under 4 KB: ~200-1,100 hosts a shard
// depending on how alike their ids, labels and probe times are (measured:
// ~210 with random ids, probe times and labels; ~360 with sequential ids
// and a label of their own; ~1,100 with sequential ids alone), so ~600 to
// ~3,300 hosts a list; the rest are left out of it. A host whose entry
// alone outgrows a shard (labels and local paths near their bounds, which
// do not compress) is left out of every list: routed to only by name.
// An entry holds what routing decides from, never the address, credential
// or CA. The index item "#route#index" names each list with its shard
// count, so a pass deletes lists and shards it no longer writes.
//
// Bound, per routed dispatch whatever the number of hosts: the caller 1 +
// the idempotency item 0.5 + shard 0 of the agent's list (or, when it has
// none, of "any") 0.5 + the chosen host's item, strongly consistent, 1 =
// 3 RCU (measured at 10, 1,000 and 10,000 hosts: 3.0). A request no host
// in shard 0 can take reads the next shard, at most 3 (1.5 RCU); each host
// chosen but found changed since the view (gone, disabled, drained) costs
// one more strong read, at most 3. A refusal past the view says how many
// hosts it considered of how many.
//
// Write cost per probe pass: per list, its shards (4 WCU for a full one):
// at most 12 WCU a list, (agents + 1) x 12 in all; measured 2 WCU at 10
// hosts, 24 (+1 for the index on the first pass) at 1,000 and at 10,000
// hosts with one agent. Admin verbs on one host (probe, enable, drain,
// resume) rebuild the view at the cost of a pass's scan plus these writes.
//
// Staleness: a list is as old as the last pass (or admin verb) that wrote
// it, at most one probe interval. A host registered since is missing (it
// would be never_probed until probed anyway); a host deleted, disabled or
// drained since is caught by the strong re-read of the host chosen. A
// probe's age is judged at dispatch (stale_probe), from the entry's probe
// time. Lists are written one after another, so a dispatch may read one
// pass's shard 0 and the next pass's shard 1; it skips hosts already
// seen. Before the first pass writes a view, dispatch falls back to the
// scan.
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

// TableNames names the five tables.
type TableNames struct {
	Hosts, Runs, Events, Callers, Idempotency string
}

// DefaultTableNames are the names used when Config.Tables is zero.
func DefaultTableNames() TableNames {
	return TableNames{
		Hosts:       "runfleet-hosts",
		Runs:        "runfleet-runs",
		Events:      "runfleet-events",
		Callers:     "runfleet-callers",
		Idempotency: "runfleet-idempotency",
	}
}

// Prefixed returns names with prefix before each default name, for tests
// and stacks that share an account.
func Prefixed(prefix string) TableNames {
	d := DefaultTableNames()
	return TableNames{
		Hosts: prefix + d.Hosts, Runs: prefix + d.Runs, Events: prefix + d.Events,
		Callers: prefix + d.Callers, Idempotency: prefix + d.Idempotency,
	}
}

func (n TableNames) list() []string {
	return []string{n.Hosts, n.Runs, n.Events, n.Callers, n.Idempotency}
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
	for _, n := range c.Tables.list() {
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
	_ store.SweepCursorStore = (*Store)(nil)
	_ store.StreamLeases     = (*Store)(nil)
	_ store.RouteStore       = (*Store)(nil)
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
