package dynamostore_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
	"github.com/runfleet/runfleet/tests/kit/storetest"
)

// moto is one moto_server for the whole test binary; every store gets its
// own tables (a unique prefix), so tests share it safely in parallel.
var moto *motoserver.Server

func TestMain(m *testing.M) {
	os.Exit(motoserver.Run(m, func(s *motoserver.Server) { moto = s }))
}

// newStore creates fresh tables and a store on them.
func newStore(t testing.TB, clk clock.Clock, meter *dynamostore.Meter) *dynamostore.Store {
	t.Helper()
	names := dynamostore.Prefixed(motoserver.Unique("t") + "-")
	s, err := dynamostore.New(moto.DynamoDB(), dynamostore.Config{Tables: names, Clock: clk, Meter: meter})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateTables(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clk *clock.Fake) store.Store {
		return newStore(t, clk, nil)
	})
}

// TestContractWithShardedAllIndex: with the "all" index spread over
// several partitions (what raising allShards does), the listing of every
// run, a merge of those partitions, keeps the whole contract.
func TestContractWithShardedAllIndex(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clk *clock.Fake) store.Store {
		s := newStore(t, clk, nil)
		dynamostore.SetAllShards(s, 3)
		return s
	})
}

func TestTablesAsDesigned(t *testing.T) {
	ctx := context.Background()
	names := dynamostore.Prefixed(motoserver.Unique("design") + "-")
	s, err := dynamostore.New(moto.DynamoDB(), dynamostore.Config{Tables: names})
	if err != nil {
		t.Fatal(err)
	}
	// Twice: existing tables are fine.
	for range 2 {
		if err := s.CreateTables(ctx); err != nil {
			t.Fatalf("CreateTables: %v", err)
		}
	}
	db := moto.DynamoDB()
	describe := func(table string) *types.TableDescription {
		out, err := db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		if err != nil {
			t.Fatal(err)
		}
		return out.Table
	}
	keys := func(ks []types.KeySchemaElement) string {
		var parts []string
		for _, k := range ks {
			parts = append(parts, aws.ToString(k.AttributeName)+":"+string(k.KeyType))
		}
		return strings.Join(parts, ",")
	}
	for table, want := range map[string]string{
		names.Hosts:       "id:HASH",
		names.Runs:        "fleetRunId:HASH",
		names.Events:      "fleetRunId:HASH,sequence:RANGE",
		names.Callers:     "id:HASH",
		names.Idempotency: "id:HASH",
	} {
		if got := keys(describe(table).KeySchema); got != want {
			t.Errorf("%s key %s, want %s", table, got, want)
		}
	}
	gsis := map[string]string{}
	for _, g := range describe(names.Runs).GlobalSecondaryIndexes {
		gsis[aws.ToString(g.IndexName)] = keys(g.KeySchema) + " " + string(g.Projection.ProjectionType)
		if include := g.Projection.NonKeyAttributes; len(include) > 0 {
			gsis[aws.ToString(g.IndexName)] += " " + strings.Join(include, ",")
		}
	}
	wantGSIs := map[string]string{
		"live":    "live:HASH,fleetRunId:RANGE KEYS_ONLY",
		"byOwner": "ownerId:HASH,createdAt:RANGE KEYS_ONLY",
		"byHost":  "hostId:HASH,createdAt:RANGE KEYS_ONLY",
		"all":     "allShard:HASH,createdAt:RANGE KEYS_ONLY",
		"queue":   "qp:HASH,qk:RANGE INCLUDE qh,qu",
	}
	if fmt.Sprint(gsis) != fmt.Sprint(wantGSIs) {
		t.Errorf("runs indexes %v, want %v", gsis, wantGSIs)
	}
	for _, table := range []string{names.Runs, names.Events, names.Idempotency} {
		out, err := db.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(table)})
		if err != nil {
			t.Fatal(err)
		}
		d := out.TimeToLiveDescription
		if d == nil || aws.ToString(d.AttributeName) != "expiresAt" || d.TimeToLiveStatus != types.TimeToLiveStatusEnabled {
			t.Errorf("%s TTL: %+v, want enabled on expiresAt", table, d)
		}
	}
}

// rawItem reads an item as stored, past the store.
func rawItem(t *testing.T, table string, key map[string]types.AttributeValue) map[string]types.AttributeValue {
	t.Helper()
	out, err := moto.DynamoDB().GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(table), Key: key, ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	return out.Item
}

func s(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }

func attrString(v types.AttributeValue) string {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return "S:" + v.Value
	case *types.AttributeValueMemberN:
		return "N:" + v.Value
	case *types.AttributeValueMemberBOOL:
		return fmt.Sprintf("BOOL:%v", v.Value)
	case *types.AttributeValueMemberB:
		return "B:" + base64.StdEncoding.EncodeToString(v.Value)
	case *types.AttributeValueMemberL:
		parts := make([]string, len(v.Value))
		for i, e := range v.Value {
			parts[i] = attrString(e)
		}
		return "L:[" + strings.Join(parts, " ") + "]"
	case *types.AttributeValueMemberM:
		keys := slices.Sorted(maps.Keys(v.Value))
		for i, k := range keys {
			keys[i] = k + "=" + attrString(v.Value[k])
		}
		return "M:{" + strings.Join(keys, " ") + "}"
	case nil:
		return "absent"
	}
	return fmt.Sprintf("%T", v)
}

func TestRunItemFormat(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(storetest.Start)
	names := dynamostore.Prefixed(motoserver.Unique("fmt") + "-")
	st, err := dynamostore.New(moto.DynamoDB(), dynamostore.Config{Tables: names, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTables(ctx); err != nil {
		t.Fatal(err)
	}
	r := store.Run{FleetRunID: "r1", OwnerID: "alice", HostID: "h1", Status: store.StatusDispatching, CreatedAt: clk.Now()}
	if err := st.CreateRun(ctx, r); err != nil {
		t.Fatal(err)
	}
	key := map[string]types.AttributeValue{"fleetRunId": s("r1")}
	check := func(what string, it map[string]types.AttributeValue, want map[string]string) {
		t.Helper()
		for name, w := range want {
			if got := attrString(it[name]); got != w {
				t.Errorf("%s: %s = %s, want %s", what, name, got, w)
			}
		}
	}
	check("dispatching run", rawItem(t, names.Runs, key), map[string]string{
		"v":          "N:1",
		"fleetRunId": "S:r1",
		"ownerId":    "S:alice",
		"hostId":     "S:h1",
		"createdAt":  "S:2026-03-04T05:06:07.123456789Z#r1",
		"live":       "S:1",
		"status":     "S:dispatching",
		"version":    "N:1",
		"expiresAt":  "absent",
	})
	r.Version = 1
	ended := clk.Now().Add(time.Minute)
	r.Status, r.EndedAt, r.Drained, r.ExpiresAt = "succeeded", &ended, true, ended.Add(30*24*time.Hour)
	if _, err := st.UpdateRun(ctx, r); err != nil {
		t.Fatal(err)
	}
	check("ended, drained run", rawItem(t, names.Runs, key), map[string]string{
		"live":      "absent",
		"status":    "S:succeeded",
		"drained":   "BOOL:true",
		"version":   "N:2",
		"expiresAt": fmt.Sprintf("N:%d", store.RoundExpiry(r.ExpiresAt).Unix()),
		"createdAt": "S:2026-03-04T05:06:07.123456789Z#r1",
	})
}

func TestCallerItemsWrittenAndDeletedTogether(t *testing.T) {
	ctx := context.Background()
	names := dynamostore.Prefixed(motoserver.Unique("callers") + "-")
	st, err := dynamostore.New(moto.DynamoDB(), dynamostore.Config{Tables: names})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTables(ctx); err != nil {
		t.Fatal(err)
	}
	hash := strings.Repeat("ab", 32)
	c := store.Caller{OwnerID: "bob", TokenHash: hash, AllowedHosts: store.Scope{All: true}, AllowedProjects: store.Scope{IDs: []string{"acme"}}}
	if err := st.CreateCaller(ctx, c); err != nil {
		t.Fatal(err)
	}
	owner := rawItem(t, names.Callers, map[string]types.AttributeValue{"id": s("owner#bob")})
	token := rawItem(t, names.Callers, map[string]types.AttributeValue{"id": s("token#" + hash)})
	if attrString(owner["tokenHash"]) != "S:"+hash || attrString(token["ownerId"]) != "S:bob" {
		t.Fatalf("caller items: owner %v token %v", owner, token)
	}
	if attrString(token["allowedHosts"]) != "S:*" {
		t.Fatalf("allowedHosts stored as %s", attrString(token["allowedHosts"]))
	}
	if err := st.DeleteCaller(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"owner#bob", "token#" + hash} {
		if it := rawItem(t, names.Callers, map[string]types.AttributeValue{"id": s(id)}); it != nil {
			t.Fatalf("%s survives DeleteCaller: %v", id, it)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		tables dynamostore.TableNames
		ok     bool
	}{
		"zero means defaults": {dynamostore.TableNames{}, true},
		"prefixed":            {dynamostore.Prefixed("dev-"), true},
		"one name missing":    {dynamostore.TableNames{Hosts: "h", Runs: "r", Events: "e", Callers: "c"}, false},
		"a name used twice":   {dynamostore.TableNames{Hosts: "x", Runs: "r", Events: "e", Callers: "c", Idempotency: "x"}, false},
	} {
		_, err := dynamostore.New(moto.DynamoDB(), dynamostore.Config{Tables: tc.tables})
		if (err == nil) != tc.ok {
			t.Errorf("%s: New error %v, want ok=%v", name, err, tc.ok)
		}
	}
}
