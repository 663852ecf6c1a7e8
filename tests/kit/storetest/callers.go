package storetest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// callersContract is store.Callers' contract.
var callersContract = []contractCase{
	roleCase("Callers/CreateLookupList", testCallersCreateLookupList),
	roleCase("Callers/CreateExisting", testCallersCreateExisting),
	roleCase("Callers/ConcurrentCreate", testCallersConcurrentCreate),
	roleCase("Callers/Delete", testCallersDelete),
}

func caller(owner string, at time.Time) store.Caller {
	return store.Caller{
		OwnerID:         owner,
		TokenHash:       fmt.Sprintf("%064x", len(owner)*1000+int(owner[0])),
		AllowedHosts:    store.Scope{IDs: []string{"h1", "h2"}},
		AllowedProjects: store.Scope{All: true},
		CreatedAt:       at,
	}
}

func testCallersCreateLookupList(t *testing.T, s store.Callers, clk *clock.Fake) {
	bob := caller("bob", clk.Now())
	admin := store.Caller{OwnerID: "admin", TokenHash: strings.Repeat("ab", 32), Admin: true,
		AllowedHosts: store.Scope{All: true}, AllowedProjects: store.Scope{All: true}, CreatedAt: clk.Now()}
	carol := caller("carol", clk.Now())
	carol.AllowedProjects = store.Scope{IDs: []string{"acme"}}
	carol.AllowedHosts = store.Scope{}
	for _, c := range []store.Caller{bob, admin, carol} {
		noErr(t, "CreateCaller "+c.OwnerID, s.CreateCaller(bg, c))
	}
	got, err := s.CallerByTokenHash(bg, carol.TokenHash)
	noErr(t, "CallerByTokenHash", err)
	sameJSON(t, "caller by token", got, carol)
	got, err = s.CallerByTokenHash(bg, admin.TokenHash)
	noErr(t, "CallerByTokenHash admin", err)
	sameJSON(t, "admin by token", got, admin)
	_, err = s.CallerByTokenHash(bg, strings.Repeat("0", 64))
	wantErr(t, "unknown token", err, store.ErrNotFound)

	list, err := s.ListCallers(bg)
	noErr(t, "ListCallers", err)
	sameJSON(t, "ListCallers", list, []store.Caller{admin, bob, carol})
}

func testCallersCreateExisting(t *testing.T, s store.Callers, clk *clock.Fake) {
	bob := caller("bob", clk.Now())
	noErr(t, "CreateCaller", s.CreateCaller(bg, bob))

	sameOwner := bob
	sameOwner.TokenHash = strings.Repeat("cd", 32)
	wantErr(t, "CreateCaller same ownerId", s.CreateCaller(bg, sameOwner), store.ErrExists)
	_, err := s.CallerByTokenHash(bg, sameOwner.TokenHash)
	wantErr(t, "token of the refused caller", err, store.ErrNotFound)

	sameToken := caller("dave", clk.Now())
	sameToken.TokenHash = bob.TokenHash
	wantErr(t, "CreateCaller same token", s.CreateCaller(bg, sameToken), store.ErrExists)
	got, err := s.CallerByTokenHash(bg, bob.TokenHash)
	noErr(t, "CallerByTokenHash", err)
	sameJSON(t, "token still maps to bob", got, bob)
	list, err := s.ListCallers(bg)
	noErr(t, "ListCallers", err)
	sameJSON(t, "no half-written caller", list, []store.Caller{bob})
}

func testCallersConcurrentCreate(t *testing.T, s store.Callers, clk *clock.Fake) {
	const n = 10
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := caller("erin", clk.Now())
			c.TokenHash = fmt.Sprintf("%064x", i+1)
			errs[i] = s.CreateCaller(bg, c)
		}()
	}
	await.Group(t, "the concurrent CreateCallers", &wg)
	winners := 0
	for _, err := range errs {
		switch {
		case err == nil:
			winners++
		case !errors.Is(err, store.ErrExists):
			t.Fatalf("CreateCaller: %v", err)
		}
	}
	if winners != 1 {
		t.Fatalf("%d concurrent creates of one ownerId succeeded, want 1", winners)
	}
	found := 0
	for i := range n {
		if _, err := s.CallerByTokenHash(bg, fmt.Sprintf("%064x", i+1)); err == nil {
			found++
		}
	}
	if found != 1 {
		t.Fatalf("%d tokens resolve, want 1", found)
	}
}

func testCallersDelete(t *testing.T, s store.Callers, clk *clock.Fake) {
	bob, carol := caller("bob", clk.Now()), caller("carol", clk.Now())
	noErr(t, "CreateCaller bob", s.CreateCaller(bg, bob))
	noErr(t, "CreateCaller carol", s.CreateCaller(bg, carol))
	noErr(t, "DeleteCaller", s.DeleteCaller(bg, "bob"))
	_, err := s.CallerByTokenHash(bg, bob.TokenHash)
	wantErr(t, "token after delete", err, store.ErrNotFound)
	list, err := s.ListCallers(bg)
	noErr(t, "ListCallers", err)
	sameJSON(t, "ListCallers after delete", list, []store.Caller{carol})
	wantErr(t, "DeleteCaller twice", s.DeleteCaller(bg, "bob"), store.ErrNotFound)

	// The ownerId is free again, with a new token; the old one stays dead.
	again := bob
	again.TokenHash = strings.Repeat("ef", 32)
	noErr(t, "CreateCaller again", s.CreateCaller(bg, again))
	_, err = s.CallerByTokenHash(bg, bob.TokenHash)
	wantErr(t, "old token after re-create", err, store.ErrNotFound)
	got, err := s.CallerByTokenHash(bg, again.TokenHash)
	noErr(t, "new token", err)
	sameJSON(t, "re-created caller", got, again)
}
