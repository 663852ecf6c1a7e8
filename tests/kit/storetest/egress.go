package storetest

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// egressContract is store.Egress' contract.
var egressContract = []contractCase{
	roleCase("Egress/PutList", testEgressPutList),
	roleCase("Egress/Contiguity", testEgressContiguity),
	roleCase("Egress/IdempotentOverlaps", testEgressIdempotentOverlaps),
	roleCase("Egress/ManyRecordsPaged", testEgressManyRecordsPaged),
	roleCase("Egress/LargeRecord", testEgressLargeRecord),
	roleCase("Egress/Expiry", testEgressExpiry),
	roleCase("Egress/ExtendExpiry", testEgressExtendExpiry),
	roleCase("Egress/HeadVersions", testEgressHeadVersions),
	roleCase("Egress/HeadConcurrentPuts", testEgressHeadConcurrent),
	roleCase("Egress/AlertedRuns", testEgressAlertedRuns),
	roleCase("Egress/AlertedBadCursor", testEgressAlertedBadCursor),
}

// LedgerRecords is n records of a run's ledger from seq first on, as edge
// writes them: egress.Record JSON (about 300 bytes: a time, a via, an
// authority, a method, a masked path, a status, bytes each way, a
// duration, a key, an action, the chain's hash in hex), varied as a
// task's traffic is (a few upstreams, many paths), the same for the same
// arguments. The hashes chain from a made-up previous hash when first is
// above 1.
func LedgerRecords(runID string, first int64, n int, at time.Time) []store.EgressRecord {
	rng := rand.New(rand.NewPCG(uint64(first), uint64(len(runID))))
	upstreams := []struct{ authority, key string }{
		{"api.github.com:443", "acme/GITHUB_TOKEN"},
		{"registry.npmjs.org:443", ""},
		{"pypi.org:443", ""},
		{"api.openai.com:443", "acme/OPENAI_API_KEY"},
		{"objects.githubusercontent.com:443", ""},
	}
	paths := []string{
		"/repos/acme/widgets/pulls/%d/files?page=*&per_page=*",
		"/repos/acme/widgets/git/refs/heads/feature-%d",
		"/@types%%2fnode/-/node-20.%d.0.tgz",
		"/simple/requests/?v=%d",
		"/v1/chat/completions",
		"/github-production-release-asset-2e65be/%d?X-Amz-Signature=*&X-Amz-Date=*",
	}
	prev := egress.Genesis(runID)
	if first > 1 {
		prev = [32]byte{byte(first), byte(first >> 8)}
	}
	out := make([]store.EgressRecord, n)
	for i := range n {
		up := upstreams[rng.IntN(len(upstreams))]
		r := egress.Record{
			Seq: first + int64(i), TS: at.Add(time.Duration(i) * 37 * time.Millisecond), Via: egress.ViaProxy,
			Authority: up.authority, Method: []string{"GET", "GET", "GET", "POST", "HEAD"}[rng.IntN(5)],
			Path:    paths[rng.IntN(len(paths))],
			Status:  []int{200, 200, 200, 304, 404, 201}[rng.IntN(6)],
			BytesUp: int64(rng.IntN(4096)), BytesDown: int64(rng.IntN(1 << 20)), DurationUs: int64(rng.IntN(2_000_000)),
			Action: egress.Forwarded,
		}
		if strings.Contains(r.Path, "%") {
			r.Path = fmt.Sprintf(r.Path, rng.IntN(5000))
		}
		if up.key != "" {
			r.Keys, r.Action = []string{up.key}, egress.Substituted
		}
		canonical, err := egress.Canonical(r)
		if err != nil {
			panic(err)
		}
		prev = egress.Next(prev, canonical)
		r.Hash = hex.EncodeToString(prev[:])
		data, err := json.Marshal(r)
		if err != nil {
			panic(err)
		}
		out[i] = store.EgressRecord{Seq: r.Seq, Data: data}
	}
	return out
}

// rawRecords are records from first on with data as given, byte for byte.
func rawRecords(first int64, data ...string) []store.EgressRecord {
	out := make([]store.EgressRecord, len(data))
	for i, d := range data {
		out[i] = store.EgressRecord{Seq: first + int64(i), Data: json.RawMessage(d)}
	}
	return out
}

func egressSeqs(recs []store.EgressRecord) []int64 {
	out := make([]int64, len(recs))
	for i, r := range recs {
		out[i] = r.Seq
	}
	return out
}

// sameRecords fails unless got and want hold the same seqs with the same
// bytes.
func sameRecords(t *testing.T, what string, got, want []store.EgressRecord) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: seqs %v, want %v", what, egressSeqs(got), egressSeqs(want))
	}
	for i := range got {
		if got[i].Seq != want[i].Seq || !bytes.Equal(got[i].Data, want[i].Data) {
			t.Fatalf("%s: record %d is seq %d %q, want seq %d %q", what, i, got[i].Seq, got[i].Data, want[i].Seq, want[i].Data)
		}
	}
}

// wholeLedger reads every record of a run in pages of limit, checking
// that no seq comes twice or out of order and that HasMore tells the
// truth.
func wholeLedger(t *testing.T, s store.Egress, runID string, after int64, limit int) []store.EgressRecord {
	t.Helper()
	var all []store.EgressRecord
	for pages := 0; ; pages++ {
		if pages > 10000 {
			t.Fatal("ListEgress never ends")
		}
		p, err := s.ListEgress(bg, runID, after, limit)
		noErr(t, "ListEgress", err)
		if len(p.Records) > store.PageLimit(limit) {
			t.Fatalf("ListEgress(limit %d) returned %d records", limit, len(p.Records))
		}
		for _, r := range p.Records {
			if r.Seq <= after {
				t.Fatalf("ListEgress(after %d) returned seq %d", after, r.Seq)
			}
			after = r.Seq
		}
		all = append(all, p.Records...)
		if !p.HasMore {
			return all
		}
		if len(p.Records) == 0 {
			t.Fatalf("ListEgress after %d: an empty page with HasMore", after)
		}
	}
}

func testEgressPutList(t *testing.T, s store.Egress, clk *clock.Fake) {
	exp := clk.Now().Add(time.Hour)
	// Data is kept byte for byte: spacing, escapes, HTML characters, UTF-8.
	recs := rawRecords(1,
		`{"seq":1,"path":"/a?q=*"}`,
		`{ "seq" : 2 , "path" : "/b<c>&d" }`,
		`{"seq":3,"path":"/\u00e9t\u00e9","authority":"é.example:443"}`,
		`{"seq":4}`,
		`{"seq":5,"keys":["p/K"]}`,
	)
	noErr(t, "PutEgress 1-2", s.PutEgress(bg, "r1", recs[:2], exp))
	noErr(t, "PutEgress 3-5", s.PutEgress(bg, "r1", recs[2:], exp))
	noErr(t, "PutEgress of another run", s.PutEgress(bg, "r2", rawRecords(1, `{"other":true}`), exp))
	noErr(t, "PutEgress empty", s.PutEgress(bg, "r1", nil, exp))

	type step struct {
		after   int64
		limit   int
		want    []int64
		hasMore bool
	}
	for _, st := range []step{
		{0, 2, []int64{1, 2}, true},
		{2, 2, []int64{3, 4}, true},
		{4, 2, []int64{5}, false},
		{3, 2, []int64{4, 5}, false},
		{5, 2, nil, false},
		{9, 2, nil, false},
		{0, 0, []int64{1, 2, 3, 4, 5}, false},
		{-1, 5, []int64{1, 2, 3, 4, 5}, false},
		{0, 4, []int64{1, 2, 3, 4}, true},
	} {
		p, err := s.ListEgress(bg, "r1", st.after, st.limit)
		noErr(t, "ListEgress", err)
		if fmt.Sprint(egressSeqs(p.Records)) != fmt.Sprint(st.want) || p.HasMore != st.hasMore {
			t.Fatalf("ListEgress(after %d, limit %d) = %v hasMore %v, want %v hasMore %v",
				st.after, st.limit, egressSeqs(p.Records), p.HasMore, st.want, st.hasMore)
		}
	}
	p, err := s.ListEgress(bg, "r1", 0, 10)
	noErr(t, "ListEgress", err)
	sameRecords(t, "records round-trip", p.Records, recs)
	p, err = s.ListEgress(bg, "unknown", 0, 10)
	noErr(t, "ListEgress of an unknown run", err)
	if len(p.Records) != 0 || p.HasMore {
		t.Fatalf("records of an unknown run: %v", egressSeqs(p.Records))
	}
}

// testEgressContiguity: a put whose seqs are not contiguous and ascending
// from 1 or more, or whose data is not JSON, or without a run, is refused
// whole.
func testEgressContiguity(t *testing.T, s store.Egress, clk *clock.Fake) {
	exp := clk.Now().Add(time.Hour)
	for name, recs := range map[string][]store.EgressRecord{
		"a gap":       {{Seq: 1, Data: json.RawMessage(`1`)}, {Seq: 3, Data: json.RawMessage(`3`)}},
		"descending":  {{Seq: 2, Data: json.RawMessage(`2`)}, {Seq: 1, Data: json.RawMessage(`1`)}},
		"a repeat":    {{Seq: 1, Data: json.RawMessage(`1`)}, {Seq: 1, Data: json.RawMessage(`1`)}},
		"seq 0":       {{Seq: 0, Data: json.RawMessage(`0`)}, {Seq: 1, Data: json.RawMessage(`1`)}},
		"not JSON":    {{Seq: 1, Data: json.RawMessage(`1`)}, {Seq: 2, Data: json.RawMessage(`{"seq":`)}},
		"empty data":  {{Seq: 1, Data: nil}},
		"negative":    {{Seq: -1, Data: json.RawMessage(`1`)}},
		"a late hole": {{Seq: 5, Data: json.RawMessage(`5`)}, {Seq: 6, Data: json.RawMessage(`6`)}, {Seq: 8, Data: json.RawMessage(`8`)}},
	} {
		if err := s.PutEgress(bg, "r1", recs, exp); err == nil {
			t.Fatalf("PutEgress with %s succeeded", name)
		}
	}
	if err := s.PutEgress(bg, "", rawRecords(1, `1`), exp); err == nil {
		t.Fatal("PutEgress without a run succeeded")
	}
	p, err := s.ListEgress(bg, "r1", 0, 10)
	noErr(t, "ListEgress", err)
	if len(p.Records) != 0 {
		t.Fatalf("a refused put stored %v", egressSeqs(p.Records))
	}
	// Starting past 1 is fine: a mirror may resume anywhere.
	noErr(t, "PutEgress from 7", s.PutEgress(bg, "r1", rawRecords(7, `7`, `8`), exp))
	p, err = s.ListEgress(bg, "r1", 0, 10)
	noErr(t, "ListEgress", err)
	sameRecords(t, "records from 7", p.Records, rawRecords(7, `7`, `8`))
}

// testEgressIdempotentOverlaps: a put that repeats stored seqs, whatever
// their data, leaves them as they are and stores only the new ones; ranges
// that overlap in either order, or nest, never show a seq twice.
func testEgressIdempotentOverlaps(t *testing.T, s store.Egress, clk *clock.Fake) {
	exp := clk.Now().Add(time.Hour)
	orig := LedgerRecords("r1", 1, 120, clk.Now())
	other := LedgerRecords("rX", 1, 120, clk.Now().Add(time.Hour)) // same seqs, other bytes
	noErr(t, "PutEgress 41-60", s.PutEgress(bg, "r1", orig[40:60], exp))
	noErr(t, "PutEgress 1-50 (overlaps the start of what is stored)", s.PutEgress(bg, "r1", append(append([]store.EgressRecord{}, orig[:40]...), other[40:50]...), exp))
	noErr(t, "PutEgress 55-90 (overlaps the end)", s.PutEgress(bg, "r1", append(append([]store.EgressRecord{}, other[54:60]...), orig[60:90]...), exp))
	noErr(t, "PutEgress 30-100 (covers all)", s.PutEgress(bg, "r1", append(append([]store.EgressRecord{}, other[29:90]...), orig[90:100]...), exp))
	noErr(t, "PutEgress 45-46 (nested)", s.PutEgress(bg, "r1", other[44:46], exp))
	noErr(t, "PutEgress 1-100 again", s.PutEgress(bg, "r1", other[:100], exp))
	noErr(t, "PutEgress 95-120", s.PutEgress(bg, "r1", append(append([]store.EgressRecord{}, other[94:100]...), orig[100:]...), exp))
	for _, limit := range []int{1, 7, 100, 1000} {
		sameRecords(t, fmt.Sprintf("ledger in pages of %d after overlapping puts", limit), wholeLedger(t, s, "r1", 0, limit), orig)
	}
	for _, after := range []int64{39, 45, 59, 99, 119} {
		p, err := s.ListEgress(bg, "r1", after, 10)
		noErr(t, "ListEgress", err)
		sameRecords(t, fmt.Sprintf("page after %d", after), p.Records, orig[after:min(int(after)+10, len(orig))])
	}
}

// testEgressManyRecordsPaged: a long ledger of realistic records, put in
// the batches a mirror makes, reads back whole in pages of every size,
// from any position.
func testEgressManyRecordsPaged(t *testing.T, s store.Egress, clk *clock.Fake) {
	exp := clk.Now().Add(time.Hour)
	const n = 1234
	recs := LedgerRecords("r1", 1, n, clk.Now())
	for start := 0; start < n; {
		end := min(n, start+[]int{100, 37, 250, 1}[start%4])
		noErr(t, "PutEgress", s.PutEgress(bg, "r1", recs[start:end], exp))
		start = end
	}
	for _, limit := range []int{0, 13, 100, store.MaxLimit, store.MaxLimit + 1} {
		sameRecords(t, fmt.Sprintf("ledger in pages of %d", limit), wholeLedger(t, s, "r1", 0, limit), recs)
	}
	for _, after := range []int64{1, 50, 99, 500, 1133, 1233} {
		p, err := s.ListEgress(bg, "r1", after, 0)
		noErr(t, "ListEgress", err)
		end := min(int(after)+store.DefaultLimit, n)
		sameRecords(t, fmt.Sprintf("default page after %d", after), p.Records, recs[after:end])
		if p.HasMore != (end < n) {
			t.Fatalf("page after %d: hasMore %v", after, p.HasMore)
		}
	}
}

// testEgressLargeRecord: a record larger than any batch a store packs
// records into round-trips, between small ones.
func testEgressLargeRecord(t *testing.T, s store.Egress, clk *clock.Fake) {
	// Random bytes: no compression brings it down to a small size.
	noise := make([]byte, 24<<10)
	_, _ = rand.NewChaCha8([32]byte{7}).Read(noise)
	big, err := json.Marshal(map[string]string{"path": "/" + base64.StdEncoding.EncodeToString(noise)})
	noErr(t, "marshal", err)
	recs := rawRecords(1, `{"seq":1}`, string(big), `{"seq":3}`)
	noErr(t, "PutEgress", s.PutEgress(bg, "r1", recs, clk.Now().Add(time.Hour)))
	sameRecords(t, "large record", wholeLedger(t, s, "r1", 0, 2), recs)
}

// testEgressExpiry: records and the head read as absent from their
// ExpiresAt; an expired seq is written afresh by a put, and an expired
// head is replaced by a put at Version 0.
func testEgressExpiry(t *testing.T, s store.Egress, clk *clock.Fake) {
	now := clk.Now()
	exp := store.RoundExpiry(now.Add(time.Hour))
	noErr(t, "PutEgress", s.PutEgress(bg, "r1", rawRecords(1, `1`, `2`, `3`), now.Add(time.Hour)))
	noErr(t, "PutEgress later records", s.PutEgress(bg, "r1", rawRecords(4, `4`), now.Add(3*time.Hour)))
	h, err := s.PutEgressHead(bg, store.EgressHead{FleetRunID: "r1", Cursor: 3, Alerts: 1, FirstAlertAt: now, ExpiresAt: now.Add(time.Hour)})
	noErr(t, "PutEgressHead", err)
	if !h.ExpiresAt.Equal(exp) {
		t.Fatalf("head expiresAt %v, want %v (rounded up to the second)", h.ExpiresAt, exp)
	}
	clk.Set(exp)
	p, err := s.ListEgress(bg, "r1", 0, 10)
	noErr(t, "ListEgress after expiry", err)
	sameRecords(t, "records after 1-3 expired", p.Records, rawRecords(4, `4`))
	p, err = s.ListEgress(bg, "r1", 0, 1)
	noErr(t, "ListEgress after expiry", err)
	if fmt.Sprint(egressSeqs(p.Records)) != "[4]" || p.HasMore {
		t.Fatalf("first page after expiry: %v hasMore %v", egressSeqs(p.Records), p.HasMore)
	}
	_, err = s.GetEgressHead(bg, "r1")
	wantErr(t, "GetEgressHead after expiry", err, store.ErrNotFound)
	page, err := s.ListAlertedRuns(bg, "", 10)
	noErr(t, "ListAlertedRuns", err)
	if len(page.Heads) != 0 {
		t.Fatalf("an expired head is listed as alerted: %+v", page.Heads)
	}
	_, err = s.PutEgressHead(bg, store.EgressHead{FleetRunID: "r1", Version: 1, Cursor: 4})
	wantErr(t, "PutEgressHead at the expired head's version", err, store.ErrConflict)

	// Expired seqs read as absent, so a put writes them afresh.
	fresh := rawRecords(1, `"one"`, `"two"`, `"three"`)
	noErr(t, "PutEgress over expired", s.PutEgress(bg, "r1", fresh, clk.Now().Add(time.Hour)))
	sameRecords(t, "fresh records", wholeLedger(t, s, "r1", 0, 2), append(fresh, rawRecords(4, `4`)...))
	h, err = s.PutEgressHead(bg, store.EgressHead{FleetRunID: "r1", Cursor: 4, ExpiresAt: clk.Now().Add(time.Hour)})
	noErr(t, "PutEgressHead over the expired head", err)
	if h.Version != 1 || !h.FirstAlertAt.IsZero() || h.Alerts != 0 {
		t.Fatalf("the head written over an expired one: %+v; want version 1 and nothing of the old one", h)
	}
}

// testEgressExtendExpiry: records and the head expiring before the target
// move to it; later ones, ones that never expire and expired ones stay as
// they are; another run's are untouched; an earlier target shortens
// nothing.
func testEgressExtendExpiry(t *testing.T, s store.Egress, clk *clock.Fake) {
	now := clk.Now()
	soon, later, target := now.Add(time.Hour), now.Add(10*time.Hour), now.Add(5*time.Hour+time.Millisecond)
	noErr(t, "PutEgress 1", s.PutEgress(bg, "r1", rawRecords(1, `1`), now.Add(time.Minute)))
	noErr(t, "PutEgress 2-3", s.PutEgress(bg, "r1", LedgerRecords("r1", 2, 2, now), soon))
	noErr(t, "PutEgress 4", s.PutEgress(bg, "r1", rawRecords(4, `4`), later))
	noErr(t, "PutEgress 5", s.PutEgress(bg, "r1", rawRecords(5, `5`), time.Time{}))
	noErr(t, "PutEgress 6-7", s.PutEgress(bg, "r1", rawRecords(6, `6`, `7`), soon))
	noErr(t, "PutEgress of r2", s.PutEgress(bg, "r2", rawRecords(1, `1`), soon))
	_, err := s.PutEgressHead(bg, store.EgressHead{FleetRunID: "r1", Cursor: 7, ExpiresAt: soon})
	noErr(t, "PutEgressHead r1", err)
	_, err = s.PutEgressHead(bg, store.EgressHead{FleetRunID: "r2", Cursor: 1, ExpiresAt: soon})
	noErr(t, "PutEgressHead r2", err)
	clk.Advance(2 * time.Minute) // record 1 has expired
	noErr(t, "ExtendEgressExpiry", s.ExtendEgressExpiry(bg, "r1", target))
	noErr(t, "ExtendEgressExpiry to an earlier time", s.ExtendEgressExpiry(bg, "r1", soon.Add(time.Minute)))
	noErr(t, "ExtendEgressExpiry of a run without a ledger", s.ExtendEgressExpiry(bg, "r9", target))

	clk.Set(store.RoundExpiry(soon)) // 2, 3, 6, 7 and the head would have expired
	sameRecords(t, "records after the extension", wholeLedger(t, s, "r1", 0, 100),
		append(append(LedgerRecords("r1", 2, 2, now), rawRecords(4, `4`, `5`)...), rawRecords(6, `6`, `7`)...))
	h, err := s.GetEgressHead(bg, "r1")
	noErr(t, "GetEgressHead r1", err)
	if !h.ExpiresAt.Equal(store.RoundExpiry(target)) {
		t.Fatalf("head expiresAt %v, want %v", h.ExpiresAt, store.RoundExpiry(target))
	}
	_, err = s.GetEgressHead(bg, "r2")
	wantErr(t, "another run's head was extended", err, store.ErrNotFound)
	if p, err := s.ListEgress(bg, "r2", 0, 10); err != nil || len(p.Records) != 0 {
		t.Fatalf("another run's records were extended: %v %v", egressSeqs(p.Records), err)
	}
	clk.Set(store.RoundExpiry(target))
	sameRecords(t, "records past the target", wholeLedger(t, s, "r1", 0, 100), rawRecords(4, `4`, `5`))
}

// testEgressHeadVersions: the head is written at Version 0 and then only
// at its stored Version, each write storing the next; what is stored
// comes back whole, in UTC.
func testEgressHeadVersions(t *testing.T, s store.Egress, clk *clock.Fake) {
	_, err := s.GetEgressHead(bg, "r1")
	wantErr(t, "GetEgressHead before any", err, store.ErrNotFound)
	_, err = s.PutEgressHead(bg, store.EgressHead{FleetRunID: "r1", Version: 3})
	wantErr(t, "PutEgressHead at a version when none is stored", err, store.ErrConflict)

	paris := time.FixedZone("Paris", 3600)
	h := store.EgressHead{
		FleetRunID: "r1", Cursor: 100, Summary: json.RawMessage(`{"requests":100,"blocked":2}`),
		HostID: "h1", UpdatedAt: clk.Now().In(paris), ExpiresAt: clk.Now().Add(time.Hour),
	}
	got, err := s.PutEgressHead(bg, h)
	noErr(t, "PutEgressHead", err)
	want := h
	want.Version, want.UpdatedAt, want.ExpiresAt = 1, clk.Now().UTC(), store.RoundExpiry(h.ExpiresAt)
	sameJSON(t, "head stored", got, want)
	read, err := s.GetEgressHead(bg, "r1")
	noErr(t, "GetEgressHead", err)
	sameJSON(t, "head read", read, want)

	_, err = s.PutEgressHead(bg, h)
	wantErr(t, "PutEgressHead at Version 0 over a stored head", err, store.ErrConflict)

	clk.Advance(time.Minute)
	next := read
	next.Cursor, next.Seal, next.UpdatedAt = 140, json.RawMessage(`{"count":140,"lastHash":"ab"}`), clk.Now()
	next.Summary = json.RawMessage(`{"requests":140}`)
	got, err = s.PutEgressHead(bg, next)
	noErr(t, "PutEgressHead at version 1", err)
	want = next
	want.Version = 2
	sameJSON(t, "head at version 2", got, want)
	_, err = s.PutEgressHead(bg, read)
	wantErr(t, "PutEgressHead at a stale version", err, store.ErrConflict)
	read, err = s.GetEgressHead(bg, "r1")
	noErr(t, "GetEgressHead", err)
	sameJSON(t, "head after a refused write", read, want)

	// A field left empty is cleared.
	cleared := read
	cleared.Seal, cleared.HostID = nil, ""
	got, err = s.PutEgressHead(bg, cleared)
	noErr(t, "PutEgressHead clearing fields", err)
	if got.Seal != nil || got.HostID != "" || got.Version != 3 {
		t.Fatalf("head with fields cleared: %+v", got)
	}
	if _, err := s.GetEgressHead(bg, "r2"); err == nil {
		t.Fatal("another run has a head")
	}
}

// testEgressHeadConcurrent: of writers racing from one version, exactly
// one wins.
func testEgressHeadConcurrent(t *testing.T, s store.Egress, clk *clock.Fake) {
	base, err := s.PutEgressHead(bg, store.EgressHead{FleetRunID: "r1", Cursor: 1, ExpiresAt: clk.Now().Add(time.Hour)})
	noErr(t, "PutEgressHead", err)
	const n = 8
	var wg sync.WaitGroup
	results := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := base
			h.Cursor = int64(10 + i)
			_, err := s.PutEgressHead(bg, h)
			results <- err
		}()
	}
	await.Group(t, "the racing writers", &wg)
	close(results)
	won := 0
	for err := range results {
		switch {
		case err == nil:
			won++
		default:
			wantErr(t, "a losing writer", err, store.ErrConflict)
		}
	}
	if won != 1 {
		t.Fatalf("%d writers won the race from version %d, want 1", won, base.Version)
	}
	h, err := s.GetEgressHead(bg, "r1")
	noErr(t, "GetEgressHead", err)
	if h.Version != base.Version+1 || h.Cursor < 10 {
		t.Fatalf("head after the race: %+v", h)
	}
}

// alertedIDs pages ListAlertedRuns to the end.
func alertedIDs(t *testing.T, s store.Egress, limit int) []string {
	t.Helper()
	var ids []string
	cur := ""
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("ListAlertedRuns never ends")
		}
		p, err := s.ListAlertedRuns(bg, cur, limit)
		noErr(t, "ListAlertedRuns", err)
		if len(p.Heads) > store.PageLimit(limit) {
			t.Fatalf("ListAlertedRuns(limit %d) returned %d heads", limit, len(p.Heads))
		}
		for _, h := range p.Heads {
			ids = append(ids, h.FleetRunID)
		}
		if p.NextCursor == "" {
			return ids
		}
		cur = p.NextCursor
	}
}

// testEgressAlertedRuns: heads with alerts are listed newest first alert
// first (ties by run id, descending), in pages; a head enters the list
// when its alerts rise above zero and keeps its place: FirstAlertAt, once
// stored, never moves (a later put's is ignored; a put that leaves it
// zero stores the store's clock).
func testEgressAlertedRuns(t *testing.T, s store.Egress, clk *clock.Fake) {
	now := clk.Now()
	exp := now.Add(24 * time.Hour)
	put := func(h store.EgressHead) store.EgressHead {
		t.Helper()
		h.ExpiresAt = exp
		got, err := s.PutEgressHead(bg, h)
		noErr(t, "PutEgressHead "+h.FleetRunID, err)
		return got
	}
	sameIDs(t, "no alerted runs", alertedIDs(t, s, 10), nil)
	put(store.EgressHead{FleetRunID: "quiet", Cursor: 10})
	put(store.EgressHead{FleetRunID: "a", Alerts: 1, FirstAlertAt: now.Add(1 * time.Minute)})
	put(store.EgressHead{FleetRunID: "b", Alerts: 2, FirstAlertAt: now.Add(3 * time.Minute)})
	put(store.EgressHead{FleetRunID: "c", Alerts: 1, FirstAlertAt: now.Add(2 * time.Minute)})
	put(store.EgressHead{FleetRunID: "d", Alerts: 1, FirstAlertAt: now.Add(2 * time.Minute)})
	brief := put(store.EgressHead{FleetRunID: "brief", Alerts: 1, FirstAlertAt: now.Add(4 * time.Minute)})
	brief.ExpiresAt = now.Add(time.Minute)
	_, err := s.PutEgressHead(bg, brief)
	noErr(t, "PutEgressHead shortening brief's life", err)
	late := put(store.EgressHead{FleetRunID: "late", Cursor: 5})

	order := []string{"brief", "b", "d", "c", "a"}
	sameIDs(t, "alerted runs", alertedIDs(t, s, 100), order)
	for _, limit := range []int{1, 2, 4} {
		sameIDs(t, fmt.Sprintf("alerted runs in pages of %d", limit), alertedIDs(t, s, limit), order)
	}
	clk.Advance(2 * time.Minute) // brief's head expires (its expiry rounds up to the second)
	order = order[1:]
	sameIDs(t, "alerted runs once brief expired", alertedIDs(t, s, 2), order)

	// A run alerted later, with no time of its own: the store's clock.
	clk.Advance(10 * time.Minute)
	late.Alerts = 1
	late = put(late)
	if !late.FirstAlertAt.Equal(clk.Now()) {
		t.Fatalf("late's firstAlertAt %v, want the store's clock %v", late.FirstAlertAt, clk.Now())
	}
	// Its place, once set, stays: a later put with another time, or none.
	late.Alerts, late.FirstAlertAt = 5, now.Add(-time.Hour)
	late = put(late)
	late.FirstAlertAt = time.Time{}
	late = put(late)
	if !late.FirstAlertAt.Equal(clk.Now()) || late.Version != 4 {
		t.Fatalf("late after more puts: %+v; want firstAlertAt %v at version 4", late, clk.Now())
	}
	order = append([]string{"late"}, order...)
	sameIDs(t, "alerted runs after late's alert", alertedIDs(t, s, 3), order)

	p, err := s.ListAlertedRuns(bg, "", 1)
	noErr(t, "ListAlertedRuns", err)
	sameJSON(t, "the listed head", p.Heads, []store.EgressHead{late})

	// A page's cursor holds its place while heads are added before it.
	p, err = s.ListAlertedRuns(bg, "", 2)
	noErr(t, "ListAlertedRuns", err)
	clk.Advance(time.Minute)
	put(store.EgressHead{FleetRunID: "newest", Alerts: 1})
	p, err = s.ListAlertedRuns(bg, p.NextCursor, 100)
	noErr(t, "ListAlertedRuns second page", err)
	got := []string{}
	for _, h := range p.Heads {
		got = append(got, h.FleetRunID)
	}
	sameIDs(t, "second page after a new alert", got, order[2:])
}

func testEgressAlertedBadCursor(t *testing.T, s store.Egress, clk *clock.Fake) {
	for _, id := range []string{"a", "b", "c"} {
		_, err := s.PutEgressHead(bg, store.EgressHead{FleetRunID: id, Alerts: 1, ExpiresAt: clk.Now().Add(time.Hour)})
		noErr(t, "PutEgressHead", err)
	}
	p, err := s.ListAlertedRuns(bg, "", 1)
	noErr(t, "ListAlertedRuns", err)
	if p.NextCursor == "" {
		t.Fatal("no cursor after a page of 1 of 3")
	}
	b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for name, c := range map[string]string{
		"garbage":            "!!not a cursor!!",
		"base64 of text":     b64("hello"),
		"a runs cursor":      b64(`{"v":1,"k":"runs","s":"all","t":1,"id":"a"}`),
		"a live cursor":      b64(`{"v":1,"k":"live","id":"a"}`),
		"future version":     b64(`{"v":99,"k":"alerted","t":1,"id":"a"}`),
		"without a position": b64(`{"v":1,"k":"alerted"}`),
		"very long":          strings.Repeat("A", 10000),
	} {
		_, err := s.ListAlertedRuns(bg, c, 2)
		wantErr(t, "ListAlertedRuns with "+name, err, store.ErrBadCursor)
	}
}
