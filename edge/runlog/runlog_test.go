package runlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/await"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func openTemp(t *testing.T) (*Log, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "runs.db")
	l, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, path
}

func output(text string) Entry {
	b, _ := json.Marshal(text)
	return Entry{Type: hostproto.EventOutput, Data: b, TS: t0}
}

func TestCreateIsIdempotentOnClientTokenUnderConcurrency(t *testing.T) {
	l, _ := openTemp(t)
	var wg sync.WaitGroup
	created := make(chan Record, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec, isNew, err := l.Create(Record{RunID: fmt.Sprintf("run-%d", i), ClientToken: "tok", Status: hostproto.StatusPending, CreatedAt: t0})
			if err != nil {
				t.Error(err)
				return
			}
			if isNew {
				created <- rec
			}
		}()
	}
	await.Group(t, "the concurrent writers", &wg)
	close(created)
	var winners []Record
	for r := range created {
		winners = append(winners, r)
	}
	if len(winners) != 1 {
		t.Fatalf("%d runs created for one client token, want 1", len(winners))
	}
	got, found, err := l.ByClientToken("tok")
	if err != nil || !found || got.RunID != winners[0].RunID {
		t.Fatalf("ByClientToken = %+v %v %v, want %s", got, found, err, winners[0].RunID)
	}
	if got.Serial != 1 {
		t.Fatalf("serial = %d, want 1", got.Serial)
	}
}

func TestPagingIsExactAndSurvivesReopen(t *testing.T) {
	l, path := openTemp(t)
	if _, _, err := l.Create(Record{RunID: "r1", ClientToken: "t1"}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 25; i++ {
		last, err := l.Append("r1", output(fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		if last != int64(i) {
			t.Fatalf("append %d got sequence %d", i, last)
		}
	}
	read := func(l *Log) []int64 {
		var seqs []int64
		cursor := int64(0)
		for {
			p, err := l.Page("r1", cursor, 10)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range p.Events {
				seqs = append(seqs, e.Sequence)
				var text string
				if err := json.Unmarshal(e.Data, &text); err != nil || text != fmt.Sprint(e.Sequence) {
					t.Fatalf("event %d carries %s", e.Sequence, e.Data)
				}
			}
			if len(p.Events) > 0 && p.NextCursor != p.Events[len(p.Events)-1].Sequence {
				t.Fatalf("nextCursor %d is not the last sequence returned", p.NextCursor)
			}
			cursor = p.NextCursor
			if !p.HasMore {
				return seqs
			}
		}
	}
	first := read(l)
	instance := l.Instance()
	if len(first) != 25 || first[0] != 1 || first[24] != 25 {
		t.Fatalf("paged %v", first)
	}
	p, err := l.Page("r1", 25, 10)
	if err != nil || len(p.Events) != 0 || p.HasMore || p.NextCursor != 25 || p.PastEnd {
		t.Fatalf("page at the end = %+v, %v", p, err)
	}
	p, err = l.Page("r1", 26, 10)
	if err != nil || len(p.Events) != 0 || p.HasMore || !p.PastEnd {
		t.Fatalf("page past the end = %+v, %v", p, err)
	}
	l.Close()

	l2, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if again := read(l2); fmt.Sprint(again) != fmt.Sprint(first) {
		t.Fatalf("after reopen paged %v, want %v", again, first)
	}
	if l2.Instance() != instance {
		t.Fatalf("the instance number changed across a reopen: %d -> %d", instance, l2.Instance())
	}
	if last, err := l2.Append("r1", output("26")); err != nil || last != 26 {
		t.Fatalf("append after reopen got %d, %v; want 26", last, err)
	}
}

func TestUpdateStoresStateAndEventTogether(t *testing.T) {
	l, _ := openTemp(t)
	if _, _, err := l.Create(Record{RunID: "r1", ClientToken: "t1", Status: hostproto.StatusPending}); err != nil {
		t.Fatal(err)
	}
	refuse := errors.New("not now")
	if _, err := l.Update("r1", func(r *Record) error { r.Status = hostproto.StatusRunning; return refuse }, output("x")); !errors.Is(err, refuse) {
		t.Fatalf("update error = %v, want the change's own error", err)
	}
	rec, _ := l.Get("r1")
	p, _ := l.Page("r1", 0, 10)
	if rec.Status != hostproto.StatusPending || len(p.Events) != 0 {
		t.Fatalf("an aborted update left status %q and %d events", rec.Status, len(p.Events))
	}
	if _, err := l.Update("r1", func(r *Record) error { r.Status = hostproto.StatusRunning; return nil }, output("x")); err != nil {
		t.Fatal(err)
	}
	rec, _ = l.Get("r1")
	p, _ = l.Page("r1", 0, 10)
	if rec.Status != hostproto.StatusRunning || len(p.Events) != 1 {
		t.Fatalf("status %q with %d events", rec.Status, len(p.Events))
	}
	if _, err := l.Get("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of an unknown run = %v", err)
	}
	if _, err := l.Page("nope", 0, 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Page of an unknown run = %v", err)
	}
}

func TestDeleteRemovesRunTokenAndEvents(t *testing.T) {
	l, _ := openTemp(t)
	l.Create(Record{RunID: "r1", ClientToken: "t1"}, output("a"))
	if err := l.Delete("r1"); err != nil {
		t.Fatal(err)
	}
	if _, found, _ := l.ByClientToken("t1"); found {
		t.Fatal("token still maps after delete")
	}
	if _, err := l.Page("r1", 0, 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("events remain: %v", err)
	}
	if _, created, err := l.Create(Record{RunID: "r2", ClientToken: "t1"}); err != nil || !created {
		t.Fatalf("the token is not free again: %v %v", created, err)
	}
	if err := l.Delete("r1"); err != nil {
		t.Fatalf("deleting twice: %v", err)
	}
}
