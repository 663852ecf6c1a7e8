package hostapi

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/ledger"
	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// ledgerOf gives a run n decisions, as the audit's flush hands them to the
// ledger, and seals it as the run's end does.
func (e *edge) ledgerOf(runID string, n int) {
	e.t.Helper()
	var batch []audit.Entry
	ts := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
	for i := range n {
		batch = append(batch, audit.Entry{TS: ts.Add(time.Duration(i) * time.Second), Task: runID, Action: audit.Substituted,
			Keys: []string{"acme/K"}, Host: fmt.Sprintf("api%d.example.test:443", i%2), Method: "GET", Path: fmt.Sprintf("/v1/%d", i),
			Query: "page=*", Status: 200, BytesIn: 1, BytesOut: 10})
	}
	e.ledger.Record(batch)
	if err := e.ledger.Seal(runID); err != nil {
		e.t.Fatal(err)
	}
}

func (e *edge) get(path string) (int, []byte) {
	e.t.Helper()
	req, _ := http.NewRequest("GET", e.srv.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// A run's ledger pages by cursor as its events do: every record once, in
// order, across pages of any size and an edge restart, each page with the
// whole ledger's summary and its seal; what was read verifies with the key
// /healthz reports.
func TestEgressPagesByCursorAndVerifiesWithTheHealthKey(t *testing.T) {
	e := newEdge(t)
	run := e.waitStatus(e.start("true").RunID, ended)
	e.ledgerOf(run.RunID, 25)
	h, err := e.client.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := egress.ParsePublicKey(h.LedgerKey)
	if err != nil {
		t.Fatalf("/healthz ledgerKey %q: %v", h.LedgerKey, err)
	}
	read := func(size int) ([]egress.Record, hostproto.EgressPage) {
		var all []egress.Record
		var last hostproto.EgressPage
		after := int64(0)
		for pages := 0; ; pages++ {
			p, err := e.client.Egress(ctx, run.RunID, after, size)
			if err != nil {
				t.Fatal(err)
			}
			all, last = append(all, p.Records...), p
			if p.NextCursor == nil {
				t.Fatalf("page after %d has no nextCursor", after)
			}
			after = *p.NextCursor
			if !p.HasMore {
				return all, last
			}
			if pages > 100 {
				t.Fatal("paging does not end")
			}
		}
	}
	for _, size := range []int{0, 1, 7, 25, ledger.MaxPage} {
		recs, last := read(size)
		if len(recs) != 25 {
			t.Fatalf("pages of %d: %d records, want 25", size, len(recs))
		}
		for i, r := range recs {
			if r.Seq != int64(i+1) || r.Path != fmt.Sprintf("/v1/%d?page=*", i) || r.Via != egress.ViaProxy || r.Hash == "" {
				t.Fatalf("pages of %d: record %d is %+v", size, i+1, r)
			}
		}
		if v := egress.Verify(run.RunID, recs, last.Seal, pub); !v.OK {
			t.Fatalf("pages of %d: the ledger does not verify with /healthz's key: %+v", size, v)
		}
		s := last.Summary
		if s.Requests != 25 || s.BytesDown != 250 || len(s.Authorities) != 2 || s.Authorities[0].Requests != 13 {
			t.Errorf("summary %+v", s)
		}
	}
	first, err := e.client.Egress(ctx, run.RunID, 0, 10)
	if err != nil || len(first.Records) != 10 || !first.HasMore || *first.NextCursor != 10 {
		t.Fatalf("the first page: %d records, hasMore %v, %v", len(first.Records), first.HasMore, err)
	}
	e.down()
	e.up()
	rest, _ := read(0)
	if len(rest) != 25 {
		t.Fatalf("after a restart: %d records", len(rest))
	}
	for i, r := range first.Records {
		if rest[i].Hash != r.Hash || rest[i].Path != r.Path {
			t.Fatalf("record %d differs across the restart", i+1)
		}
	}
	if v := egress.Verify(run.RunID, rest, first.Seal, pub); !v.OK {
		t.Fatalf("after a restart: %+v", v)
	}
}

// A page at the ledger's last record is empty with nextCursor there, to
// poll from; past it, empty without one. A run with no record yet pages
// empty, unsealed, with an empty summary; an unknown run is the events'
// 404; bad parameters are refused as the events' are.
func TestEgressPagesAtAndPastTheEndAndBadRequests(t *testing.T) {
	e := newEdge(t)
	run := e.waitStatus(e.start("true").RunID, ended)
	quiet := e.waitStatus(e.start("true").RunID, ended)
	e.ledgerOf(run.RunID, 3)
	for _, c := range []struct {
		after int64
		want  string
	}{
		{3, `"records":[],"nextCursor":3,"hasMore":false,"summary":`},
		{4, `"records":[],"hasMore":false,"summary":`},
		{400, `"records":[],"hasMore":false,"summary":`},
	} {
		status, b := e.get(fmt.Sprintf("/runs/%s/egress?after=%d", run.RunID, c.after))
		if status != 200 || !strings.HasPrefix(string(b), "{"+c.want) || !strings.Contains(string(b), `"seal":{"count":3`) {
			t.Errorf("after=%d of 3 records: %d %s, want %s... and the seal", c.after, status, b, c.want)
		}
	}
	status, b := e.get("/runs/" + quiet.RunID + "/egress")
	if want := `{"records":[],"nextCursor":0,"hasMore":false,"summary":{"requests":0,"blocked":0,"warned":0,"bytesUp":0,"bytesDown":0,"alerts":0,"dropped":0,"authorities":[]}}`; status != 200 || strings.TrimSpace(string(b)) != want {
		t.Errorf("a run with no record: %d %s, want %s", status, b, want)
	}

	egressPath := "/runs/" + run.RunID + "/egress"
	const inRange = "want an integer from 1 to 1000"
	for _, tt := range []struct {
		path          string
		status        int
		code, mention string
	}{
		{egressPath + "?after=-1", 400, hostproto.CodeBadRequest, "after"},
		{egressPath + "?after=", 400, hostproto.CodeBadRequest, "after"},
		{egressPath + "?after=1e3", 400, hostproto.CodeBadRequest, "after"},
		{egressPath + "?limit=x", 400, hostproto.CodeBadRequest, `limit: "x": ` + inRange},
		{egressPath + "?limit=0", 400, hostproto.CodeBadRequest, `limit: "0": ` + inRange},
		{egressPath + "?limit=-1", 400, hostproto.CodeBadRequest, `limit: "-1": ` + inRange},
		{egressPath + "?limit=1001", 400, hostproto.CodeBadRequest, `limit: "1001": ` + inRange},
		{egressPath + "?limit=2.5", 400, hostproto.CodeBadRequest, inRange},
		{"/runs/nope/egress", 404, hostproto.CodeRunNotFound, "no such run on this host"},
		{"/runs/nope/egress?after=5&limit=1", 404, hostproto.CodeRunNotFound, "no such run on this host"},
	} {
		status, b := e.get(tt.path)
		var body hostproto.ErrorBody
		json.Unmarshal(b, &body)
		if status != tt.status || body.Code != tt.code || !strings.Contains(body.Error, tt.mention) {
			t.Errorf("GET %s answered %d %s; want %d %s mentioning %q", tt.path, status, b, tt.status, tt.code, tt.mention)
		}
	}
	// The events' own 404, word for word.
	_, events := e.get("/runs/nope/events")
	if _, egress := e.get("/runs/nope/egress"); string(egress) != string(events) {
		t.Errorf("an unknown run's egress answer %s differs from its events' %s", egress, events)
	}
	if p, err := e.client.Egress(ctx, run.RunID, 0, ledger.MaxPage); err != nil || len(p.Records) != 3 {
		t.Errorf("a limit of the maximum: %+v %v", p, err)
	}
}

// A run's records show in its pages once the ledger has stored them,
// which takes no more than a pass after the audit's flush: a reader
// polling sees them arrive in order, unsealed until the run's end.
func TestEgressRecordsArriveWhileTheRunLives(t *testing.T) {
	e := newEdge(t)
	run := e.start("sleep 30")
	defer e.client.Cancel(ctx, run.RunID)
	e.ledger.Record([]audit.Entry{{Task: run.RunID, Action: audit.Forwarded, Host: "a.test:443", Method: "GET", Path: "/live"}})
	var p hostproto.EgressPage
	await.Cond(t, 10*time.Second, "the live run's record", func() bool {
		var err error
		p, err = e.client.Egress(ctx, run.RunID, 0, 0)
		return err == nil && len(p.Records) == 1
	})
	if p.Seal != nil || p.Records[0].Path != "/live" || p.Summary.Requests != 1 {
		t.Errorf("a live run's page: %+v", p)
	}
}
