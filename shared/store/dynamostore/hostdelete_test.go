package dynamostore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync/atomic"
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

// failRunDeletes is moto's client, except that the first BatchWriteItem
// on the runs table fails before reaching it, as a Lambda that dies (or a
// network that drops) between a step's event deletes and its run deletes.
type failRunDeletes struct {
	dynamostore.API
	runs   string
	failed atomic.Bool
}

func (f *failRunDeletes) BatchWriteItem(ctx context.Context, in *dynamodb.BatchWriteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error) {
	if _, ok := in.RequestItems[f.runs]; ok && f.failed.CompareAndSwap(false, true) {
		return nil, errors.New("connection reset (injected)")
	}
	return f.API.BatchWriteItem(ctx, in, opts...)
}

func stepStore(t *testing.T, api dynamostore.API, names dynamostore.TableNames, clk clock.Clock) *dynamostore.Store {
	t.Helper()
	s, err := dynamostore.New(api, dynamostore.Config{Tables: names, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateTables(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func outputEvent(id string, seq int64, at time.Time) store.Event {
	return store.Event{FleetRunID: id, Sequence: seq, Type: "output", Data: json.RawMessage(`"x"`), TS: at}
}

// TestDeleteHostStepCutShort: a step that fails after deleting its runs'
// events and before deleting the runs leaves every run in place, and the
// repeat finishes the deletion.
func TestDeleteHostStepCutShort(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(storetest.Start)
	names := dynamostore.Prefixed(motoserver.Unique("cut") + "-")
	faulty := &failRunDeletes{API: moto.DynamoDB(), runs: names.Runs}
	s := stepStore(t, faulty, names, clk)
	now := clk.Now()
	if err := s.CreateHost(ctx, store.Host{ID: "h1", BaseURL: "https://h1.example", CredentialRef: "c", Enabled: true, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	const n = 30
	for i := range n {
		id := fmt.Sprintf("r%02d", i)
		if err := s.CreateRun(ctx, store.Run{FleetRunID: id, OwnerID: "alice", HostID: "h1", Status: "running", CreatedAt: now.Add(time.Duration(i) * time.Second)}); err != nil {
			t.Fatal(err)
		}
		if err := s.PutEvents(ctx, []store.Event{outputEvent(id, 1, now), outputEvent(id, 2, now)}); err != nil {
			t.Fatal(err)
		}
	}

	if _, err := s.DeleteHost(ctx, "h1", true); err == nil {
		t.Fatal("the cut-short step reported no error")
	}
	for i := range n {
		if _, err := s.GetRun(ctx, fmt.Sprintf("r%02d", i)); err != nil {
			t.Fatalf("run r%02d after the cut-short step: %v", i, err)
		}
	}
	if _, err := s.GetHost(ctx, "h1"); err != nil {
		t.Fatalf("the host after the cut-short step: %v", err)
	}
	if p, err := s.ListEvents(ctx, "r00", 0, 10); err != nil || len(p.Events) != 0 {
		t.Fatalf("the cut-short step stopped before the events (%d left, %v): not the case under test", len(p.Events), err)
	}

	res, err := s.DeleteHost(ctx, "h1", true)
	if err != nil || !res.Done || res.RunsDeleted != n {
		t.Fatalf("the repeat: %+v, %v; want done with %d runs deleted", res, err, n)
	}
	for i := range n {
		id := fmt.Sprintf("r%02d", i)
		if _, err := s.GetRun(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("run %s after the repeat: %v", id, err)
		}
		if p, err := s.ListEvents(ctx, id, 0, 10); err != nil || len(p.Events) != 0 {
			t.Fatalf("events of %s after the repeat: %v, %v", id, p.Events, err)
		}
	}
}

// TestDeleteHostStepEventsBudget: a run with more events than a step's
// budget is deleted over two steps: the first deletes exactly the budget's
// worth of its events and keeps the run; the second finishes it and the
// host.
func TestDeleteHostStepEventsBudget(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(storetest.Start)
	names := dynamostore.Prefixed(motoserver.Unique("budget") + "-")
	s := stepStore(t, moto.DynamoDB(), names, clk)
	now := clk.Now()
	if err := s.CreateHost(ctx, store.Host{ID: "h1", BaseURL: "https://h1.example", CredentialRef: "c", Enabled: true, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"big", "small"} {
		if err := s.CreateRun(ctx, store.Run{FleetRunID: id, OwnerID: "alice", HostID: "h1", Status: "running", CreatedAt: now.Add(time.Duration(i) * time.Second)}); err != nil {
			t.Fatal(err)
		}
		if err := s.PutEvents(ctx, []store.Event{outputEvent(id, 1, now)}); err != nil {
			t.Fatal(err)
		}
	}
	// The big run's other events, copies of its first as stored, at batch speed.
	const events = store.DeleteHostEventsPerStep + 10
	db := moto.DynamoDB()
	first, err := db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(names.Events), Key: map[string]types.AttributeValue{
		"fleetRunId": &types.AttributeValueMemberS{Value: "big"}, "sequence": &types.AttributeValueMemberN{Value: "1"}}})
	if err != nil || first.Item == nil {
		t.Fatalf("reading the first event: %v", err)
	}
	for seq := 2; seq <= events; seq += 25 {
		var reqs []types.WriteRequest
		for q := seq; q < seq+25 && q <= events; q++ {
			it := maps.Clone(first.Item)
			it["sequence"] = &types.AttributeValueMemberN{Value: strconv.Itoa(q)}
			reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: it}})
		}
		if _, err := db.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{names.Events: reqs}}); err != nil {
			t.Fatal(err)
		}
	}

	res, err := s.DeleteHost(ctx, "h1", true)
	if err != nil || res.Done || res.RunsDeleted != 0 {
		t.Fatalf("first step: %+v, %v; want not done, no run deleted", res, err)
	}
	p, err := s.ListEvents(ctx, "big", 0, 1000)
	if err != nil || len(p.Events) != events-store.DeleteHostEventsPerStep {
		t.Fatalf("the big run's events after the first step: %d, %v; want %d", len(p.Events), err, events-store.DeleteHostEventsPerStep)
	}
	if _, err := s.GetRun(ctx, "small"); err != nil {
		t.Fatalf("the small run after the first step: %v", err)
	}
	res, err = s.DeleteHost(ctx, "h1", true)
	if err != nil || !res.Done || res.RunsDeleted != 2 {
		t.Fatalf("second step: %+v, %v; want done with both runs", res, err)
	}
}

// TestRunsBeforeTheAllIndexJoinItOnUpdate: a run stored without allShard
// (written before the index existed) is missing from the everyone listing
// until its next UpdateRun, which gives it its entry.
func TestRunsBeforeTheAllIndexJoinItOnUpdate(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(storetest.Start)
	names := dynamostore.Prefixed(motoserver.Unique("migrate") + "-")
	s := stepStore(t, moto.DynamoDB(), names, clk)
	now := clk.Now()
	if err := s.CreateRun(ctx, store.Run{FleetRunID: "old", OwnerID: "alice", HostID: "h1", Status: "running", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	db := moto.DynamoDB()
	if _, err := db.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(names.Runs),
		Key: map[string]types.AttributeValue{"fleetRunId": &types.AttributeValueMemberS{Value: "old"}}, UpdateExpression: aws.String("REMOVE allShard")}); err != nil {
		t.Fatal(err)
	}
	list := func() int {
		p, err := s.ListRuns(ctx, store.RunQuery{})
		if err != nil {
			t.Fatal(err)
		}
		return len(p.Runs)
	}
	if n := list(); n != 0 {
		t.Fatalf("a run without allShard is listed (%d): the test does not test the migration", n)
	}
	r, err := s.GetRun(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	r.Status = store.StatusSucceeded
	if _, err := s.UpdateRun(ctx, r); err != nil {
		t.Fatal(err)
	}
	if n := list(); n != 1 {
		t.Fatalf("after its update the old run is listed %d times, want once", n)
	}
}
