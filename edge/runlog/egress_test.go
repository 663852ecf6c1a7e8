package runlog

import (
	"errors"
	"fmt"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/runfleet/runfleet/shared/egress"
)

func egressRecords(from, to int64) []EgressRecord {
	var rs []EgressRecord
	for seq := from; seq <= to; seq++ {
		rs = append(rs, EgressRecord{Seq: seq, Data: []byte(fmt.Sprintf(`{"seq":%d,"via":"proxy"}`, seq))})
	}
	return rs
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
		{RunID: "r1", Records: egressRecords(1, 3), Head: EgressHead{Count: 3, LastHash: "h3", Tally: tally}},
		{RunID: "r2", Records: egressRecords(1, 1), Head: EgressHead{Count: 1, LastHash: "x1"}},
		{RunID: "purged", Records: egressRecords(1, 1), Head: EgressHead{Count: 1}},
	})
	if err != nil || len(gone) != 1 || gone[0] != "purged" {
		t.Fatalf("WriteEgress: gone %q, %v; want the unknown run skipped", gone, err)
	}
	if _, err := l.WriteEgress([]EgressWrite{{RunID: "r1", Records: egressRecords(4, 5),
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

// A record once written is never replaced: a write over a stored sequence
// fails whole, for every run in it.
func TestEgressRecordsAreNeverRewritten(t *testing.T) {
	l, _ := openTemp(t)
	for _, id := range []string{"r1", "r2"} {
		l.Create(Record{RunID: id, ClientToken: "t-" + id})
	}
	if _, err := l.WriteEgress([]EgressWrite{{RunID: "r1", Records: egressRecords(1, 2), Head: EgressHead{Count: 2}}}); err != nil {
		t.Fatal(err)
	}
	_, err := l.WriteEgress([]EgressWrite{
		{RunID: "r2", Records: egressRecords(1, 1), Head: EgressHead{Count: 1}},
		{RunID: "r1", Records: []EgressRecord{{Seq: 2, Data: []byte(`{"seq":2,"via":"altered"}`)}}, Head: EgressHead{Count: 2}},
	})
	if !errors.Is(err, errRecordExists) {
		t.Fatalf("a rewrite: %v, want it refused", err)
	}
	if p, _ := l.EgressPage("r1", 1, 5); len(p.Records) != 1 || string(p.Records[0]) != `{"seq":2,"via":"proxy"}` {
		t.Errorf("record 2 reads %s after a refused rewrite", p.Records)
	}
	if _, found, _ := l.EgressHead("r2"); found {
		t.Error("the refused write stored another run's part")
	}
}

// Deleting a run purges its ledger with it; another run's stays.
func TestDeleteRemovesTheRunsEgress(t *testing.T) {
	l, _ := openTemp(t)
	for _, id := range []string{"r1", "r2"} {
		l.Create(Record{RunID: id, ClientToken: "t-" + id})
	}
	if _, err := l.WriteEgress([]EgressWrite{
		{RunID: "r1", Records: egressRecords(1, 3), Head: EgressHead{Count: 3}},
		{RunID: "r2", Records: egressRecords(1, 2), Head: EgressHead{Count: 2}},
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
