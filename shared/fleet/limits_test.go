package fleet

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/auth"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// touchless is a store that counts every call that names a key.
type touchless struct {
	store.Store
	calls atomic.Int32
}

func (s *touchless) GetRun(ctx context.Context, id string) (store.Run, error) {
	s.calls.Add(1)
	return s.Store.GetRun(ctx, id)
}

func (s *touchless) GetHost(ctx context.Context, id string) (store.Host, error) {
	s.calls.Add(1)
	return s.Store.GetHost(ctx, id)
}

func (s *touchless) SetHostEnabled(ctx context.Context, id string, enabled bool) (store.Host, error) {
	s.calls.Add(1)
	return s.Store.SetHostEnabled(ctx, id, enabled)
}

func (s *touchless) DeleteHost(ctx context.Context, id string, force bool) (store.HostDeletion, error) {
	s.calls.Add(1)
	return s.Store.DeleteHost(ctx, id, force)
}

func (s *touchless) DeleteCaller(ctx context.Context, owner string) error {
	s.calls.Add(1)
	return s.Store.DeleteCaller(ctx, owner)
}

// TestPathIDsOfAnotherShapeAreUnknownWithoutAStoreCall: an id that its
// kind's shape rules out is 404 naming it (cut short), and never reaches
// the store (DynamoDB refuses a key over 2048 bytes even on a read).
func TestPathIDsOfAnotherShapeAreUnknownWithoutAStoreCall(t *testing.T) {
	e := newTestEnv(t, time.Second)
	st := &touchless{Store: e.st}
	f := e.fleetOver(t, st)
	ctx := context.Background()
	admin := auth.BootstrapAdmin()
	long := strings.Repeat("x", 3000)
	for _, id := range []string{long, "fr-unknown", "fr-" + strings.Repeat("A", 26), "run-1", ""} {
		_, err := f.RunFor(ctx, admin, id)
		if !isKind(err, KindNotFound) || len(err.Error()) > 200 {
			t.Errorf("RunFor(%.20q) = %v, want a short 404", id, err)
		}
	}
	for name, call := range map[string]func(id string) error{
		"Host":           func(id string) error { _, err := f.Host(ctx, id); return err },
		"ProbeHost":      func(id string) error { _, err := f.ProbeHost(ctx, id); return err },
		"SetHostEnabled": func(id string) error { _, err := f.SetHostEnabled(ctx, id, true); return err },
		"DeleteHost":     func(id string) error { _, err := f.DeleteHost(ctx, id, true); return err },
		"RevokeCaller":   func(id string) error { return f.RevokeCaller(ctx, id) },
	} {
		for _, id := range []string{long, "a b", "-x", "a/b"} {
			if err := call(id); !isKind(err, KindNotFound) || !strings.Contains(err.Error(), id[:min(len(id), 10)]) {
				t.Errorf("%s(%.20q) = %v, want 404 naming it", name, id, err)
			}
		}
	}
	if n := st.calls.Load(); n != 0 {
		t.Fatalf("%d store calls for ids that name nothing", n)
	}

	// A well-formed unknown id still asks the store.
	if _, err := f.RunFor(ctx, admin, "fr-"+strings.Repeat("a", 26)); !isKind(err, KindNotFound) || st.calls.Load() != 1 {
		t.Fatalf("a well-formed unknown run: %v after %d store calls", err, st.calls.Load())
	}
}

// TestProbeRefusesAHealthAnswerTooLargeToRecord: a host reporting more
// agents (or a longer version or limits) than a probe records is
// bad_response, with the reason, so the host's item never outgrows the store.
func TestProbeRefusesAHealthAnswerTooLargeToRecord(t *testing.T) {
	e := newTestEnv(t, time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	agents := make([]string, maxProbeAgents+1)
	for i := range agents {
		agents[i] = fmt.Sprintf("agent-%d", i)
	}
	host.SetAgents(agents...)
	p, err := e.f.ProbeHost(context.Background(), "h1")
	if err != nil || p.Status != store.ProbeBadResponse || !strings.Contains(p.Detail, "65 agents") || len(p.Agents) != 0 {
		t.Fatalf("probe = %+v, %v", p, err)
	}
	host.SetAgents(strings.Repeat("a", maxProbeAgentName+1))
	if p, _ := e.f.ProbeHost(context.Background(), "h1"); p.Status != store.ProbeBadResponse || !strings.Contains(p.Detail, "agent name") {
		t.Fatalf("probe = %+v", p)
	}
	host.SetAgents("shell")
	host.SetLimits(&hostproto.Limits{Enforced: hostproto.LimitsUnavailable, Detail: strings.Repeat("d", maxProbeLimits)})
	if p, _ := e.f.ProbeHost(context.Background(), "h1"); p.Status != store.ProbeBadResponse || !strings.Contains(p.Detail, "limits") || p.Limits != nil {
		t.Fatalf("probe = %+v", p)
	}
	host.SetLimits(nil)
	if p, _ := e.f.ProbeHost(context.Background(), "h1"); p.Status != store.ProbeOK {
		t.Fatalf("probe = %+v", p)
	}
}
