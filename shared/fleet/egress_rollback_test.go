package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// A run's ledger sealed at an attempt's end (3 records), then grown by a
// retry (or a connection that closed late) and sealed again at its end
// (5): the head rolled back in the store to the first seal and its cursor
// hides the last two records. The mirror alone verifies (every seal signs
// a prefix of the same chain); the host's current seal, asked while it
// holds the run, says it sealed more.
func TestEgressVerificationHoldsAgainstAHeadRolledBackToAnEarlierSeal(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	host.AddEgress(run.ChildRunID, calls(3, "api.example.com:443")...)
	host.SealEgress(run.ChildRunID)
	_, first := host.Egress(run.ChildRunID)
	host.AddEgress(run.ChildRunID, calls(2, "exfil.example.net:443")...)
	host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, new(int), "")
	if _, err := e.f.SyncRunEgress(ctx, run.FleetRunID); err != nil {
		t.Fatal(err)
	}
	_, last := host.Egress(run.ChildRunID)
	if v := verifyOf(t, e.f, run.FleetRunID); !v.OK || v.Records != 5 || !v.HostChecked {
		t.Fatalf("untouched: %+v", v)
	}
	rewriteHead(t, e.st, run.FleetRunID, func(h *store.EgressHead) { h.Cursor, h.Seal = 3, sealJSON(t, first) })
	if v := verifyOf(t, e.f, run.FleetRunID); v.OK || !v.HostChecked || !strings.Contains(v.Problem, "the host's current seal covers 5 records, the mirror's 3") {
		t.Errorf("a head rolled back to an earlier seal verifies: %+v", v)
	}

	// Once the host has purged the run, the mirror is verified alone, and
	// says so.
	rewriteHead(t, e.st, run.FleetRunID, func(h *store.EgressHead) { h.Cursor, h.Seal = 5, sealJSON(t, last) })
	host.Forget(run.ChildRunID)
	if v := verifyOf(t, e.f, run.FleetRunID); !v.OK || v.HostChecked {
		t.Errorf("after the host's purge: %+v", v)
	}
}
