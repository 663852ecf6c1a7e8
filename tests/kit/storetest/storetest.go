// Package storetest owns the contract of the store's roles (store.Hosts,
// store.Runs and the others, so of store.Store): one suite that every
// implementation runs in its own tests (boltstore on a temp file,
// dynamostore on a real moto_server), so both behave alike down to the
// sentinel errors, the page order and the expiry rules.
//
// The suite is organised by role, a file each: a role's cases take that
// role's interface, and a case that needs more than one role takes them
// together (hostsAndRuns). A new record kind adds its role's file, with its
// cases, and its cases to Run.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
)

// NewStore returns an empty store that reads the time from clk. It is called
// once per subtest; the store is released in t.Cleanup by the caller.
type NewStore func(t *testing.T, clk *clock.Fake) store.Store

// Start is the fake clock's starting time in every subtest: nanoseconds set,
// so a store that loses precision shows it.
var Start = time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.UTC)

// Run runs the contract suite against the store newStore makes: every
// role's cases. Subtests run in parallel, each on its own store.
func Run(t *testing.T, newStore NewStore) {
	for _, tc := range slices.Concat(
		hostsContract, hostDeletionContract, callersContract, idempotencyContract, runsContract,
		eventsContract, egressContract, sweepCursorContract, streamLeasesContract, routeViewContract, brokerStatesContract, queueContract, storeContract,
	) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := clock.NewFake(Start)
			tc.fn(t, newStore(t, clk), clk)
		})
	}
}

// contractCase is one case of the contract, run on a fresh store.
type contractCase struct {
	name string
	fn   func(t *testing.T, s store.Store, clk *clock.Fake)
}

// roleCase makes a case of fn, which takes only what it tests of the
// store: R is a role interface, or a few embedded together. store.Store
// embeds every role, so the store under test is an R unless a case asks
// for something no role has.
func roleCase[R any](name string, fn func(t *testing.T, s R, clk *clock.Fake)) contractCase {
	return contractCase{name: name, fn: func(t *testing.T, s store.Store, clk *clock.Fake) {
		r, ok := any(s).(R)
		if !ok {
			t.Fatalf("storetest: %s takes a %v, which %T is not", name, reflect.TypeFor[R](), s)
		}
		fn(t, r, clk)
	}}
}

// hostsAndRuns is what a case of runs on registered hosts takes: a
// listing's fixture, a host's deletion that finds its runs, writes of both
// cut short.
type hostsAndRuns interface {
	store.Hosts
	store.Runs
}

// storeContract is what every role promises (the store package's doc) and
// no one role's cases show.
var storeContract = []contractCase{
	roleCase("Context/Canceled", testContextCanceled),
}

var bg = context.Background()

// sameJSON compares two records through their JSON form, which shows every
// field (times included, to the nanosecond) in the failure message.
func sameJSON(t *testing.T, what string, got, want any) {
	t.Helper()
	g, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	w, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if string(g) != string(w) {
		t.Fatalf("%s:\n got  %s\n want %s", what, g, w)
	}
}

func wantErr(t *testing.T, what string, err, sentinel error) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("%s: error %v, want %v", what, err, sentinel)
	}
}

func noErr(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func sameIDs(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("%s:\n got  %v\n want %v", what, got, want)
	}
}

func testContextCanceled(t *testing.T, s hostsAndRuns, clk *clock.Fake) {
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if err := s.CreateHost(ctx, host("h1", clk.Now())); !errors.Is(err, context.Canceled) {
		t.Fatalf("CreateHost with a canceled context: %v", err)
	}
	if _, err := s.GetRun(ctx, "r1"); !errors.Is(err, context.Canceled) {
		t.Fatalf("GetRun with a canceled context: %v", err)
	}
	if _, err := s.GetHost(bg, "h1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a canceled CreateHost wrote anyway: %v", err)
	}
}
