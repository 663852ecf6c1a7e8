package ledger

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/internal/redact"
	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/tests/kit/await"
)

var t0 = time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)

// rig is a ledger over a real run log in a temporary dir.
type rig struct {
	t     *testing.T
	path  string
	store *runlog.Log
	key   ed25519.PrivateKey
	l     *Ledger
	clock *clock.Fake
	cfg   Config
}

func newRig(t *testing.T, cfg Config, runs ...string) *rig {
	t.Helper()
	_, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, path: filepath.Join(t.TempDir(), "runs.db"), key: key, clock: clock.NewFake(t0), cfg: cfg}
	r.open()
	for _, id := range runs {
		if _, _, err := r.store.Create(runlog.Record{RunID: id, ClientToken: "ct-" + id}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(r.close)
	return r
}

func (r *rig) open() {
	r.t.Helper()
	var err error
	if r.store, err = runlog.Open(r.path, nil); err != nil {
		r.t.Fatal(err)
	}
	cfg := r.cfg
	cfg.Store, cfg.Key, cfg.Clock = r.store, r.key, r.clock
	if r.l, err = New(cfg); err != nil {
		r.t.Fatal(err)
	}
}

// close stops the ledger and the run log (a restart's first half).
func (r *rig) close() {
	if r.l == nil {
		return
	}
	r.l.Close()
	r.store.Close()
	r.l = nil
}

// seal seals runID, failing the test on an error.
func (r *rig) seal(runID string) {
	r.t.Helper()
	if err := r.l.Seal(runID); err != nil {
		r.t.Fatal(err)
	}
}

// all reads runID's whole ledger by pages of size.
func (r *rig) all(runID string, size int) ([]egress.Record, Page) {
	r.t.Helper()
	var recs []egress.Record
	var last Page
	after := int64(0)
	for {
		p, err := r.l.Page(runID, after, size)
		if err != nil {
			r.t.Fatal(err)
		}
		recs = append(recs, p.Records...)
		last, after = p, p.NextCursor
		if !p.HasMore {
			return recs, last
		}
	}
}

// verify checks runID's ledger against the rig's key.
func (r *rig) verify(runID string) ([]egress.Record, Page) {
	r.t.Helper()
	recs, p := r.all(runID, 7)
	if v := egress.Verify(runID, recs, p.Seal, r.key.Public().(ed25519.PublicKey)); !v.OK {
		r.t.Fatalf("run %s's ledger of %d records does not verify: %+v", runID, len(recs), v)
	}
	return recs, p
}

func entry(task string, i int) audit.Entry {
	return audit.Entry{TS: t0.Add(time.Duration(i) * time.Millisecond), Task: task, Action: audit.Forwarded,
		Host: fmt.Sprintf("h%d.example.test:443", i%3), Method: "GET", Path: fmt.Sprintf("/r/%d", i), Status: 200}
}

// A run's decisions become its records in order, each field where a
// reader looks for it: the explicit proxy and the transparent front, a
// tunnel, a query masked by the proxy, an SSH command, a name its DNS
// refused. Sealed at its end, the ledger verifies with the host's key,
// and the summary counts it.
func TestRecordsChainAndVerify(t *testing.T) {
	r := newRig(t, Config{}, "run-1", "run-2")
	exit := 0
	r.l.Record([]audit.Entry{
		{TS: t0, Task: "run-1", Action: audit.Substituted, Keys: []string{"acme/K", "acme/A", "acme/K"}, Host: "api.example.test:443",
			Method: "POST", Path: "/v1/items", Query: "page=*&q=*&flag", Status: 201, BytesIn: 10, BytesOut: 20,
			Duration: 1500 * time.Microsecond, Rule: "projects.acme.keys.K.rules[0]"},
		{TS: t0.Add(time.Millisecond), Action: audit.Blocked, Host: "unparseable (9 bytes)"}, // no run: not a record
		{TS: t0.Add(2 * time.Millisecond), Task: "run-2", Action: audit.Forwarded, Host: "other.test:443", Method: "GET", Path: "/"},
		{TS: t0.Add(3 * time.Millisecond), Task: "run-1", Action: audit.Tunnelled, Host: "tunnel.example.test:443", Method: "CONNECT",
			BytesIn: 100, BytesOut: 2000, Duration: time.Second},
		{TS: t0.Add(4 * time.Millisecond), Task: "run-1", Action: audit.Denied, Host: "169.254.169.254:80", Via: audit.ViaTransparent,
			Status: 403, Reason: "upstream refused: a metadata address"},
		{TS: t0.Add(5 * time.Millisecond), Task: "run-1", Action: audit.Denied, Host: "exfil.example.test", Via: audit.ViaDNS,
			Reason: "no key of this run reaches the name"},
		{TS: t0.Add(6 * time.Millisecond), Task: "run-1", Action: audit.Substituted, Host: "github.com:22", Via: audit.ViaTransparent,
			Keys: []string{"acme/DEPLOY"}, Status: 200, SSH: &audit.SSHCommand{Request: "exec", Command: "git-upload-pack", Repository: "acme/app.git", ExitStatus: &exit}},
		{TS: t0.Add(7 * time.Millisecond), Task: "run-1", Action: audit.Blocked, Host: "evil.test:443", Method: "GET", Path: "/x",
			Status: 403, Reason: "placeholder of another run", Alert: egress.AlertForeignPlaceholder, Keys: []string{"acme/K"}},
	})
	r.seal("run-1")
	recs, p := r.verify("run-1")
	want := []egress.Record{
		{Seq: 1, TS: t0, Via: egress.ViaProxy, Authority: "api.example.test:443", Method: "POST", Path: "/v1/items?page=*&q=*&flag",
			Status: 201, BytesUp: 10, BytesDown: 20, DurationUs: 1500, Keys: []string{"acme/A", "acme/K"}, Action: egress.Substituted,
			Rule: "projects.acme.keys.K.rules[0]"},
		{Seq: 2, TS: t0.Add(3 * time.Millisecond), Via: egress.ViaProxy, Authority: "tunnel.example.test:443", Method: "CONNECT",
			BytesUp: 100, BytesDown: 2000, DurationUs: 1e6, Action: egress.Tunnelled},
		{Seq: 3, TS: t0.Add(4 * time.Millisecond), Via: egress.ViaTransparent, Authority: "169.254.169.254:80", Status: 403,
			Action: egress.Denied, Reason: "upstream refused: a metadata address"},
		{Seq: 4, TS: t0.Add(5 * time.Millisecond), Via: egress.ViaDNS, Authority: "exfil.example.test", Action: egress.Denied,
			Reason: "no key of this run reaches the name"},
		{Seq: 5, TS: t0.Add(6 * time.Millisecond), Via: egress.ViaSSH, Authority: "github.com:22", Method: "exec", Command: "git-upload-pack",
			Path: "acme/app.git", Status: 200, Keys: []string{"acme/DEPLOY"}, Action: egress.Substituted},
		{Seq: 6, TS: t0.Add(7 * time.Millisecond), Via: egress.ViaProxy, Authority: "evil.test:443", Method: "GET", Path: "/x", Status: 403,
			Keys: []string{"acme/K"}, Action: egress.Blocked, Reason: "placeholder of another run", Alert: egress.AlertForeignPlaceholder},
	}
	if len(recs) != len(want) {
		t.Fatalf("%d records, want %d: %+v", len(recs), len(want), recs)
	}
	for i := range want {
		got := recs[i]
		if got.Hash == "" {
			t.Errorf("record %d has no hash", got.Seq)
		}
		got.Hash = ""
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want[i])
		if string(g) != string(w) {
			t.Errorf("record %d\n got %s\nwant %s", i+1, g, w)
		}
	}
	if p.Seal == nil || p.Seal.Count != 6 || p.Seal.PublicKey != r.l.PublicKey() || !p.Seal.SealedAt.Equal(t0) {
		t.Errorf("seal %+v", p.Seal)
	}
	s := p.Summary
	if s.Requests != 6 || s.Blocked != 3 || s.Alerts != 1 || s.BytesUp != 110 || s.BytesDown != 2020 || s.Dropped != 0 || len(s.Authorities) != 6 {
		t.Errorf("summary %+v", s)
	}
	// The other run's record is its own chain, not sealed yet.
	other, op := r.all("run-2", 10)
	if len(other) != 1 || other[0].Seq != 1 || op.Seal != nil {
		t.Errorf("the other run: %+v, seal %v", other, op.Seal)
	}
	if v := egress.Verify("run-2", other, nil, r.key.Public().(ed25519.PublicKey)); v.OK || v.FailedSeq != 0 || v.Sealed {
		t.Errorf("an unsealed ledger verifies as %+v, want its chain to hold and no seal", v)
	}
}

// Altering any field of any record, dropping a record, reordering two, or
// presenting the ledger under another host's key fails verification, naming
// the first record that fails (or the seal).
func TestTamperingFailsNamingTheRecord(t *testing.T) {
	r := newRig(t, Config{}, "run-1")
	var batch []audit.Entry
	for i := range 5 {
		batch = append(batch, entry("run-1", i))
	}
	r.l.Record(batch)
	r.seal("run-1")
	recs, p := r.verify("run-1")
	pub := r.key.Public().(ed25519.PublicKey)
	fresh := func() []egress.Record { return append([]egress.Record(nil), recs...) }

	alter := map[string]func(*egress.Record){
		"ts":        func(x *egress.Record) { x.TS = x.TS.Add(time.Nanosecond) },
		"via":       func(x *egress.Record) { x.Via = egress.ViaTransparent },
		"authority": func(x *egress.Record) { x.Authority = "innocent.test:443" },
		"method":    func(x *egress.Record) { x.Method = "HEAD" },
		"path":      func(x *egress.Record) { x.Path += "x" },
		"status":    func(x *egress.Record) { x.Status = 404 },
		"bytesUp":   func(x *egress.Record) { x.BytesUp++ },
		"keys":      func(x *egress.Record) { x.Keys = []string{"acme/K"} },
		"action":    func(x *egress.Record) { x.Action = egress.Blocked },
		"reason":    func(x *egress.Record) { x.Reason = "fine" },
	}
	for seq := 1; seq <= len(recs); seq++ {
		for field, f := range alter {
			rs := fresh()
			f(&rs[seq-1])
			if v := egress.Verify("run-1", rs, p.Seal, pub); v.OK || v.FailedSeq != int64(seq) {
				t.Errorf("record %d with its %s altered verifies as %+v", seq, field, v)
			}
		}
		dropped := append(fresh()[:seq-1], recs[seq:]...)
		if v := egress.Verify("run-1", dropped, p.Seal, pub); v.OK || (seq < len(recs) && v.FailedSeq != int64(seq)) {
			t.Errorf("without record %d: %+v", seq, v)
		}
	}
	swapped := fresh()
	swapped[1], swapped[2] = swapped[2], swapped[1]
	if v := egress.Verify("run-1", swapped, p.Seal, pub); v.OK || v.FailedSeq != 2 {
		t.Errorf("records 2 and 3 swapped: %+v", v)
	}
	renumbered := fresh()
	renumbered[1].Seq, renumbered[2].Seq = 2, 3
	renumbered[1], renumbered[2] = renumbered[2], renumbered[1]
	renumbered[1].Seq, renumbered[2].Seq = 2, 3
	if v := egress.Verify("run-1", renumbered, p.Seal, pub); v.OK || v.FailedSeq != 2 {
		t.Errorf("records 2 and 3 swapped and renumbered: %+v", v)
	}
	other, _, _ := ed25519.GenerateKey(nil)
	if v := egress.Verify("run-1", fresh(), p.Seal, other); v.OK || v.FailedSeq != 0 || !strings.Contains(v.Problem, "another key") {
		t.Errorf("verified with another host's key: %+v", v)
	}
	if v := egress.Verify("run-2", fresh(), p.Seal, pub); v.OK || v.FailedSeq != 1 {
		t.Errorf("presented as another run's: %+v", v)
	}
}

// What the writer hashes is egress.Canonical's bytes exactly, for any
// record a task can make (HTML, line separators, control and non-ASCII
// characters, invalid UTF-8 made valid, times of any precision), and the
// stored form, written without encoding the record twice, decodes to the
// record encoding it whole would give.
func TestCanonicalAndStoredFormsAreEgresss(t *testing.T) {
	enc := newEncoder()
	for i, e := range []audit.Entry{
		{TS: t0, Task: "r", Action: audit.Substituted, Host: "a.test:443", Method: "GET", Path: "/p<&>", Query: "a=*",
			Keys: []string{"acme/K"}, Status: 200, BytesIn: 1, BytesOut: 2, Duration: time.Millisecond, Rule: "x", Alert: "y"},
		{TS: t0.Add(123456789 * time.Nanosecond).In(time.FixedZone("x", 3600)), Task: "r", Action: audit.Blocked, Host: "\u2028\u2029.test",
			Path: "/\x00\x1f\"\\é😀\xff\xfe", Reason: "<script>", Keys: []string{"b", "a", "b"}},
		{Task: "r", Action: audit.Denied, Via: audit.ViaDNS, Host: "exfil_data.example.test", Reason: "not a name"},
	} {
		rec := recordOf(&e)
		rec.Seq = int64(i + 1)
		c, err := enc.canonical(&rec, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := egress.Canonical(rec)
		if string(c) != string(want) {
			t.Errorf("record %d: canonical\n%s\nwant\n%s", i, c, want)
		}
		h := egress.Next(egress.Genesis("r"), c)
		stored := appendStored(nil, c, h)
		if stored[len(stored)-1] != '\n' || strings.Count(string(stored), "\n") != 1 {
			t.Fatalf("record %d: stored form %q is not one line", i, stored)
		}
		got, err := decode(stored[:len(stored)-1])
		if err != nil {
			t.Fatal(err)
		}
		rec.Hash = fmt.Sprintf("%x", h)
		w, _ := json.Marshal(rec)
		g, _ := json.Marshal(got)
		if string(g) != string(w) {
			t.Errorf("record %d: stored %s\ndecodes to %s\nwant       %s", i, stored, g, w)
		}
	}
}

// A real value the proxy holds, found in a record (a path, a reason, an
// SSH command), is taken out of the very field before the record is
// hashed: the stored ledger never holds it and still verifies.
func TestRedactorRunsBeforeTheHash(t *testing.T) {
	const real = "sk-live-0123456789abcdef"
	set := redact.NewSet(0)
	set.Add(secrets.NewValue(real))
	r := newRig(t, Config{Redact: set.Redact}, "run-1")
	r.l.Record([]audit.Entry{
		{TS: t0, Task: "run-1", Action: audit.Blocked, Host: "a.test:443", Method: "GET", Path: "/leak/" + real, Query: "k=*", Reason: "saw " + real},
		{TS: t0, Task: "run-1", Action: audit.Forwarded, Host: "a.test:443", Method: "GET", Path: "/clean"},
	})
	r.seal("run-1")
	recs, _ := r.verify("run-1")
	b, _ := json.Marshal(recs)
	if strings.Contains(string(b), real) {
		t.Fatalf("the ledger holds the real value: %s", b)
	}
	if recs[0].Path != "/leak/"+redact.Mark+"?k=*" || recs[0].Reason != "saw "+redact.Mark || recs[1].Path != "/clean" {
		t.Errorf("records %+v", recs)
	}
}

// Past the bound, records are counted and not kept; at the seal one
// Dropped record says how many since the last, so the Dropped records add
// up to exactly the records not kept, across a retry too. The summary
// counts every decision.
func TestBoundAndExactDroppedCount(t *testing.T) {
	const max = 10
	r := newRig(t, Config{MaxRecords: max}, "run-1")
	batch := func(from, n int) {
		var b []audit.Entry
		for i := from; i < from+n; i++ {
			b = append(b, entry("run-1", i))
		}
		r.l.Record(b)
	}
	batch(0, 25)
	r.seal("run-1")
	recs, p := r.verify("run-1")
	if len(recs) != max+1 || recs[max].Action != egress.Dropped || recs[max].Dropped != 15 {
		t.Fatalf("%d records, the last %+v; want %d and a Dropped of 15", len(recs), recs[len(recs)-1], max+1)
	}
	if s := p.Summary; s.Requests != 25 || s.Dropped != 15 {
		t.Errorf("summary %+v, want 25 requests, 15 dropped", s)
	}
	// A retry: its records are all past the bound, sealed again at its end.
	r.l.Reopen("run-1")
	batch(25, 7)
	r.seal("run-1")
	// Sealed with nothing dropped since: no empty Dropped record.
	r.seal("run-1")
	recs, p = r.verify("run-1")
	var sum int64
	for _, rec := range recs {
		sum += rec.Dropped
	}
	if len(recs) != max+2 || sum != 32-max || p.Summary.Requests != 32 || p.Summary.Dropped != 22 {
		t.Errorf("after the retry: %d records, dropped %d in all, summary %+v; want %d records, %d dropped", len(recs), sum, p.Summary, max+2, 32-max)
	}
}

// A restarted edge continues a run's chain where the last one stored it,
// and a retry on it appends to the same chain; a record arriving after the
// seal (a connection closing late) is chained after it and the run sealed
// again, while an attempt's seal no longer stands once a retry began.
func TestRestartRetryAndLateRecordsKeepOneChain(t *testing.T) {
	r := newRig(t, Config{}, "run-1")
	r.l.Record([]audit.Entry{entry("run-1", 0), entry("run-1", 1)})
	r.seal("run-1")
	r.verify("run-1")

	r.close()
	r.open()
	r.l.Reopen("run-1")
	r.l.Record([]audit.Entry{entry("run-1", 2)})
	await.Cond(t, 10*time.Second, "the retry's record stored", func() bool {
		p, err := r.l.Page("run-1", 0, 10)
		return err == nil && len(p.Records) == 3
	})
	if _, p := r.all("run-1", 10); p.Seal != nil {
		t.Errorf("the first attempt's seal stands while the retry lives: %+v", p.Seal)
	}
	r.clock.Advance(time.Minute)
	r.seal("run-1")
	recs, p := r.verify("run-1")
	if len(recs) != 3 || p.Seal.Count != 3 || !p.Seal.SealedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("after the retry: %d records, seal %+v", len(recs), p.Seal)
	}

	r.l.Record([]audit.Entry{entry("run-1", 3)})
	await.Cond(t, 10*time.Second, "the late record sealed", func() bool {
		p, err := r.l.Page("run-1", 0, 10)
		return err == nil && p.Seal != nil && p.Seal.Count == 4
	})
	recs, _ = r.verify("run-1")
	for i, rec := range recs {
		if rec.Seq != int64(i+1) || rec.Path != fmt.Sprintf("/r/%d", i) {
			t.Errorf("record %d: %+v", i+1, rec)
		}
	}
}

// Pages follow the event pages' conventions; a run the host does not hold
// is ErrNotFound, and a decision of such a run is not kept.
func TestPagesAndUnknownRuns(t *testing.T) {
	r := newRig(t, Config{}, "run-1")
	var b []audit.Entry
	for i := range 5 {
		b = append(b, entry("run-1", i), entry("ghost", i))
	}
	r.l.Record(b)
	r.seal("run-1")
	r.seal("ghost")
	for _, c := range []struct {
		after, limit  int
		n             int
		next          int64
		hasMore, past bool
	}{
		{0, 0, 5, 5, false, false}, {0, 2, 2, 2, true, false}, {2, 2, 2, 4, true, false}, {4, 2, 1, 5, false, false},
		{5, 2, 0, 5, false, false}, {6, 2, 0, 6, false, true}, {0, MaxPage + 5, 5, 5, false, false},
	} {
		p, err := r.l.Page("run-1", int64(c.after), c.limit)
		if err != nil || len(p.Records) != c.n || p.NextCursor != c.next || p.HasMore != c.hasMore || p.PastEnd != c.past {
			t.Errorf("after %d limit %d: %d records, next %d, hasMore %v, pastEnd %v, %v; want %+v",
				c.after, c.limit, len(p.Records), p.NextCursor, p.HasMore, p.PastEnd, err, c)
		}
	}
	if _, err := r.l.Page("ghost", 0, 10); err != ErrNotFound {
		t.Errorf("a run the host does not hold: %v", err)
	}
	if _, found, _ := r.store.EgressHead("ghost"); found {
		t.Error("a run the host does not hold got a ledger")
	}
}

// Many runs recorded, sealed, reopened and read at once (as flushes,
// attempts' ends and the host API do): every ledger verifies, in the
// order each run's decisions were recorded, and counts them all.
func TestConcurrentRunsVerify(t *testing.T) {
	const runs, per = 8, 300
	var ids []string
	for i := range runs {
		ids = append(ids, fmt.Sprintf("run-%d", i))
	}
	r := newRig(t, Config{MaxRecords: 200}, ids...)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			for i := 0; i < per; i += 10 {
				var b []audit.Entry
				for j := i; j < i+10; j++ {
					b = append(b, entry(id, j))
				}
				r.l.Record(b)
				if i%100 == 0 {
					if err := r.l.Seal(id); err != nil {
						t.Error(err)
					}
					r.l.Reopen(id)
				}
				if _, err := r.l.Page(id, 0, 50); err != nil {
					t.Error(err)
				}
			}
		})
	}
	await.Group(t, "the runs' goroutines", &wg)
	for _, id := range ids {
		r.seal(id)
		recs, p := r.verify(id)
		var dropped int64
		kept := 0
		for _, rec := range recs {
			if rec.Action == egress.Dropped {
				dropped += rec.Dropped
				continue
			}
			if want := fmt.Sprintf("/r/%d", kept); rec.Path != want {
				t.Fatalf("%s: record %d is %s, want %s", id, rec.Seq, rec.Path, want)
			}
			kept++
		}
		if kept+int(dropped) != per || p.Summary.Requests != per || p.Summary.Dropped != dropped {
			t.Errorf("%s: kept %d, dropped %d, summary %+v; want %d in all", id, kept, dropped, p.Summary, per)
		}
	}
}

// After Close, records are ignored and Seal says the ledger is closed.
func TestClosedLedger(t *testing.T) {
	r := newRig(t, Config{}, "run-1")
	l := r.l
	l.Close()
	l.Record([]audit.Entry{entry("run-1", 0)})
	if err := l.Seal("run-1"); err != ErrClosed {
		t.Errorf("Seal after Close: %v", err)
	}
	if _, found, _ := r.store.EgressHead("run-1"); found {
		t.Error("a record after Close was stored")
	}
	r.store.Close()
	r.l = nil
}

// appendCanonical knows every field of egress.Record: a field added there
// must be written here too, or records holding it would hash differently
// on edge and in Fleet.
func TestCanonicalKnowsEveryField(t *testing.T) {
	var names []string
	rt := reflect.TypeFor[egress.Record]()
	for i := range rt.NumField() {
		names = append(names, strings.Split(rt.Field(i).Tag.Get("json"), ",")[0])
	}
	if got, want := strings.Join(names, " "), "seq ts via authority method path command status bytesUp bytesDown durationUs keys action reason rule alert dropped hash"; got != want {
		t.Fatalf("egress.Record's fields are\n%s\nappendCanonical writes\n%s", got, want)
	}
}

// The writer's canonical form is egress.Canonical's for any record, and
// any entry's record, stored and read back, hashes as it was hashed.
func FuzzCanonicalIsEgresss(f *testing.F) {
	f.Add(int64(1), int64(1_800_000_000_123456789), "proxy", "api.example.test:443", "GET", "/p?a=*", "", 200, int64(1), int64(-2), int64(3), "acme/K", "substituted", "<&>", "", "\u2028", int64(0))
	f.Add(int64(9), int64(0), "", "", "", "", "git-upload-pack", 0, int64(0), int64(0), int64(0), "", "dropped", "", "r", "", int64(7))
	f.Fuzz(func(t *testing.T, seq, ns int64, via, authority, method, path, command string, status int, up, down, dur int64, key, action, reason, rule, alert string, dropped int64) {
		r := egress.Record{Seq: seq, TS: time.Unix(0, ns).UTC(), Via: via, Authority: authority, Method: method, Path: path, Command: command,
			Status: status, BytesUp: up, BytesDown: down, DurationUs: dur, Action: action, Reason: reason, Rule: rule, Alert: alert, Dropped: dropped}
		if key != "" {
			r.Keys = []string{key, key + "2"}
		}
		want, err := egress.Canonical(r)
		got, gotErr := newEncoder().canonical(&r, nil)
		if (err != nil) != (gotErr != nil) {
			t.Fatalf("egress.Canonical: %v, the writer: %v", err, gotErr)
		}
		if err == nil && string(got) != string(want) {
			t.Fatalf("the writer's canonical form\n%s\negress.Canonical's\n%s", got, want)
		}
		// What a task's strings become in a record, once stored and read
		// back, hashes to the very bytes the writer hashed: a verifier
		// recomputes them from what it reads.
		e := audit.Entry{TS: r.TS, Task: "r", Action: audit.Action(action), Host: authority, Method: method, Path: path,
			Query: command, Reason: reason, Rule: rule, Alert: alert, Keys: r.Keys}
		rec := recordOf(&e)
		c, err := newEncoder().canonical(&rec, nil)
		if err != nil {
			t.Fatal(err)
		}
		stored := appendStored(nil, c, egress.Next(egress.Genesis("r"), c))
		read, err := decode(stored[:len(stored)-1])
		if err != nil {
			t.Fatalf("stored %q does not decode: %v", stored, err)
		}
		if again, _ := egress.Canonical(read); string(again) != string(c) {
			t.Fatalf("hashed\n%s\nread back as\n%s", c, again)
		}
	})
}
