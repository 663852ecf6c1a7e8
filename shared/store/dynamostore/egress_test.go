package dynamostore_test

import (
	"context"
	"fmt"
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

// TestEgressOverlappingChunksReadOnce: chunks that overlap (two mirrors
// racing past PutEgress's look at what is stored) are read with each seq
// once, in order, from the chunk with the lowest key, and pages never go
// past their limit.
func TestEgressOverlappingChunksReadOnce(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(storetest.Start)
	names := dynamostore.Prefixed(motoserver.Unique("overlap") + "-")
	s := stepStore(t, moto.DynamoDB(), names, clk)
	exp := clk.Now().Add(time.Hour)
	orig := storetest.LedgerRecords("r1", 1, 300, clk.Now())
	other := storetest.LedgerRecords("rX", 1, 300, clk.Now())
	// Chunks keyed 40, 80, 100, 160 and 300: [1-40] [30-80] [41-100]
	// [150-160] [101-300].
	for _, recs := range [][]store.EgressRecord{orig[0:40], other[29:80], orig[40:100], other[149:160], orig[100:300]} {
		if err := dynamostore.PutChunk(ctx, s, "r1", recs, exp); err != nil {
			t.Fatal(err)
		}
	}
	// Lowest key first: 1-40 from [1-40], 41-80 from [30-80] (other's
	// bytes), 81-100 from [41-100], 101-149 from [101-300], 150-160 from
	// [150-160] (other's), the rest from [101-300].
	want := append([]store.EgressRecord{}, orig[:40]...)
	want = append(want, other[40:80]...)
	want = append(want, orig[80:149]...)
	want = append(want, other[149:160]...)
	want = append(want, orig[160:]...)
	for _, limit := range []int{1, 9, 100, 1000} {
		var got []store.EgressRecord
		after := int64(0)
		for {
			p, err := s.ListEgress(ctx, "r1", after, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Records) > limit {
				t.Fatalf("page of %d records, limit %d", len(p.Records), limit)
			}
			got = append(got, p.Records...)
			if !p.HasMore {
				break
			}
			after = p.Records[len(p.Records)-1].Seq
		}
		if len(got) != len(want) {
			t.Fatalf("limit %d: %d records, want %d", limit, len(got), len(want))
		}
		for i := range got {
			if got[i].Seq != want[i].Seq || string(got[i].Data) != string(want[i].Data) {
				t.Fatalf("limit %d: record %d is seq %d %.40s, want seq %d %.40s", limit, i, got[i].Seq, got[i].Data, want[i].Seq, want[i].Data)
			}
		}
	}
	// A put over the mess writes nothing: every seq is held.
	m := &dynamostore.Meter{}
	ms, err := dynamostore.New(moto.DynamoDB(), dynamostore.Config{Tables: names, Clock: clk, Meter: m})
	if err != nil {
		t.Fatal(err)
	}
	if err := ms.PutEgress(ctx, "r1", other, exp); err != nil {
		t.Fatal(err)
	}
	if u := m.Snapshot(); u.TotalWCU() != 0 {
		t.Fatalf("a put of stored seqs wrote: %s", u)
	}
}

// TestEgressChunksStayWithinAReadUnit: the records a mirror puts are
// packed into chunks of at most 4 KB (one strongly consistent read unit),
// keyed by their last seq, whatever the batch sizes.
func TestEgressChunksStayWithinAReadUnit(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(storetest.Start)
	names := dynamostore.Prefixed(motoserver.Unique("chunks") + "-")
	s := stepStore(t, moto.DynamoDB(), names, clk)
	recs := storetest.LedgerRecords("r1", 1, 1000, clk.Now())
	for start := 0; start < len(recs); start += 100 {
		if err := s.PutEgress(ctx, "r1", recs[start:start+100], clk.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	out, err := moto.DynamoDB().Query(ctx, &dynamodb.QueryInput{
		TableName:                 aws.String(names.Egress),
		KeyConditionExpression:    aws.String("fleetRunId = :r"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":r": &types.AttributeValueMemberS{Value: "r1"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	next := int64(1)
	for _, it := range out.Items {
		size := dynamostore.ItemSize(it)
		first, last := it["first"].(*types.AttributeValueMemberN).Value, it["seq"].(*types.AttributeValueMemberN).Value
		if size > dynamostore.ChunkItemBytes {
			t.Errorf("chunk %s-%s is %d bytes", first, last, size)
		}
		if first != fmt.Sprint(next) {
			t.Errorf("chunk %s-%s follows seq %d", first, last, next-1)
		}
		fmt.Sscan(last, &next)
		next++
	}
	if next != 1001 {
		t.Fatalf("the chunks end at %d, want 1000", next-1)
	}
	t.Logf("1,000 records of ~%d bytes in %d chunks", len(recs[0].Data), len(out.Items))
}
