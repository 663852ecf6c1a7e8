package stream

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/ssetest"
)

// ledgerCall is a ledger record of one call to authority.
func ledgerCall(authority string) egress.Record {
	return egress.Record{Via: egress.ViaProxy, Authority: authority, Method: "GET", Path: "/", Status: 200, Action: egress.Forwarded}
}

// egressStream reads messages until one named stop, returning each
// "event" and "egress" message as "<kind> <id>" (each id checked against
// its data's sequence), the ledger records' authorities, and the stop.
func egressStream(t *testing.T, ch <-chan ssetest.Message, stop string) ([]string, []string, ssetest.Message) {
	t.Helper()
	var seen, authorities []string
	for {
		m := next(t, ch)
		switch m.Event {
		case fleetapi.SSEEvent:
			var ev hostproto.Event
			if err := json.Unmarshal([]byte(m.Data), &ev); err != nil || !strings.HasPrefix(m.ID, fmt.Sprint(ev.Sequence)+":") {
				t.Fatalf("event id %q for %s (%v)", m.ID, m.Data, err)
			}
			seen = append(seen, "event "+m.ID)
		case fleetapi.SSEEgress:
			var r fleetapi.EgressRecord
			if err := json.Unmarshal([]byte(m.Data), &r); err != nil || !strings.HasSuffix(m.ID, fmt.Sprintf(":%d", r.Seq)) || r.Hash == "" {
				t.Fatalf("egress id %q for %s (%v)", m.ID, m.Data, err)
			}
			seen = append(seen, "egress "+m.ID)
			authorities = append(authorities, r.Authority)
		case stop:
			return seen, authorities, m
		case "", fleetapi.SSESnapshot:
		default:
			t.Fatalf("unexpected message %+v", m)
		}
	}
}

// TestStreamCarriesTheLedgerAndResumesBothCursors: with ?egress=true the
// stream sends each ledger record after the poll's events, in ledger
// order, each id "<event seq>:<ledger seq>"; a client resuming with a
// Last-Event-ID gets neither kind again and loses neither; done names
// both cursors.
func TestStreamCarriesTheLedgerAndResumesBothCursors(t *testing.T) {
	e := newEnv(t, envOptions{ticks: true})
	run := e.dispatch(t, "alice")
	e.host.AddEgress(run.ChildRunID, ledgerCall("a.example.com:443"), ledgerCall("b.example.com:443"))
	e.sweep(t) // the event mirrored; two records, under a batch, left on the host

	ch := ssetest.Read(e.open(t, run.FleetRunID, "?egress=true").Body)
	seen, auths, snap := egressStream(t, ch, fleetapi.SSESnapshot)
	if fmt.Sprint(seen) != "[event 1:0 egress 1:1 egress 1:2]" || fmt.Sprint(auths) != "[a.example.com:443 b.example.com:443]" ||
		snap.Data != `{"cursor":1,"status":"pending","attempt":1,"live":true,"egressCursor":2}` {
		t.Fatalf("backlog %v %v, snapshot %s", seen, auths, snap.Data)
	}

	// Live: the next poll copies the host's new record at once (a
	// watched ledger is not batched) and interleaves it with the events.
	e.host.AppendOutput(run.ChildRunID, "working\n")
	e.host.AddEgress(run.ChildRunID, ledgerCall("c.example.com:443"))
	e.tick(t)
	if seen, _, _ := egressStreamN(t, ch, 2); fmt.Sprint(seen) != "[event 2:2 egress 2:3]" {
		t.Fatalf("live %v", seen)
	}

	// The run ends: its last record and state come, then done with both
	// cursors, once the ledger is sealed and the run drained.
	e.host.AddEgress(run.ChildRunID, ledgerCall("d.example.com:443"))
	e.host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, new(int), "")
	e.tick(t)
	seen, _, done := egressStream(t, ch, fleetapi.SSEDone)
	if fmt.Sprint(seen) != "[event 3:3 egress 3:4]" ||
		done.Data != `{"cursor":3,"status":"succeeded","attempt":1,"exitCode":0,"egressCursor":4}` {
		t.Fatalf("end: %v then done %s", seen, done.Data)
	}
	if m, ok := await.RecvOK(t, "the stream to end", ch); ok {
		t.Fatalf("a message after done: %+v", m)
	}
	e.logs.wait(t, `"msg":"stream"`, `"end":"done"`, `"egressRecords":4`)

	// A client that had only the event 2:2 resumes: neither kind comes
	// twice, none is lost.
	again := ssetest.Read(e.open(t, run.FleetRunID, "?egress=true", "Last-Event-ID", "2:2").Body)
	if seen, auths, _ := egressStream(t, again, fleetapi.SSEDone); fmt.Sprint(seen) != "[event 3:2 egress 3:3 egress 3:4]" ||
		fmt.Sprint(auths) != "[c.example.com:443 d.example.com:443]" {
		t.Fatalf("resumed from 2:2: %v %v", seen, auths)
	}
	// ?egressAfter= resumes the ledger as ?after= resumes events.
	third := ssetest.Read(e.open(t, run.FleetRunID, "?egress=true&after=2&egressAfter=1").Body)
	if seen, auths, _ := egressStream(t, third, fleetapi.SSEDone); fmt.Sprint(seen) != "[event 3:1 egress 3:2 egress 3:3 egress 3:4]" ||
		fmt.Sprint(auths) != "[b.example.com:443 c.example.com:443 d.example.com:443]" {
		t.Fatalf("from egressAfter=1: %v %v", seen, auths)
	}
}

// egressStreamN reads until n "event" or "egress" messages came.
func egressStreamN(t *testing.T, ch <-chan ssetest.Message, n int) ([]string, []string, ssetest.Message) {
	t.Helper()
	var seen []string
	for len(seen) < n {
		m := next(t, ch)
		if m.Event == fleetapi.SSEEvent || m.Event == fleetapi.SSEEgress {
			seen = append(seen, m.Event+" "+m.ID)
		}
	}
	return seen, nil, ssetest.Message{}
}

// TestStreamWithoutEgressKeepsPlainIDsAndRefusesALedgerCursor: a stream
// not asked for egress sends no ledger and plain ids, and refuses a
// ledger cursor (a paired Last-Event-ID, egressAfter) rather than half
// take it.
func TestStreamWithoutEgressKeepsPlainIDsAndRefusesALedgerCursor(t *testing.T) {
	e := newEnv(t, envOptions{})
	run := e.dispatch(t, "alice")
	e.host.AddEgress(run.ChildRunID, ledgerCall("a.example.com:443"))
	e.host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, new(int), "")
	e.sweep(t)
	seqs, done := eventsUntil(t, ssetest.Read(e.open(t, run.FleetRunID, "").Body), fleetapi.SSEDone)
	if fmt.Sprint(seqs) != "[1 2]" || strings.Contains(done.Data, "egress") {
		t.Fatalf("a plain stream: %v, done %s", seqs, done.Data)
	}
	for _, c := range []struct {
		query   string
		headers []string
		mention string
	}{
		{"", []string{"Last-Event-ID", "2:1"}, "egress=true"},
		{"?egressAfter=1", nil, "egress=true"},
		{"?egress=true", []string{"Last-Event-ID", "2:x"}, "<event seq>:<ledger seq>"},
		{"?egress=yes", nil, "egress"},
	} {
		resp := e.open(t, run.FleetRunID, c.query, c.headers...)
		var body fleetapi.Error
		json.NewDecoder(resp.Body).Decode(&body)
		if resp.StatusCode != 400 || !strings.Contains(body.Error, c.mention) {
			t.Errorf("%s %v: %d %+v, want 400 mentioning %q", c.query, c.headers, resp.StatusCode, body, c.mention)
		}
	}
}

// TestAnIdleStreamWithEgressResumesBothCursors: a quiet run's stream with
// egress ends idle with the paired id and a resume path that carries the
// ledger's cursor too.
func TestAnIdleStreamWithEgressResumesBothCursors(t *testing.T) {
	e := newEnv(t, envOptions{ticks: true, cfg: Config{IdleTimeout: 3 * time.Second, KeepAlive: time.Hour, MaxDuration: time.Hour}})
	run := e.dispatch(t, "alice")
	e.host.AddEgress(run.ChildRunID, ledgerCall("a.example.com:443"))
	ch := ssetest.Read(e.open(t, run.FleetRunID, "?egress=true").Body)
	egressStream(t, ch, fleetapi.SSESnapshot)
	for range 3 {
		e.tick(t)
	}
	idle := next(t, ch)
	var data fleetapi.StreamIdle
	if err := json.Unmarshal([]byte(idle.Data), &data); err != nil || idle.Event != fleetapi.SSEIdle || idle.ID != "1:1" ||
		data.Resume != "/fleet/runs/"+run.FleetRunID+"/stream?after=1&egress=true&egressAfter=1" || data.EgressCursor == nil || *data.EgressCursor != 1 {
		t.Fatalf("idle %+v (%v)", idle, err)
	}
	if hint := next(t, ch); len(hint.Comments) != 1 || !strings.Contains(hint.Comments[0], "Last-Event-ID: 1:1") {
		t.Fatalf("after the idle event: %+v", hint)
	}
}
