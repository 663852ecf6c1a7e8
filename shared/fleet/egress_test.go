package fleet

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// fleetWith is another Fleet like e.f over st, mirroring a live run's
// ledger once batch records are pending.
func (e *testEnv) fleetWith(t *testing.T, st store.Store, batch int) *Fleet {
	t.Helper()
	f, err := New(Config{Store: st, Credentials: e.f.cfg.Credentials, Logger: e.f.log, Clock: e.clk, EgressBatch: batch})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// call is a ledger record of a request to authority.
func call(authority, action string, keys ...string) egress.Record {
	return egress.Record{Via: egress.ViaProxy, Authority: authority, Method: "GET", Path: "/v1/items?page=*",
		Status: 200, BytesUp: 100, BytesDown: 1000, DurationUs: 2500, Keys: keys, Action: action}
}

// calls is n records of requests to authority.
func calls(n int, authority string) []egress.Record {
	out := make([]egress.Record, n)
	for i := range out {
		out[i] = call(authority, egress.Substituted, "acme/API_KEY")
	}
	return out
}

// mirroredLedger reads a run's whole ledger mirror, past the head's cursor
// too.
func mirroredLedger(t *testing.T, st store.Store, id string) []egress.Record {
	t.Helper()
	p, err := st.ListEgress(context.Background(), id, 0, store.MaxLimit)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]egress.Record, len(p.Records))
	for i, r := range p.Records {
		if out[i], err = egressRecordToWire(r); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// sameLedger fails unless the mirror holds the host's records, byte for
// byte as the host serves them.
func sameLedger(t *testing.T, got, want []egress.Record) {
	t.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Fatalf("mirrored ledger:\n%s\nthe host's:\n%s", g, w)
	}
}

func headOf(t *testing.T, st store.Store, id string) store.EgressHead {
	t.Helper()
	h, err := st.GetEgressHead(context.Background(), id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	return h
}

func sweepWith(t *testing.T, f *Fleet) SweepReport {
	t.Helper()
	rep, err := f.Sweep(context.Background(), SweepOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestEgressIsMirroredInPagesAcrossSweepsAndDrainsOnlyOnceSealed: the
// sweep copies a live run's ledger page by page once a batch is pending,
// leaves fewer on the host, copies what is left at the end however few,
// and drains the run only once the host's seal covers the mirror.
func TestEgressIsMirroredInPagesAcrossSweepsAndDrainsOnlyOnceSealed(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{MaxEgressPage: 2})
	f := e.fleetWith(t, e.st, 3)
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	host.SetRun(run.ChildRunID, hostproto.StatusRunning, nil, "")
	host.AddEgress(run.ChildRunID, calls(5, "api.example.com:443")...)

	if rep := sweepWith(t, f); rep.Egress != 5 || rep.Current != 1 {
		t.Fatalf("first sweep = %+v, want 5 records in pages of 2", rep)
	}
	onHost, _ := host.Egress(run.ChildRunID)
	sameLedger(t, mirroredLedger(t, e.st, run.FleetRunID), onHost)
	head := headOf(t, e.st, run.FleetRunID)
	if head.Cursor != 5 || head.Seal != nil || head.HostID != "h1" || head.Alerts != 0 {
		t.Fatalf("head after the first sweep: %+v", head)
	}

	host.AddEgress(run.ChildRunID, calls(2, "api.example.com:443")...)
	if rep := sweepWith(t, f); rep.Egress != 0 || headOf(t, e.st, run.FleetRunID).Version != head.Version {
		t.Fatalf("with 2 pending, under the batch of 3: %+v; the head moved", rep)
	}
	host.AddEgress(run.ChildRunID, call("git.example.com:443", egress.Blocked))
	if rep := sweepWith(t, f); rep.Egress != 3 || headOf(t, e.st, run.FleetRunID).Cursor != 8 {
		t.Fatalf("with a batch pending: %+v", rep)
	}

	// The run ends; its host seals late: everything is mirrored, the run
	// waits for the seal.
	host.HoldSeals(true)
	host.AddEgress(run.ChildRunID, call("api.example.com:443", egress.Forwarded))
	host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, new(int), "")
	if rep := sweepWith(t, f); rep.Egress != 1 || rep.Drained != 0 {
		t.Fatalf("at the end, unsealed: %+v, want the last record and no drain", rep)
	}
	if r, _ := e.st.GetRun(ctx, run.FleetRunID); !r.Live() || r.Status != hostproto.StatusSucceeded {
		t.Fatalf("drained before its ledger was sealed: %+v", r)
	}
	host.SealEgress(run.ChildRunID)
	if rep := sweepWith(t, f); rep.Drained != 1 || rep.Egress != 0 {
		t.Fatalf("once sealed: %+v", rep)
	}
	head = headOf(t, e.st, run.FleetRunID)
	var seal egress.Seal
	if err := json.Unmarshal(head.Seal, &seal); err != nil || seal.Count != 9 || head.Cursor != 9 {
		t.Fatalf("final head %+v (seal %s, %v)", head, head.Seal, err)
	}
	onHost, _ = host.Egress(run.ChildRunID)
	sameLedger(t, mirroredLedger(t, e.st, run.FleetRunID), onHost)
	page, err := f.Egress(ctx, caller("alice"), run.FleetRunID, 0, 0, true)
	if err != nil || !page.Verification.OK || page.Verification.Records != 9 || page.Live || len(page.Records) != 9 {
		t.Fatalf("verification of the drained run: %+v, %v", page.Verification, err)
	}
}

// headFails is a store whose head writes fail while fail is set.
type headFails struct {
	store.Store
	fail atomic.Bool
}

func (s *headFails) PutEgressHead(ctx context.Context, h store.EgressHead) (store.EgressHead, error) {
	if s.fail.Load() {
		return store.EgressHead{}, errors.New("injected: the head's write failed")
	}
	return s.Store.PutEgressHead(ctx, h)
}

// TestEgressRecordsAreReadOnlyUpToTheHead: records are written before the
// head that covers them, so a sync cut short between the two shows none
// of them; the next sync writes the head and they show.
func TestEgressRecordsAreReadOnlyUpToTheHead(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	st := &headFails{Store: e.st}
	f := e.fleetWith(t, st, 1)
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	host.AddEgress(run.ChildRunID, calls(4, "api.example.com:443")...)

	st.fail.Store(true)
	if rep := sweepWith(t, f); rep.Failed != 1 {
		t.Fatalf("sweep with the head failing = %+v", rep)
	}
	if got := mirroredLedger(t, e.st, run.FleetRunID); len(got) != 4 {
		t.Fatalf("records stored before the head: %d, want 4", len(got))
	}
	page, err := f.Egress(ctx, caller("alice"), run.FleetRunID, 0, 0, false)
	if err != nil || len(page.Records) != 0 || page.Summary != nil || page.NextCursor != 0 || page.PastEnd {
		t.Fatalf("a reader before the head: %+v, %v; want nothing", page, err)
	}
	st.fail.Store(false)
	sweepWith(t, f)
	if page, err = f.Egress(ctx, caller("alice"), run.FleetRunID, 0, 0, false); err != nil || len(page.Records) != 4 || page.Summary.Requests != 4 {
		t.Fatalf("after the head: %+v, %v", page, err)
	}
}

// egressWrites counts a store's ledger writes, and its head reads.
type egressWrites struct {
	store.Store
	records, puts, heads, headReads atomic.Int64
}

func (s *egressWrites) GetEgressHead(ctx context.Context, id string) (store.EgressHead, error) {
	s.headReads.Add(1)
	return s.Store.GetEgressHead(ctx, id)
}

func (s *egressWrites) PutEgress(ctx context.Context, id string, recs []store.EgressRecord, expires time.Time) error {
	s.puts.Add(1)
	s.records.Add(int64(len(recs)))
	return s.Store.PutEgress(ctx, id, recs, expires)
}

func (s *egressWrites) PutEgressHead(ctx context.Context, h store.EgressHead) (store.EgressHead, error) {
	s.heads.Add(1)
	return s.Store.PutEgressHead(ctx, h)
}

// TestEgressBatchingWritesNothingUntilABatchIsPending: an unwatched live
// run's ledger costs no write until DefaultEgressBatch records are
// pending, and no read of the store either (not even a cold start's); then one
// write of them and one of the head; its end flushes the rest. SyncRun (a
// stream without egress) leaves a live run's ledger alone; SyncRunEgress
// (a stream with it) copies every poll.
func TestEgressBatchingWritesNothingUntilABatchIsPending(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	st := &egressWrites{Store: e.st}
	f := e.fleetOver(t, st)
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	host.AddEgress(run.ChildRunID, calls(DefaultEgressBatch-1, "api.example.com:443")...)

	for range 3 {
		sweepWith(t, f)
	}
	if _, err := f.SyncRun(ctx, run.FleetRunID); err != nil {
		t.Fatal(err)
	}
	if st.puts.Load()+st.heads.Load() != 0 || st.headReads.Load() != 0 {
		t.Fatalf("%d record writes, %d head writes and %d head reads with %d records pending over 3 sweeps; want none",
			st.puts.Load(), st.heads.Load(), st.headReads.Load(), DefaultEgressBatch-1)
	}
	if got, err := f.Run(ctx, caller("alice"), run.FleetRunID); err != nil || got.Egress != nil {
		t.Fatalf("GET before any mirror: egress %+v, %v", got.Egress, err)
	}

	host.AddEgress(run.ChildRunID, call("api.example.com:443", egress.Substituted, "acme/API_KEY"))
	if rep := sweepWith(t, f); rep.Egress != DefaultEgressBatch || st.puts.Load() != 1 || st.heads.Load() != 1 {
		t.Fatalf("a batch pending: %+v, %d record writes, %d head writes", rep, st.puts.Load(), st.heads.Load())
	}

	// Watched: every poll copies, however few.
	host.AddEgress(run.ChildRunID, call("api.example.com:443", egress.Forwarded))
	if _, err := f.SyncRunEgress(ctx, run.FleetRunID); err != nil || st.records.Load() != DefaultEgressBatch+1 {
		t.Fatalf("a watched poll: %d records written, %v", st.records.Load(), err)
	}

	host.AddEgress(run.ChildRunID, calls(2, "api.example.com:443")...)
	host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, new(int), "")
	if rep := sweepWith(t, f); rep.Egress != 2 || rep.Drained != 1 || st.heads.Load() != 3 {
		t.Fatalf("at the end: %+v, %d head writes", rep, st.heads.Load())
	}
}

// egressTamper rewrites what a store's ListEgress returns for one run: a
// record altered, or dropped, in the store after Fleet mirrored it.
type egressTamper struct {
	store.Store
	run    string
	change func([]store.EgressRecord) []store.EgressRecord
}

func (s *egressTamper) ListEgress(ctx context.Context, id string, after int64, limit int) (store.EgressPage, error) {
	p, err := s.Store.ListEgress(ctx, id, after, limit)
	if err == nil && id == s.run {
		p.Records = s.change(p.Records)
	}
	return p, err
}

// hostGone is a store in which every host is gone.
type hostGone struct{ store.Store }

func (hostGone) GetHost(context.Context, string) (store.Host, error) {
	return store.Host{}, fmt.Errorf("injected: %w", store.ErrNotFound)
}

// TestEgressVerificationNamesWhatFails: an untouched ledger verifies with
// the key the probe recorded; one field of one record altered in the
// store or on the host, a record dropped, a seal by another key, a host
// whose key is unknown, and a ledger not sealed yet each fail, naming the
// record, or the seal.
func TestEgressVerificationNamesWhatFails(t *testing.T) {
	otherKey := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
	for _, c := range []struct {
		name string
		// onHost changes the host before the run ends; wrap, the store
		// the verifying Fleet reads.
		onHost    func(h *fakehost.Host, runID string)
		wrap      func(st store.Store, id string) store.Store
		live      bool
		ok        bool
		failedSeq int64
		problem   string
	}{
		{name: "untouched", ok: true},
		{name: "a field altered in the store", failedSeq: 3, problem: "record 3 does not match its hash",
			wrap: func(st store.Store, id string) store.Store {
				return &egressTamper{Store: st, run: id, change: func(recs []store.EgressRecord) []store.EgressRecord {
					for i, r := range recs {
						if r.Seq == 3 {
							recs[i].Data = []byte(strings.Replace(string(r.Data), `"bytesUp":100`, `"bytesUp":101`, 1))
						}
					}
					return recs
				}}
			}},
		{name: "a record dropped in the store", failedSeq: 3, problem: "record 3 is missing",
			wrap: func(st store.Store, id string) store.Store {
				return &egressTamper{Store: st, run: id, change: func(recs []store.EgressRecord) []store.EgressRecord {
					out := recs[:0]
					for _, r := range recs {
						if r.Seq != 3 {
							out = append(out, r)
						}
					}
					return out
				}}
			}},
		{name: "a field altered on the host", failedSeq: 2, problem: "record 2 does not match its hash",
			onHost: func(h *fakehost.Host, runID string) {
				h.AlterEgress(runID, 2, func(r *egress.Record) { r.Authority = "elsewhere.example.com:443" })
			}},
		{name: "a record dropped on the host", failedSeq: 4, problem: "record 4 is missing",
			onHost: func(h *fakehost.Host, runID string) { h.DropEgress(runID, 4) }},
		{name: "sealed by another host's key", problem: "signature does not verify with the host's ledger key (it names another key)",
			onHost: func(h *fakehost.Host, _ string) { h.SignLedgersWith(otherKey) }},
		{name: "the host's key unknown", problem: "no ledger key is known",
			wrap: func(st store.Store, _ string) store.Store { return hostGone{st} }},
		{name: "not sealed yet", live: true, problem: "not sealed yet"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newTestEnv(t, 10*time.Second)
			host := e.addHost(t, "h1", fakehost.Config{})
			ctx := context.Background()
			run := dispatched(t, e, "alice")
			host.AddEgress(run.ChildRunID, calls(5, "api.example.com:443")...)
			if c.onHost != nil {
				c.onHost(host, run.ChildRunID)
			}
			if !c.live {
				host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, new(int), "")
			}
			if _, err := e.f.SyncRunEgress(ctx, run.FleetRunID); err != nil {
				t.Fatal(err)
			}
			f := e.f
			if c.wrap != nil {
				f = e.fleetOver(t, c.wrap(e.st, run.FleetRunID))
			}
			page, err := f.Egress(ctx, caller("alice"), run.FleetRunID, 0, 0, true)
			if err != nil {
				t.Fatal(err)
			}
			v := page.Verification
			if v.OK != c.ok || v.FailedSeq != c.failedSeq || !strings.Contains(v.Problem, c.problem) || v.HostID != "h1" {
				t.Fatalf("verification %+v; want ok %v, failedSeq %d, a problem saying %q", v, c.ok, c.failedSeq, c.problem)
			}
			if wantKey := host.LedgerKey(); c.problem != "no ledger key is known" && v.LedgerKey != wantKey {
				t.Errorf("verified with %q, want the probe's %q", v.LedgerKey, wantKey)
			}
		})
	}
}

// TestEgressOfAHostWithoutLedgersNeverWedgesTheDrain: a host older than
// ledgers (no route), and one that answers the route run_not_found, let
// their runs drain; Fleet then shows no ledger and says so on verify.
func TestEgressOfAHostWithoutLedgersNeverWedgesTheDrain(t *testing.T) {
	for _, c := range []struct {
		name  string
		route func(h *fakehost.Host)
	}{
		{"no ledger route", nil},
		{"the route answers run_not_found", func(h *fakehost.Host) {
			h.Handle("GET /runs/{id}/egress", func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
				json.NewEncoder(w).Encode(hostproto.ErrorBody{Error: "no such run", Code: hostproto.CodeRunNotFound})
			})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newTestEnv(t, 10*time.Second)
			host := e.addHost(t, "h1", fakehost.Config{NoLedger: true})
			if c.route != nil {
				c.route(host)
			}
			ctx := context.Background()
			run := dispatched(t, e, "alice")
			host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, new(int), "")
			if rep := sweepOnce(t, e); rep.Drained != 1 || rep.Failed != 0 {
				t.Fatalf("sweep = %+v", rep)
			}
			if host.Requests()["GET /runs/{id}/egress"] == 0 && c.route != nil {
				t.Fatal("the ledger was never asked for")
			}
			page, err := e.f.Egress(ctx, caller("alice"), run.FleetRunID, 0, 0, true)
			if err != nil || page.Summary != nil || page.Seal != nil || len(page.Records) != 0 || page.Verification.Problem != problemNoLedger {
				t.Fatalf("egress = %+v (%+v), %v", page, page.Verification, err)
			}
			if st, err := e.f.Run(ctx, caller("alice"), run.FleetRunID); err != nil || st.Egress != nil {
				t.Fatalf("GET: egress %+v, %v", st.Egress, err)
			}
		})
	}
}

// TestEgressUnsealedLedgerDrainsAfterTheGrace: a host that never seals an
// ended run's ledger holds the run live for EgressSealGrace, no longer;
// verification then says the ledger is not sealed.
func TestEgressUnsealedLedgerDrainsAfterTheGrace(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	host.HoldSeals(true)
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	host.AddEgress(run.ChildRunID, calls(2, "api.example.com:443")...)
	host.SetRun(run.ChildRunID, hostproto.StatusFailed, new(int), "")
	if rep := sweepOnce(t, e); rep.Drained != 0 || rep.Egress != 2 {
		t.Fatalf("at the end = %+v", rep)
	}
	e.clk.Advance(EgressSealGrace - time.Second)
	if rep := sweepOnce(t, e); rep.Drained != 0 {
		t.Fatalf("within the grace = %+v", rep)
	}
	e.clk.Advance(time.Second)
	if rep := sweepOnce(t, e); rep.Drained != 1 {
		t.Fatalf("past the grace = %+v", rep)
	}
	page, err := e.f.Egress(ctx, caller("alice"), run.FleetRunID, 0, 0, true)
	if err != nil || page.Verification.OK || page.Verification.Sealed || !strings.Contains(page.Verification.Problem, "not sealed") || page.Live {
		t.Fatalf("verification %+v, %v", page.Verification, err)
	}
}

// TestEgressSummaryOnGetAndTheRunsScope: GET shows the ledger's summary;
// the ledger is read with the run's own scope: another owner gets the
// 404 GET gives, a caller without the run's host the 403, an admin the
// ledger.
func TestEgressSummaryOnGetAndTheRunsScope(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	foreign := call("api.example.com:443", egress.Blocked, "acme/API_KEY")
	foreign.Reason, foreign.Alert = "foreign_placeholder", egress.AlertForeignPlaceholder
	host.AddEgress(run.ChildRunID, call("api.example.com:443", egress.Substituted, "acme/API_KEY"),
		call("git.example.com:443", egress.Warned, "acme/GIT"), foreign)
	if _, err := e.f.SyncRunEgress(ctx, run.FleetRunID); err != nil {
		t.Fatal(err)
	}
	st, err := e.f.Run(ctx, caller("alice"), run.FleetRunID)
	if err != nil || st.Egress == nil {
		t.Fatalf("GET = %+v, %v", st, err)
	}
	got, _ := json.Marshal(st.Egress)
	const want = `{"requests":3,"blocked":1,"warned":1,"bytesUp":300,"bytesDown":3000,"alerts":1,"dropped":0,` +
		`"authorities":[{"authority":"api.example.com:443","requests":2,"blocked":1,"keys":["acme/API_KEY"]},` +
		`{"authority":"git.example.com:443","requests":1,"blocked":0,"keys":["acme/GIT"]}]}`
	if string(got) != want {
		t.Fatalf("summary\n got  %s\n want %s", got, want)
	}

	_, getErr := e.f.Run(ctx, caller("bob"), run.FleetRunID)
	_, egressErr := e.f.Egress(ctx, caller("bob"), run.FleetRunID, 0, 0, true)
	if !isKind(getErr, KindNotFound) || !isKind(egressErr, KindNotFound) || getErr.Error() != egressErr.Error() {
		t.Fatalf("another owner: GET %v, egress %v; want the same 404", getErr, egressErr)
	}
	if _, err := e.f.Egress(ctx, caller("alice", "h2"), run.FleetRunID, 0, 0, false); !isKind(err, KindForbidden) {
		t.Fatalf("without the run's host: %v, want 403", err)
	}
	if page, err := e.f.Egress(ctx, store.Caller{OwnerID: "admin", Admin: true}, run.FleetRunID, 0, 2, false); err != nil ||
		len(page.Records) != 2 || !page.HasMore || page.NextCursor != 2 {
		t.Fatalf("admin's first page = %+v, %v", page, err)
	}
	if page, err := e.f.Egress(ctx, caller("alice"), run.FleetRunID, 7, 0, false); err != nil || !page.PastEnd || len(page.Records) != 0 {
		t.Fatalf("past the end = %+v, %v", page, err)
	}
}

// TestAlertedRunsListsRunsWithAlertsLatestFirst: only runs whose ledgers
// hold alerts are listed, the latest first alert first, in pages.
func TestAlertedRunsListsRunsWithAlertsLatestFirst(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	alerted := func(kind string) egress.Record {
		r := call("api.example.com:443", egress.Blocked, "acme/API_KEY")
		r.Reason, r.Alert = kind, kind
		return r
	}
	first, quiet, second := dispatched(t, e, "alice"), dispatched(t, e, "bob"), dispatched(t, e, "carol")
	host.AddEgress(first.ChildRunID, alerted(egress.AlertRealValue))
	host.AddEgress(quiet.ChildRunID, call("api.example.com:443", egress.Substituted))
	if _, err := e.f.SyncRunEgress(ctx, first.FleetRunID); err != nil {
		t.Fatal(err)
	}
	e.f.SyncRunEgress(ctx, quiet.FleetRunID)
	e.clk.Advance(time.Minute)
	host.AddEgress(second.ChildRunID, call("api.example.com:443", egress.Substituted), alerted(egress.AlertUngrantedDomain))
	e.f.SyncRunEgress(ctx, second.FleetRunID)
	// A later alert of the first run keeps its place.
	host.AddEgress(first.ChildRunID, alerted(egress.AlertForeignPlaceholder))
	e.f.SyncRunEgress(ctx, first.FleetRunID)

	var got []string
	cursor := ""
	for range 3 {
		page, err := e.f.AlertedRuns(ctx, cursor, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Runs {
			got = append(got, fmt.Sprintf("%s:%d", r.Run.OwnerID, r.Egress.Alerts))
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if fmt.Sprint(got) != "[carol:1 alice:2]" {
		t.Fatalf("alerted runs %v, want carol's then alice's", got)
	}
	if _, err := e.f.AlertedRuns(ctx, "not-a-cursor", 10); !isKind(err, KindInvalid) {
		t.Fatalf("a bad cursor: %v", err)
	}
}

// TestTheProbeRecordsTheLedgerKeyAndKeepsItWhileTheHostIsDown: the key
// the host reports is recorded, and a probe that gets no answer keeps it,
// so a ledger still verifies while its host is down.
func TestTheProbeRecordsTheLedgerKeyAndKeepsItWhileTheHostIsDown(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	h, _ := e.st.GetHost(ctx, "h1")
	if h.Probe.LedgerKey == "" || h.Probe.LedgerKey != host.LedgerKey() {
		t.Fatalf("recorded key %q, the host's %q", h.Probe.LedgerKey, host.LedgerKey())
	}
	if _, err := egress.ParsePublicKey(h.Probe.LedgerKey); err != nil {
		t.Fatal(err)
	}
	host.FailHealth(http.StatusInternalServerError)
	if p, err := e.f.ProbeHost(ctx, "h1"); err != nil || p.Status != store.ProbeBadResponse || p.LedgerKey != host.LedgerKey() {
		t.Fatalf("a failed probe: %+v, %v; want the key kept", p, err)
	}
	host.Close()
	if p, err := e.f.ProbeHost(ctx, "h1"); err != nil || p.Status != store.ProbeUnreachable || p.LedgerKey != host.LedgerKey() {
		t.Fatalf("an unreachable host: %+v, %v; want the key kept", p, err)
	}
}

// TestALongRunsLedgerOutlivesIt: a run live for 8 days has its ledger
// extended with its events, so at its end every record (mirrored on day
// 0) is still there a second before the run expires, and verifies.
func TestALongRunsLedgerOutlivesIt(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	f := e.fleetWith(t, e.st, 1)
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	host.AddEgress(run.ChildRunID, calls(3, "api.example.com:443")...)
	sweepWith(t, f)

	e.clk.Advance(8 * day)
	host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, new(int), "")
	if rep := sweepWith(t, f); rep.Drained != 1 || rep.Extended != 1 {
		t.Fatalf("sweep = %+v", rep)
	}
	ended, _ := e.st.GetRun(ctx, run.FleetRunID)
	e.clk.Set(ended.ExpiresAt.Add(-time.Second))
	page, err := f.Egress(ctx, caller("alice"), run.FleetRunID, 0, 0, true)
	if err != nil || len(page.Records) != 3 || !page.Verification.OK {
		t.Fatalf("a second before the run expires: %d records, %+v, %v", len(page.Records), page.Verification, err)
	}
}

// TestEgressRecordsKeepTheHostsBytes: a mirrored record reads back as the
// very record the host chained (its canonical form rehashes to its hash),
// whatever it holds.
func TestEgressRecordsKeepTheHostsBytes(t *testing.T) {
	r := egress.Record{Seq: 7, TS: time.Date(2026, 5, 4, 3, 2, 1, 123456789, time.FixedZone("x", 3600)), Via: egress.ViaSSH,
		Authority: "github.com:22", Method: "exec", Command: "git-receive-pack 'acme/app.git'", Path: "/a?b=*&c=*<>",
		Status: 403, BytesUp: 1, BytesDown: 2, DurationUs: 3, Keys: []string{"acme/GIT_SSH"}, Action: egress.Denied,
		Reason: "rule", Rule: "projects.acme.keys.GIT_SSH.rules[0]", Alert: egress.AlertUngrantedDomain, Dropped: 0}
	canonical, _ := egress.Canonical(r)
	sum := sha256.Sum256(canonical)
	r.Hash = fmt.Sprintf("%x", sum)
	stored, err := egressRecordFromWire(r)
	if err != nil {
		t.Fatal(err)
	}
	back, err := egressRecordToWire(stored)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := egress.Canonical(back)
	if string(again) != string(canonical) || back.Hash != r.Hash || stored.Seq != 7 {
		t.Fatalf("read back\n%s\nwritten\n%s", again, canonical)
	}
}

// TestTheSweepsCursorHintNeverSkipsOrRewritesRecords: the sweep's
// remembered cursor falls behind when another mirror (a stream with
// egress, another process) moves the head; the sweep then reads the head
// and asks the host again from there: nothing rewritten, nothing skipped.
func TestTheSweepsCursorHintNeverSkipsOrRewritesRecords(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	st := &egressWrites{Store: e.st}
	sweeper, streamer := e.fleetWith(t, st, 3), e.fleetWith(t, e.st, 3)
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	host.AddEgress(run.ChildRunID, calls(2, "api.example.com:443")...)
	sweepWith(t, sweeper) // remembers cursor 0: two pending, under the batch
	if _, err := streamer.SyncRunEgress(ctx, run.FleetRunID); err != nil {
		t.Fatal(err)
	}
	host.AddEgress(run.ChildRunID, calls(2, "api.example.com:443")...)
	if rep := sweepWith(t, sweeper); rep.Egress != 0 || st.records.Load() != 0 || headOf(t, e.st, run.FleetRunID).Cursor != 2 {
		t.Fatalf("behind the stream's mirror: %+v, %d records written", rep, st.records.Load())
	}
	host.AddEgress(run.ChildRunID, call("api.example.com:443", egress.Forwarded))
	if rep := sweepWith(t, sweeper); rep.Egress != 3 || st.records.Load() != 3 || headOf(t, e.st, run.FleetRunID).Cursor != 5 {
		t.Fatalf("a batch past the stream's mirror: %+v, %d records written", rep, st.records.Load())
	}
	onHost, _ := host.Egress(run.ChildRunID)
	sameLedger(t, mirroredLedger(t, e.st, run.FleetRunID), onHost)
}

// TestAnEgressPageStaysInsideALambdaAnswer: a task chooses what fills its
// records (a path of 2 KiB of characters JSON writes as six bytes each), so
// a page of the largest limit stops short of it, hasMore, well inside
// Lambda's 6 MB answer, and the pages still reassemble the whole ledger.
func TestAnEgressPageStaysInsideALambdaAnswer(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	records := calls(MaxEgressLimit, "api.example.com:443")
	for i := range records {
		records[i].Path = "/" + strings.Repeat("<", 2047)
	}
	host.AddEgress(run.ChildRunID, records...)
	host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, new(int), "")
	if _, err := e.f.SyncRunEgress(ctx, run.FleetRunID); err != nil {
		t.Fatal(err)
	}
	var seen int64
	for after, pages := int64(0), 0; ; pages++ {
		page, err := e.f.Egress(ctx, caller("alice"), run.FleetRunID, after, MaxEgressLimit, false)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(page.Records)
		if len(b) > 5<<20 || len(page.Records) == 0 {
			t.Fatalf("page %d: %d records in %d bytes", pages, len(page.Records), len(b))
		}
		for _, r := range page.Records {
			if r.Seq != seen+1 {
				t.Fatalf("record %d after %d", r.Seq, seen)
			}
			seen = r.Seq
		}
		after = page.NextCursor
		if !page.HasMore {
			if pages == 0 {
				t.Fatal("one page held every record")
			}
			break
		}
	}
	if seen != MaxEgressLimit {
		t.Fatalf("the pages held %d records of %d", seen, MaxEgressLimit)
	}
}
