package fleet

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// rewriteHead replaces the stored head of run id as one with write access
// to the store would: change edits a copy of it.
func rewriteHead(t *testing.T, st store.Store, id string, change func(h *store.EgressHead)) {
	t.Helper()
	h := headOf(t, st, id)
	change(&h)
	if _, err := st.PutEgressHead(context.Background(), h); err != nil {
		t.Fatal(err)
	}
}

// sealJSON is s as a head stores it.
func sealJSON(t *testing.T, s *egress.Seal) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// verifyOf is ?verify=true's finding over run id's mirror, for alice.
func verifyOf(t *testing.T, f *Fleet, id string) EgressVerification {
	t.Helper()
	page, err := f.Egress(context.Background(), caller("alice"), id, 0, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	return *page.Verification
}

// The last records of a sealed ledger removed from the store, and the
// seal of another run of the same host (same key, same count) put in the
// head, each fail verification.
func TestEgressVerificationHoldsAgainstTheLastRecordsRemovedAndASwappedSeal(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	one, two := dispatched(t, e, "alice"), dispatched(t, e, "alice")
	for _, r := range []store.Run{one, two} {
		host.AddEgress(r.ChildRunID, calls(5, "api.example.com:443")...)
		host.SetRun(r.ChildRunID, hostproto.StatusSucceeded, new(int), "")
		if _, err := e.f.SyncRunEgress(ctx, r.FleetRunID); err != nil {
			t.Fatal(err)
		}
	}
	if v := verifyOf(t, e.f, one.FleetRunID); !v.OK {
		t.Fatalf("untouched: %+v", v)
	}
	lastGone := e.fleetOver(t, &egressTamper{Store: e.st, run: one.FleetRunID, change: func(recs []store.EgressRecord) []store.EgressRecord {
		out := recs[:0]
		for _, r := range recs {
			if r.Seq < 4 {
				out = append(out, r)
			}
		}
		return out
	}})
	if v := verifyOf(t, lastGone, one.FleetRunID); v.OK || !strings.Contains(v.Problem, "the seal covers 5 records, the ledger holds 3") {
		t.Errorf("the last two records removed: %+v", v)
	}
	_, otherSeal := host.Egress(two.ChildRunID)
	rewriteHead(t, e.st, one.FleetRunID, func(h *store.EgressHead) { h.Seal = sealJSON(t, otherSeal) })
	if v := verifyOf(t, e.f, one.FleetRunID); v.OK || !strings.Contains(v.Problem, "seal") {
		t.Errorf("another run's seal: %+v", v)
	}
}
