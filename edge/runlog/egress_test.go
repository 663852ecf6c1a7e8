package runlog

import (
	"errors"
	"fmt"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/runfleet/runfleet/shared/egress"
)

// egressRecords is one chunk of the records from..to.
func egressRecords(from, to int64) []EgressChunk {
	c := EgressChunk{First: from}
	for seq := from; seq <= to; seq++ {
		c.Data = fmt.Appendf(c.Data, "{\"seq\":%d,\"via\":\"proxy\"}\n", seq)
	}
	return []EgressChunk{c}
}

// A run's ledger is written for several runs in one call, read back byte
// for byte by page with the head of the same moment, and its head and
// records survive a reopen; a page past the end says so, and a run the log
// does not hold is ErrNotFound for a page and skipped by a write.
func TestEgressWritesPagesAndSurvivesReopen(t *testing.T) {
	l, path := openTemp(t)
	for _, id := range []string{"r1", "r2", "quiet"} {
		if _, _, err := l.Create(Record{RunID: id, ClientToken: "t-" + id}); err != nil {
			t.Fatal(err)
		}
	}
	var tally egress.Tally
	tally.Add(egress.Record{Authority: "a.test:443", Action: egress.Forwarded})
	seal := &egress.Seal{Count: 5, LastHash: "ab", Signature: "sig", PublicKey: "ed25519:x"}
	gone, err := l.WriteEgress([]EgressWrite{
		{RunID: "r1", Chunks: egressRecords(1, 3), Head: EgressHead{Count: 3, LastHash: "h3", Tally: tally}},
		{RunID: "r2", Chunks: egressRecords(1, 1), Head: EgressHead{Count: 1, LastHash: "x1"}},
		{RunID: "purged", Chunks: egressRecords(1, 1), Head: EgressHead{Count: 1}},
	})
	if err != nil || len(gone) != 1 || gone[0] != "purged" {
		t.Fatalf("WriteEgress: gone %q, %v; want the unknown run skipped", gone, err)
	}
	if _, err := l.WriteEgress([]EgressWrite{{RunID: "r1", Chunks: append(egressRecords(4, 4), egressRecords(5, 5)...),
		Head: EgressHead{Count: 5, LastHash: "h5", Tally: tally, DroppedSinceLast: 2, Ended: true, Seal: seal}}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err = Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	head, found, err := l.EgressHead("r1")
	if err != nil || !found || head.Count != 5 || head.LastHash != "h5" || head.DroppedSinceLast != 2 || !head.Ended ||
		head.Seal == nil || *head.Seal != *seal || head.Tally.Authorities["a.test:443"].Requests != 1 {
		t.Fatalf("the head after a reopen: %+v %v %v", head, found, err)
	}
	var got []string
	after := int64(0)
	for {
		p, err := l.EgressPage("r1", after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if p.Head.Count != 5 || p.Head.Seal == nil {
			t.Fatalf("a page's head: %+v", p.Head)
		}
		for _, r := range p.Records {
			got = append(got, string(r))
		}
		after = p.NextCursor
		if !p.HasMore {
			break
		}
	}
	if len(got) != 5 {
		t.Fatalf("paged %q, want 5 records", got)
	}
	for i, r := range got {
		if want := fmt.Sprintf(`{"seq":%d,"via":"proxy"}`, i+1); r != want {
			t.Errorf("record %d reads %s, want %s", i+1, r, want)
		}
	}
	for _, c := range []struct {
		after         int64
		n             int
		hasMore, past bool
		nextCursor    int64
	}{
		{0, 2, true, false, 2}, {4, 1, false, false, 5}, {5, 0, false, false, 5}, {6, 0, false, true, 6},
	} {
		p, err := l.EgressPage("r1", c.after, 2)
		if err != nil || len(p.Records) != c.n || p.HasMore != c.hasMore || p.PastEnd != c.past || p.NextCursor != c.nextCursor {
			t.Errorf("after %d: %d records, hasMore %v, pastEnd %v, next %d (%v); want %+v", c.after, len(p.Records), p.HasMore, p.PastEnd, p.NextCursor, err, c)
		}
	}
	p, err := l.EgressPage("quiet", 0, 10)
	if err != nil || len(p.Records) != 0 || p.HasMore || p.PastEnd || p.Head.Count != 0 {
		t.Errorf("a run without a ledger yet: %+v %v", p, err)
	}
	if p, err := l.EgressPage("quiet", 1, 10); err != nil || !p.PastEnd {
		t.Errorf("past the end of an empty ledger: %+v %v", p, err)
	}
	if _, err := l.EgressPage("purged", 0, 10); !errors.Is(err, ErrNotFound) {
		t.Errorf("a page of a run the log does not hold: %v, want ErrNotFound", err)
	}
	if _, found, _ := l.EgressHead("purged"); found {
		t.Error("a skipped run got a head")
	}
}

// A record once written is never replaced and none goes missing: records
// that do not start right after those stored, or that do not end at the
// head's count, fail the write whole, for every run in it.
func TestEgressRecordsAreNeverRewrittenNorMissing(t *testing.T) {
	l, _ := openTemp(t)
	for _, id := range []string{"r1", "r2"} {
		l.Create(Record{RunID: id, ClientToken: "t-" + id})
	}
	if _, err := l.WriteEgress([]EgressWrite{{RunID: "r1", Chunks: egressRecords(1, 2), Head: EgressHead{Count: 2}}}); err != nil {
		t.Fatal(err)
	}
	for name, w := range map[string]EgressWrite{
		"over a stored record": {RunID: "r1", Chunks: []EgressChunk{{First: 2, Data: []byte(`{"seq":2,"via":"altered"}` + "\n")}}, Head: EgressHead{Count: 2}},
		"past a gap":           {RunID: "r1", Chunks: egressRecords(4, 4), Head: EgressHead{Count: 4}},
		"short of the head":    {RunID: "r1", Chunks: egressRecords(3, 3), Head: EgressHead{Count: 5}},
		"a head gone back":     {RunID: "r1", Head: EgressHead{Count: 1}},
		"an empty chunk":       {RunID: "r1", Chunks: []EgressChunk{{First: 3}}, Head: EgressHead{Count: 2}},
	} {
		_, err := l.WriteEgress([]EgressWrite{{RunID: "r2", Chunks: egressRecords(1, 1), Head: EgressHead{Count: 1}}, w})
		if !errors.Is(err, errNotContiguous) {
			t.Errorf("a write %s: %v, want it refused", name, err)
		}
	}
	if p, _ := l.EgressPage("r1", 0, 5); len(p.Records) != 2 || string(p.Records[1]) != `{"seq":2,"via":"proxy"}` || p.Head.Count != 2 {
		t.Errorf("after refused writes: %s, head %+v", p.Records, p.Head)
	}
	if _, found, _ := l.EgressHead("r2"); found {
		t.Error("a refused write stored another run's part")
	}
}

// Records stored in chunks of any size page alike, from any cursor.
func TestEgressPagesAcrossChunks(t *testing.T) {
	l, _ := openTemp(t)
	l.Create(Record{RunID: "r1", ClientToken: "t-r1"})
	var chunks []EgressChunk
	for _, c := range [][2]int64{{1, 1}, {2, 6}, {7, 7}, {8, 20}} {
		chunks = append(chunks, egressRecords(c[0], c[1])...)
	}
	if _, err := l.WriteEgress([]EgressWrite{{RunID: "r1", Chunks: chunks[:2], Head: EgressHead{Count: 6}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.WriteEgress([]EgressWrite{{RunID: "r1", Chunks: chunks[2:], Head: EgressHead{Count: 20}}}); err != nil {
		t.Fatal(err)
	}
	for after := int64(0); after <= 21; after++ {
		for _, limit := range []int{1, 3, 7, 100} {
			p, err := l.EgressPage("r1", after, limit)
			if err != nil {
				t.Fatal(err)
			}
			want := min(int64(limit), max(20-after, 0))
			if int64(len(p.Records)) != want || p.HasMore != (after+want < 20) || p.PastEnd != (after > 20) {
				t.Errorf("after %d limit %d: %d records, hasMore %v, pastEnd %v", after, limit, len(p.Records), p.HasMore, p.PastEnd)
				continue
			}
			for i, r := range p.Records {
				if w := fmt.Sprintf(`{"seq":%d,"via":"proxy"}`, after+int64(i)+1); string(r) != w {
					t.Errorf("after %d limit %d: record %d reads %s, want %s", after, limit, i, r, w)
				}
			}
		}
	}
}

// Deleting a run purges its ledger with it; another run's stays.
func TestDeleteRemovesTheRunsEgress(t *testing.T) {
	l, _ := openTemp(t)
	for _, id := range []string{"r1", "r2"} {
		l.Create(Record{RunID: id, ClientToken: "t-" + id})
	}
	if _, err := l.WriteEgress([]EgressWrite{
		{RunID: "r1", Chunks: egressRecords(1, 3), Head: EgressHead{Count: 3}},
		{RunID: "r2", Chunks: egressRecords(1, 2), Head: EgressHead{Count: 2}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := l.Delete("r1"); err != nil {
		t.Fatal(err)
	}
	if _, found, _ := l.EgressHead("r1"); found {
		t.Error("the deleted run's head remains")
	}
	err := l.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketEgress).Bucket([]byte("r1")) != nil {
			return errors.New("the deleted run's records remain")
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	// Created again under the same id, it starts with no ledger.
	l.Create(Record{RunID: "r1", ClientToken: "t-r1"})
	if p, err := l.EgressPage("r1", 0, 10); err != nil || len(p.Records) != 0 || p.Head.Count != 0 {
		t.Errorf("the deleted run's ledger reads %+v %v", p, err)
	}
	if p, err := l.EgressPage("r2", 0, 10); err != nil || len(p.Records) != 2 {
		t.Errorf("the other run's ledger: %+v %v", p, err)
	}
}
