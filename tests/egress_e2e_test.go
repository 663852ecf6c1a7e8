package tests

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/infra/localstack/demo"
	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/ssetest"
)

// Issue 31 end to end: a run's egress ledger written by a real edge (its
// proxy, its tasks' DNS, its tripwire and request rules, tasks run as
// nobody) and read through Fleet (the sweep's mirror, the egress route,
// its verification, the run's summary, the alerts listing, the stream),
// on both stores. tests/egress_test.go covers Fleet's side against a fake
// host, edge/host/ledger_test.go edge's side without Fleet.

// egressStory is an edge and Fleet around it, as the end-to-end tests
// build them, with alice, a caller who may use the edge and the demo
// project.
type egressStory struct {
	e      *e2eEdge
	f      *e2eFleet
	caller string
}

// newEgressStory opens the demo edge, its edge.json as change leaves it,
// and registers it with a Fleet on kind.
func newEgressStory(t *testing.T, kind string, change func(*config.Config)) *egressStory {
	t.Helper()
	e := newE2EEdge(t)
	e.openWith(false, change)
	f := newE2EFleetOn(t, kind)
	f.register(t, e)
	caller := f.call(t, http.StatusCreated, "POST", "/fleet/callers", adminToken,
		`{"ownerId":"alice","allowedHosts":["edge-1"],"allowedProjects":["demo"]}`).str("token")
	return &egressStory{e: e, f: f, caller: caller}
}

// run dispatches prompt to the shell agent with the demo key and sweeps,
// as the schedule would, until Fleet has drained the run: its events and
// its ledger mirrored to the sealed end. It returns Fleet's run id and
// the host's.
func (s *egressStory) run(t *testing.T, prompt string) (id, child string) {
	t.Helper()
	d := s.f.call(t, http.StatusCreated, "POST", "/fleet/runs", s.caller, demo.DispatchBody(s.e.upstream, demo.ShellAgent, prompt))
	id, child = d.str("fleetRunId"), d.str("childRunId")
	await.Cond(t, 30*time.Second, "Fleet to drain the run and its ledger", func() bool {
		s.f.sweep(t)
		return !s.page(t, id, "?limit=1").Live
	})
	if r := s.f.run(t, s.caller, id); r["status"] != "succeeded" {
		t.Fatalf("the run: %v; its output:\n%s", r, outputOf(s.e.events(child)))
	}
	return id, child
}

// page is one page of run id's ledger through Fleet, as alice reads it.
func (s *egressStory) page(t *testing.T, id, query string) fleetapi.EgressPage {
	t.Helper()
	var p fleetapi.EgressPage
	decodeAnswer(t, s.f.call(t, http.StatusOK, "GET", "/fleet/runs/"+id+"/egress"+query, s.caller, ""), &p)
	return p
}

// ledger is run id's whole ledger through Fleet, read by pages of limit
// records, with the last page.
func (s *egressStory) ledger(t *testing.T, id string, limit int) ([]egress.Record, fleetapi.EgressPage) {
	t.Helper()
	var all []egress.Record
	cursor := int64(0)
	for {
		p := s.page(t, id, fmt.Sprintf("?cursor=%d&limit=%d", cursor, limit))
		all = append(all, recordsOf(t, p.Records)...)
		if p.NextCursor == nil {
			t.Fatalf("a page after %d has no nextCursor", cursor)
		}
		cursor = *p.NextCursor
		if !p.HasMore {
			return all, p
		}
	}
}

// hostLedger is the run's whole ledger as edge serves it, with its last
// page.
func (s *egressStory) hostLedger(t *testing.T, child string) ([]egress.Record, hostproto.EgressPage) {
	t.Helper()
	var all []egress.Record
	after := int64(0)
	for {
		p, err := s.e.client.Egress(context.Background(), child, after, 2)
		must(t, err)
		all = append(all, p.Records...)
		after = *p.NextCursor
		if !p.HasMore {
			return all, p
		}
	}
}

// verification is ?verify=true's answer for run id.
func (s *egressStory) verification(t *testing.T, id string) fleetapi.EgressVerification {
	t.Helper()
	v := s.page(t, id, "?verify=true&limit=1").Verification
	if v == nil {
		t.Fatal("?verify=true answered no verification")
	}
	return *v
}

// ledgerKey is the key edge's /healthz reports for its ledgers.
func (s *egressStory) ledgerKey(t *testing.T) string {
	t.Helper()
	h, err := s.e.client.Health(context.Background())
	must(t, err)
	if !strings.HasPrefix(h.LedgerKey, "ed25519:") {
		t.Fatalf("/healthz ledgerKey %q", h.LedgerKey)
	}
	return h.LedgerKey
}

// recordsOf reads Fleet's records as shared/egress's, whose JSON they
// have.
func recordsOf(t *testing.T, recs []fleetapi.EgressRecord) []egress.Record {
	t.Helper()
	out := []egress.Record{}
	for _, r := range recs {
		b, _ := json.Marshal(r)
		var rec egress.Record
		must(t, json.Unmarshal(b, &rec))
		out = append(out, rec)
	}
	return out
}

// wantRecord is what a reviewer reads in a ledger record.
type wantRecord struct {
	via, authority, method, path string
	status                       int
	keys, action, reason         string
	rule, alert                  string
}

// checkRecords compares recs, field for field, with wants, in order: seqs
// from 1, times in order, each hash set.
func checkRecords(t *testing.T, recs []egress.Record, wants []wantRecord) {
	t.Helper()
	if len(recs) != len(wants) {
		b, _ := json.MarshalIndent(recs, "", " ")
		t.Fatalf("the ledger holds %d records, want %d:\n%s", len(recs), len(wants), b)
	}
	for i, w := range wants {
		r := recs[i]
		got := wantRecord{r.Via, r.Authority, r.Method, r.Path, r.Status, fmt.Sprint(r.Keys), r.Action, r.Reason, r.Rule, r.Alert}
		if got != w || r.Seq != int64(i+1) || r.TS.IsZero() || (i > 0 && r.TS.Before(recs[i-1].TS)) || len(r.Hash) != 64 {
			t.Errorf("record %d\n got %+v (seq %d, ts %v, hash %q)\nwant %+v", i+1, got, r.Seq, r.TS, r.Hash, w)
		}
	}
}

// tallied is the summary recs make, as edge counts them.
func tallied(recs []egress.Record) egress.Summary {
	var t egress.Tally
	for _, r := range recs {
		t.Add(r)
	}
	return t.Summary()
}

// encodesAlike fails unless got and want encode alike.
func encodesAlike(t *testing.T, what string, got, want any) {
	t.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if !bytes.Equal(g, w) {
		t.Fatalf("%s:\n got %s\nwant %s", what, g, w)
	}
}

// exfilName is a DNS name the task asks for; not a valid one (the
// underscore), so the task's DNS refuses it even under open egress.
const exfilName = "exfil_data.example.test"

// ledgerStory runs the ledger's scenario: a task that calls the granted
// demo upstream twice with its placeholder (once with a query), is
// refused the metadata address (by the upstream guard) and a DNS name,
// and opens a tunnel (open egress) to the upstream by its address. It
// returns the run's ids and the records it must leave.
func (s *egressStory) ledgerStory(t *testing.T) (id, child string, wants []wantRecord) {
	t.Helper()
	u := s.e.upstream
	prompt := fmt.Sprintf(`curl -sS --fail-with-body -H "Authorization: Bearer $%[1]s" "%[2]s?user=alice-private&page=2"; echo
curl -sS --fail-with-body -H "Authorization: Bearer $%[1]s" %[2]s; echo
curl -sS --max-time 10 https://169.254.169.254/latest/meta-data/ || echo refused-metadata
getent hosts %[3]s || echo refused-dns
curl -sSk --max-time 10 https://%[4]s%[5]s; echo`, demo.Key, u.URL(), exfilName, u.Addr(), demo.UpstreamPath)
	id, child = s.run(t, prompt)
	out := outputOf(s.e.events(child))
	if strings.Count(out, `{"authorized": true}`) != 2 || !strings.Contains(out, "refused-metadata") || !strings.Contains(out, "refused-dns") ||
		!strings.Contains(out, `{"authorized": false}`) {
		t.Fatalf("the task's output:\n%s", out)
	}
	// The two calls with the placeholder, then the tunnel's (no credential).
	if u.Authorized() != 2 || u.Refused() != 1 {
		t.Fatalf("the upstream saw %d requests with the real value and %d without, want 2 and 1", u.Authorized(), u.Refused())
	}
	key := "[" + demo.SecretsRef + "]"
	return id, child, []wantRecord{
		{egress.ViaProxy, u.Domain(), "GET", demo.UpstreamPath + "?user=*&page=*", 200, key, egress.Substituted, "", "", ""},
		{egress.ViaProxy, u.Domain(), "GET", demo.UpstreamPath, 200, key, egress.Substituted, "", "", ""},
		{egress.ViaProxy, "169.254.169.254:443", "CONNECT", "", 403, "[]", egress.Denied, "upstream refused: a metadata address, not in upstream.allowPrivate", "", ""},
		{egress.ViaDNS, exfilName, "", "", 0, "[]", egress.Denied, "not a name edge resolves: not a valid DNS name", "", ""},
		{egress.ViaProxy, u.Addr(), "CONNECT", "", 200, "[]", egress.Tunnelled, "", "", ""},
	}
}

// A run through a real edge calls the granted upstream twice, is refused
// a third destination and a DNS name, and opens a tunnel: once swept, its
// ledger through Fleet holds each decision in order with what a reviewer
// needs, exactly as edge wrote it; the run's summary counts it; pages and
// cursors work; another owner gets the run's 404; and ?verify=true holds
// with the ledger key Fleet's probe recorded, the one edge's /healthz
// reports.
func TestEgressE2ELedgerThroughFleet(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { egressE2ELedgerThroughFleet(t, kind) })
	}
}

func egressE2ELedgerThroughFleet(t *testing.T, kind string) {
	s := newEgressStory(t, kind, func(*config.Config) {})
	id, child, wants := s.ledgerStory(t)

	// Pages of two, then past the end.
	for _, c := range []struct {
		query   string
		seqs    string
		next    string
		hasMore bool
	}{
		{"?limit=2", "[1 2]", "2", true},
		{"?cursor=2&limit=2", "[3 4]", "4", true},
		{"?cursor=4&limit=2", "[5]", "5", false},
		{"?cursor=5&limit=2", "[]", "5", false},
		{"?cursor=6&limit=2", "[]", "none", false},
	} {
		p := s.page(t, id, c.query)
		seqs := []int64{}
		for _, r := range p.Records {
			seqs = append(seqs, r.Seq)
		}
		next := "none"
		if p.NextCursor != nil {
			next = fmt.Sprint(*p.NextCursor)
		}
		if fmt.Sprint(seqs) != c.seqs || next != c.next || p.HasMore != c.hasMore || p.Live || p.Summary == nil || p.Seal == nil || p.Seal.Count != 5 {
			t.Fatalf("%s: seqs %v, nextCursor %s, hasMore %v, live %v, seal %+v; want %s, %s, %v", c.query, seqs, next, p.HasMore, p.Live, p.Seal, c.seqs, c.next, c.hasMore)
		}
	}
	recs, last := s.ledger(t, id, 2)
	checkRecords(t, recs, wants)
	if recs[4].BytesUp == 0 || recs[4].BytesDown == 0 || recs[0].BytesDown == 0 {
		t.Errorf("bytes not counted: the tunnel's %d up, %d down; the first call's %d down", recs[4].BytesUp, recs[4].BytesDown, recs[0].BytesDown)
	}
	whole, _ := s.ledger(t, id, 1000)
	if !reflect.DeepEqual(whole, recs) {
		t.Fatal("pages of two and one page of the whole differ")
	}

	// Exactly what edge wrote, chain and seal included.
	onHost, hostLast := s.hostLedger(t, child)
	if !reflect.DeepEqual(recs, onHost) {
		t.Fatalf("the records through Fleet differ from the host's:\n%+v\n%+v", recs, onHost)
	}
	encodesAlike(t, "the seal through Fleet, and the host's", last.Seal, hostLast.Seal)
	encodesAlike(t, "the summary through Fleet, and the host's", last.Summary, hostLast.Summary)

	// The run's summary counts the records.
	var run fleetapi.RunAnswer
	decodeAnswer(t, s.f.call(t, http.StatusOK, "GET", "/fleet/runs/"+id, s.caller, ""), &run)
	encodesAlike(t, "the run's egress summary, and the records' tally", run.Run.Egress, tallied(recs))
	if sum := run.Run.Egress; sum.Requests != 5 || sum.Blocked != 2 || sum.Warned != 0 || sum.Alerts != 0 || len(sum.Authorities) != 4 ||
		sum.Authorities[0].Authority != s.e.upstream.Domain() || sum.Authorities[0].Requests != 2 || run.Run.Links.Egress != s.f.srv.URL+"/fleet/runs/"+id+"/egress" {
		t.Fatalf("the run's egress %+v, links %+v", sum, run.Run.Links)
	}

	// Verified with the key the probe recorded, which is edge's.
	key := s.ledgerKey(t)
	if v := s.verification(t, id); !v.OK || v.Records != 5 || !v.Sealed || v.FailedSeq != 0 || v.HostID != "edge-1" || v.LedgerKey != key {
		t.Fatalf("verification %+v; edge's ledger key %s", v, key)
	}
	hosts := s.f.call(t, http.StatusOK, "GET", "/fleet/hosts", adminToken, "").body["hosts"].([]any)
	if probed := jsonObj(hosts[0], "probe"); probed["ledgerKey"] != key || last.Seal.PublicKey != key {
		t.Fatalf("the probe recorded ledgerKey %v, the seal names %s; edge's is %s", probed["ledgerKey"], last.Seal.PublicKey, key)
	}

	// Scoped as the run: another owner gets GET's 404, word for word.
	bob := s.f.mint(t, "bob", []string{"edge-1"}, []string{"demo"})
	runFor := s.f.must(t, http.StatusNotFound, "GET", "/fleet/runs/"+id, bob, "")
	for _, q := range []string{"", "?verify=true", "?cursor=2&limit=2"} {
		if a := s.f.must(t, http.StatusNotFound, "GET", "/fleet/runs/"+id+"/egress"+q, bob, ""); a.raw != runFor.raw {
			t.Fatalf("another owner's ledger%s: %s, its run: %s", q, a.raw, runFor.raw)
		}
	}

	// Nothing a task sent is in the ledger: no query value, no
	// placeholder, no real value.
	b, _ := json.Marshal(recs)
	for what, v := range map[string]string{"a query value": "alice-private", "a placeholder": demo.PlaceholderPrefix, "the real value": s.e.secret} {
		if strings.Contains(string(b), v) {
			t.Errorf("the ledger holds %s: %s", what, b)
		}
	}
}

// sseMessages reads a stream from Fleet to its end, as alice, with
// Last-Event-ID when lastID is set.
func (s *egressStory) sseMessages(t *testing.T, path, lastID string) []ssetest.Message {
	t.Helper()
	req, _ := http.NewRequest("GET", s.f.srv.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+s.caller)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := s.f.srv.Client().Do(req)
	must(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	var all []ssetest.Message
	for m := range ssetest.Read(resp.Body) {
		all = append(all, m)
	}
	return all
}

// streamed checks a stream with egress as a client reads it: each
// message's id is "<event seq>:<ledger seq>", the two cursors after it,
// from after and egressAfter; the last message is done, carrying both. It
// returns the events' sequences and the records.
func streamed(t *testing.T, msgs []ssetest.Message, after, egressAfter int64) ([]int64, []egress.Record) {
	t.Helper()
	events, ledger := after, egressAfter
	var seqs []int64
	var recs []egress.Record
	for i, m := range msgs {
		switch m.Event {
		case fleetapi.SSEEvent:
			var ev hostproto.Event
			must(t, json.Unmarshal([]byte(m.Data), &ev))
			events = ev.Sequence
			seqs = append(seqs, ev.Sequence)
		case fleetapi.SSEEgress:
			var r egress.Record
			must(t, json.Unmarshal([]byte(m.Data), &r))
			ledger = r.Seq
			recs = append(recs, r)
		case fleetapi.SSEDone:
			var done fleetapi.StreamDone
			must(t, json.Unmarshal([]byte(m.Data), &done))
			if i != len(msgs)-1 || done.Status != "succeeded" || done.Cursor != events || done.EgressCursor == nil || *done.EgressCursor != ledger {
				t.Fatalf("done %s (message %d of %d); the stream's cursors are %d:%d", m.Data, i+1, len(msgs), events, ledger)
			}
			continue
		default:
			continue
		}
		if want := fmt.Sprintf("%d:%d", events, ledger); m.ID != want {
			t.Fatalf("message %d (%s) has id %q, want %q", i+1, m.Event, m.ID, want)
		}
	}
	if len(msgs) == 0 || msgs[len(msgs)-1].Event != fleetapi.SSEDone {
		t.Fatalf("the stream did not end with done: %+v", msgs)
	}
	return seqs, recs
}

// The stream of a finished run, asked with egress=true, carries every
// record of its ledger as an egress message, in order and as the egress
// route shows it, after its events, each id pairing the two cursors
// (README: "<event sequence>:<ledger seq>"), then done with both;
// Last-Event-ID in that form resumes after it, repeating nothing. Without
// egress=true the stream carries no record and keeps plain ids.
func TestEgressE2EStreamCarriesTheLedger(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { egressE2EStreamCarriesTheLedger(t, kind) })
	}
}

func egressE2EStreamCarriesTheLedger(t *testing.T, kind string) {
	s := newEgressStory(t, kind, func(*config.Config) {})
	id, _, _ := s.ledgerStory(t)
	recs, _ := s.ledger(t, id, 1000)
	var mirror hostproto.EventPage
	must(t, json.Unmarshal([]byte(s.f.call(t, http.StatusOK, "GET", "/fleet/runs/"+id+"/events?after=0&limit=1000", s.caller, "").raw), &mirror))

	msgs := s.sseMessages(t, "/fleet/runs/"+id+"/stream?egress=true", "")
	seqs, got := streamed(t, msgs, 0, 0)
	if len(seqs) != len(mirror.Events) || seqs[len(seqs)-1] != mirror.Events[len(mirror.Events)-1].Sequence {
		t.Fatalf("the stream carried events %v; the mirror holds %d", seqs, len(mirror.Events))
	}
	if !reflect.DeepEqual(got, recs) {
		t.Fatalf("the stream's records differ from the ledger's:\n%+v\n%+v", got, recs)
	}
	lastEvent, firstRecord := -1, -1
	for i, m := range msgs {
		switch {
		case m.Event == fleetapi.SSEEvent:
			lastEvent = i
		case m.Event == fleetapi.SSEEgress && firstRecord < 0:
			firstRecord = i
		}
	}
	if firstRecord < lastEvent {
		t.Fatalf("the finished run's records did not follow its events: record at message %d, event at %d", firstRecord+1, lastEvent+1)
	}

	// Resumed after the third record: the last two, and no event again.
	third := ""
	for _, m := range msgs {
		if m.Event == fleetapi.SSEEgress && strings.HasSuffix(m.ID, ":3") {
			third = m.ID
		}
	}
	evCursor, err := strconv.ParseInt(strings.TrimSuffix(third, ":3"), 10, 64)
	if err != nil {
		t.Fatalf("no egress message of record 3 with a paired id (%q)", third)
	}
	seqs, got = streamed(t, s.sseMessages(t, "/fleet/runs/"+id+"/stream?egress=true", third), evCursor, 3)
	if len(seqs) != 0 || !reflect.DeepEqual(got, recs[3:]) {
		t.Fatalf("resumed at %q: events %v, records %+v", third, seqs, got)
	}

	// Without egress=true: events alone, plain ids.
	for _, m := range s.sseMessages(t, "/fleet/runs/"+id+"/stream", "") {
		if m.Event == fleetapi.SSEEgress || strings.Contains(m.ID, ":") {
			t.Fatalf("a stream without egress=true sent %+v", m)
		}
	}
}

// The ledger mirrored in Fleet is checked against tampering there: on
// both stores, an untouched ledger verifies, and its seal replaced (in the
// store, through its own API) by one another Ed25519 key signed over the
// same chain fails on the seal; on DynamoDB, one field of one record
// altered in the egress table, or a record dropped from it, fails naming
// that record. Each tampering is undone before the next, and the ledger
// then verifies again: each failure is that tampering's alone. bbolt's
// records cannot be rewritten through the store's API (a record once
// stored is never rewritten) and the test does not reach into its file.
func TestEgressE2ETamperingIsNamed(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { egressE2ETamperingIsNamed(t, kind) })
	}
}

func egressE2ETamperingIsNamed(t *testing.T, kind string) {
	s := newEgressStory(t, kind, func(*config.Config) {})
	id, child, _ := s.ledgerStory(t)
	key := s.ledgerKey(t)
	// verifies checks ?verify=true: ok when problem is empty, else failing
	// at failedSeq (0: the seal) for problem, having read records.
	verifies := func(what string, records, failedSeq int64, problem string) {
		t.Helper()
		v := s.verification(t, id)
		if v.OK != (problem == "") || v.FailedSeq != failedSeq || !strings.Contains(v.Problem, problem) || v.Records != records || v.LedgerKey != key {
			t.Fatalf("%s: verification %+v; want failedSeq %d and a problem saying %q", what, v, failedSeq, problem)
		}
	}
	verifies("untouched", 5, 0, "")

	// Another key's seal over the very chain.
	ctx, st := context.Background(), s.f.app.Store
	head, err := st.GetEgressHead(ctx, id)
	must(t, err)
	var seal egress.Seal
	must(t, json.Unmarshal(head.Seal, &seal))
	var last [32]byte
	if b, err := hex.DecodeString(seal.LastHash); err != nil || copy(last[:], b) != len(last) {
		t.Fatalf("the seal's lastHash %q: %v", seal.LastHash, err)
	}
	other := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))
	forged := head
	forged.Seal, _ = json.Marshal(egress.Sign(other, child, seal.Count, last, time.Now()))
	stored, err := st.PutEgressHead(ctx, forged)
	must(t, err)
	verifies("sealed by another key", 5, 0, "the seal's signature does not verify with the host's ledger key (it names another key)")
	head.Version = stored.Version
	_, err = st.PutEgressHead(ctx, head)
	must(t, err)
	verifies("the seal restored", 5, 0, "")

	if kind != "dynamodb" {
		return
	}
	table := s.f.app.Config.Tables.Egress
	var original [][]byte
	keep := func(recs [][]byte) [][]byte {
		original = append([][]byte(nil), recs...)
		return recs
	}
	restore := func(what string) {
		t.Helper()
		rewriteChunk(t, table, id, 3, func([][]byte) [][]byte { return original })
		verifies(what+", undone", 5, 0, "")
	}
	rewriteChunk(t, table, id, 3, keep)
	if len(original) != 5 {
		t.Fatalf("the chunk holding record 3 holds %d records, want the whole ledger's 5", len(original))
	}

	// Record 3, the metadata address refused, made to look let through.
	rewriteChunk(t, table, id, 3, func(recs [][]byte) [][]byte {
		out := append([][]byte(nil), recs...)
		out[2] = bytes.Replace(recs[2], []byte(`"action":"denied"`), []byte(`"action":"tunnelled"`), 1)
		if bytes.Equal(out[2], recs[2]) {
			t.Fatalf("record 3 is not the denied one: %s", recs[2])
		}
		return out
	})
	verifies("one field of record 3 altered", 5, 3, "record 3 does not match its hash")
	restore("record 3 altered")

	rewriteChunk(t, table, id, 3, func(recs [][]byte) [][]byte { return append(recs[:2:2], recs[3:]...) })
	verifies("record 3 dropped", 4, 3, "record 3 is missing")
	restore("record 3 dropped")
}

// The tripwire through Fleet: a task that found its key's real value
// (pieced together, so that the value is in no prompt) and sends it in a
// header, a query and a body to the granted upstream is refused each time
// (403) and the upstream sees nothing; each refusal is in the ledger
// through Fleet as an alert; the run's summary counts three; the alerts
// listing shows it, and not a quiet run, to an admin only. The real value
// is in no Fleet answer, no log, no ledger, no audit line.
func TestEgressE2ETripwireThroughFleet(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { egressE2ETripwireThroughFleet(t, kind) })
	}
}

func egressE2ETripwireThroughFleet(t *testing.T, kind string) {
	s := newEgressStory(t, kind, func(*config.Config) {})
	u := s.e.upstream
	quiet, _ := s.run(t, fmt.Sprintf(`curl -sS --fail-with-body -H "Authorization: Bearer $%s" %s`, demo.Key, u.URL()))
	if u.Authorized() != 1 || u.Refused() != 0 {
		t.Fatalf("the quiet run's call: the upstream saw %d requests with the real value, %d without", u.Authorized(), u.Refused())
	}

	half := len(s.e.secret) / 2
	prompt := fmt.Sprintf(`V=%[1]s; V="${V}%[2]s"
curl -sS -o /dev/null -w 'header %%{http_code}\n' -H "X-Found: $V" %[3]s
curl -sS -o /dev/null -w 'query %%{http_code}\n' "%[3]s?leak=$V"
curl -sS -o /dev/null -w 'body %%{http_code}\n' -d "found=$V" %[3]s`, s.e.secret[:half], s.e.secret[half:], u.URL())
	id, child := s.run(t, prompt)
	out := outputOf(s.e.events(child))
	for _, want := range []string{"header 403", "query 403", "body 403"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the task's output lacks %q:\n%s", want, out)
		}
	}
	if u.Authorized() != 1 || u.Refused() != 0 {
		t.Fatalf("the upstream saw %d requests with the real value, %d without, after the leaking run; want the quiet run's one", u.Authorized(), u.Refused())
	}

	recs, last := s.ledger(t, id, 1000)
	key := "[" + demo.SecretsRef + "]"
	alerted := func(method, path string) wantRecord {
		return wantRecord{egress.ViaProxy, u.Domain(), method, path, 403, key, egress.Blocked, egress.AlertRealValue, "", egress.AlertRealValue}
	}
	checkRecords(t, recs, []wantRecord{
		alerted("GET", demo.UpstreamPath), alerted("GET", demo.UpstreamPath+"?leak=*"), alerted("POST", demo.UpstreamPath),
	})
	onHost, _ := s.hostLedger(t, child)
	if !reflect.DeepEqual(recs, onHost) {
		t.Fatalf("the records through Fleet differ from the host's:\n%+v\n%+v", recs, onHost)
	}
	if v := s.verification(t, id); !v.OK {
		t.Fatalf("verification %+v", v)
	}
	if sum := s.f.run(t, s.caller, id)["egress"].(map[string]any); sum["alerts"] != float64(3) || sum["blocked"] != float64(3) || sum["requests"] != float64(3) {
		t.Fatalf("the run's egress summary %v, want 3 alerts of 3 requests, all blocked", sum)
	}
	metrics, err := s.e.client.Metrics(context.Background())
	must(t, err)
	if want := `edge_egress_alerts_total{kind="real_value_from_task"} 3`; !strings.Contains(string(metrics), want) {
		t.Errorf("edge's /metrics lacks %s", want)
	}

	// The admins' alerts listing: this run, not the quiet one.
	var listed fleetapi.RunPage
	decodeAnswer(t, s.f.call(t, http.StatusOK, "GET", "/fleet/runs?alerts=true", adminToken, ""), &listed)
	if len(listed.Runs) != 1 || listed.Runs[0].FleetRunID != id || listed.Runs[0].Egress == nil || listed.Runs[0].Egress.Alerts != 3 || listed.HasMore {
		t.Fatalf("the alerted runs (the leaking run is %s, the quiet one %s): %+v", id, quiet, listed)
	}
	if a := s.f.call(t, http.StatusForbidden, "GET", "/fleet/runs?alerts=true", s.caller, ""); a.str("code") != "admin_required" {
		t.Fatalf("a caller's alerts listing: %s", a.raw)
	}

	// The value never left edge, nor went anywhere a reader looks.
	s.e.shutdown() // its audit file flushed
	auditLog, err := os.ReadFile(filepath.Join(s.e.spec.DataDir, "logs", audit.FileName))
	must(t, err)
	if !strings.Contains(string(auditLog), `"alert":"real_value_from_task"`) {
		t.Fatalf("the audit file holds no alert:\n%s", auditLog)
	}
	ledgerJSON, _ := json.Marshal(recs)
	sealJSON, _ := json.Marshal(last)
	for where, text := range map[string]string{
		"Fleet's answers": strings.Join(s.f.responses, "\n"), "Fleet's log": s.f.logs.String(), "edge's log": s.e.logs.String(),
		"the ledger": string(ledgerJSON) + string(sealJSON), "the audit file": string(auditLog), "the upstream's log": s.e.upLogs.String(),
		"the task's output": out,
	} {
		if strings.Contains(text, s.e.secret) {
			t.Errorf("the real value is in %s", where)
		}
	}
}

// Request rules through a real edge, read through Fleet: a demo key
// whose rules deny POST on `/**/whoami`. Enforced, the task's GET goes
// (its record names the key's default), and its POSTs, over HTTP/1.1 and
// HTTP/2, are refused 403 before the upstream, each record blocked with
// the rule named; in warn mode the same POSTs reach the upstream with the
// real value and are recorded warned, with the rule that would have
// refused them. The run's summary counts them as blocked or warned. The
// HTTP/2 POST has no body: curl 7.88 loses, about one time in five, the
// answer to an HTTP/2 request whose body edge refused unread (edge's
// GOAWAY with the stream's NO_ERROR reset; reported), which is no
// business of the ledger's.
func TestEgressE2ERequestRules(t *testing.T) {
	for _, kind := range storeKinds {
		for _, mode := range []string{"enforce", "warn"} {
			t.Run(kind+"/"+mode, func(t *testing.T) { egressE2ERequestRules(t, kind, mode) })
		}
	}
}

func egressE2ERequestRules(t *testing.T, kind, mode string) {
	s := newEgressStory(t, kind, func(cfg *config.Config) {
		k := cfg.Policy.Projects[demo.Project].Keys[demo.Key]
		k.Rules = []config.Rule{{Deny: &config.RuleMatch{Methods: []string{"POST"}, Paths: []string{"/**/whoami"}}}}
		k.Mode = mode
		cfg.Policy.Projects[demo.Project].Keys[demo.Key] = k
	})
	u := s.e.upstream
	call := fmt.Sprintf(`-sS -o /dev/null -H "Authorization: Bearer $%s"`, demo.Key)
	id, child := s.run(t, fmt.Sprintf(`curl %[1]s -w 'get %%{http_code} %%{http_version}\n' %[2]s
curl %[1]s -w 'post-h1 %%{http_code} %%{http_version}\n' --http1.1 -d x %[2]s
curl %[1]s -w 'post-h2 %%{http_code} %%{http_version}\n' --http2 -X POST %[2]s`, call, u.URL()))
	out := outputOf(s.e.events(child))

	const rule = "projects." + demo.Project + ".keys." + demo.Key + ".rules[0]"
	post, status, authorized := egress.Blocked, "403", int64(1)
	if mode == "warn" {
		post, status, authorized = egress.Warned, "200", 3
	}
	for _, want := range []string{"get 200 ", "post-h1 " + status + " 1.1", "post-h2 " + status + " 2"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the task's output lacks %q:\n%s", want, out)
		}
	}
	if u.Authorized() != authorized || u.Refused() != 0 {
		t.Fatalf("the upstream saw %d requests with the real value and %d without; want %d and none", u.Authorized(), u.Refused(), authorized)
	}

	recs, _ := s.ledger(t, id, 1000)
	key := "[" + demo.SecretsRef + "]"
	postStatus, _ := strconv.Atoi(status)
	reason := "blocked: " + rule + " (deny POST /**/whoami) matches the request"
	if mode == "warn" {
		reason = "warned: " + rule + " (deny POST /**/whoami) matches the request; warn mode let it through"
	}
	denial := wantRecord{egress.ViaProxy, u.Domain(), "POST", demo.UpstreamPath, postStatus, key, post, reason, rule, ""}
	checkRecords(t, recs, []wantRecord{
		{egress.ViaProxy, u.Domain(), "GET", demo.UpstreamPath, 200, key, egress.Substituted, "", "projects.demo.keys.DEMO_API_KEY.default", ""},
		denial, denial,
	})
	sum := s.f.run(t, s.caller, id)["egress"].(map[string]any)
	blocked, warned := float64(2), float64(0)
	if mode == "warn" {
		blocked, warned = 0, 2
	}
	if sum["requests"] != float64(3) || sum["blocked"] != blocked || sum["warned"] != warned || sum["alerts"] != float64(0) {
		t.Fatalf("the run's egress summary %v; want 3 requests, %v blocked, %v warned", sum, blocked, warned)
	}
	if v := s.verification(t, id); !v.OK {
		t.Fatalf("verification %+v", v)
	}
}
