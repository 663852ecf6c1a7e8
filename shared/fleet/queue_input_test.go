package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/shared/store"
)

// TestAClassTooLongToIndexIsRefusedNamingIt: labels whose escaped routing
// class is longer than the queue index keeps (long values, characters
// escaped three to one) make a dispatch that asks to wait a 400 naming
// queue and the labels, before anything is written; under Fleet's
// default wait the same dispatch answers as it always did (409
// no_eligible_host). Labels that fit wait as any.
func TestAClassTooLongToIndexIsRefusedNamingIt(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	ctx := context.Background()
	long := map[string]string{"a": strings.Repeat("#", MaxLabelValue), "b": strings.Repeat("/", 10)}
	req := DispatchRequest{Labels: long, Run: runspec.Request{Agent: "shell"}, Queue: waitHour}
	_, err := e.f.Dispatch(ctx, caller("alice"), req, "k1")
	if !isKind(err, KindInvalid) || !strings.Contains(err.Error(), "queue") || !strings.Contains(err.Error(), "labels") {
		t.Fatalf("dispatch: %v; want 400 naming queue and labels", err)
	}
	if page, err := e.st.ListRuns(ctx, store.RunQuery{}); err != nil || len(page.Runs) != 0 {
		t.Fatalf("runs written: %+v, %v", page.Runs, err)
	}

	cfg := e.f.cfg
	cfg.QueueDefault = time.Hour
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req.Queue = nil
	if _, err := f.Dispatch(ctx, caller("alice"), req, "k2"); !isCode(err, CodeNoEligibleHost) {
		t.Fatalf("under the default: %v; want 409 %s", err, CodeNoEligibleHost)
	}

	fits := map[string]string{"a": strings.Repeat("#", 100), "b": "x y&z=1"}
	res, err := e.f.Dispatch(ctx, caller("alice"), DispatchRequest{Labels: fits, Run: runspec.Request{Agent: "shell"}, Queue: waitHour}, "k3")
	if err != nil || res.Run.Status != store.StatusQueued || res.Position != 1 {
		t.Fatalf("labels that fit: %+v, %v", res, err)
	}
	if agent, labels, err := ParseClass(res.Run.Queue.Class); err != nil || agent != "shell" || labels["a"] != fits["a"] || labels["b"] != fits["b"] {
		t.Fatalf("class %q reads back as %s %v, %v", res.Run.Queue.Class, agent, labels, err)
	}
}
