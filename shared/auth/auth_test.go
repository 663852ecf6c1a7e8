package auth

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/boltstore"
)

// newStore is a real store (bbolt) holding the given callers.
func newStore(t *testing.T, cs ...store.Caller) *boltstore.Store {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, c := range cs {
		if err := st.CreateCaller(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

func TestAuthenticate(t *testing.T) {
	token, hash, err := MintToken(bytes.NewReader(bytes.Repeat([]byte{7}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(token, TokenPrefix) || hash != HashToken(token) || len(hash) != 64 {
		t.Fatalf("minted %q %q", token, hash)
	}
	alice := store.Caller{OwnerID: "alice", TokenHash: hash, AllowedHosts: store.Scope{IDs: []string{"h1"}}, CreatedAt: time.Now()}
	st := newStore(t, alice)
	a := NewAuthenticator(st, "admin-token-0123456789")
	ctx := context.Background()

	for _, tc := range []struct {
		header string
		owner  string
		admin  bool
	}{
		{"Bearer " + token, "alice", false},
		{"bearer  " + token + " ", "alice", false},
		{"Bearer admin-token-0123456789", AdminOwnerID, true},
	} {
		c, err := a.Authenticate(ctx, tc.header)
		if err != nil || c.OwnerID != tc.owner || c.Admin != tc.admin {
			t.Errorf("Authenticate(%q) = %+v, %v", tc.header, c, err)
		}
	}
	for _, header := range []string{"", "Bearer", "Bearer ", "Basic " + token, token, "Bearer unknown-token",
		"Bearer " + strings.Repeat("x", 600), "Bearer admin-token-012345678"} {
		_, err := a.Authenticate(ctx, header)
		if !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("Authenticate(%q) = %v, want ErrUnauthenticated", header, err)
		}
	}

	// Without RUNFLEET_ADMIN_TOKEN there is no bootstrap admin: an empty token does not match it.
	none := NewAuthenticator(st, "")
	if _, err := none.Authenticate(ctx, "Bearer "); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("no admin: %v", err)
	}

	// A revoked caller is unknown at once.
	if err := st.DeleteCaller(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(ctx, "Bearer "+token); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("revoked: %v", err)
	}

	// A store fault (here: a closed store) is not an authentication failure.
	closed := newStore(t)
	closed.Close()
	_, err = NewAuthenticator(closed, "").Authenticate(ctx, "Bearer "+token)
	if err == nil || errors.Is(err, ErrUnauthenticated) || strings.Contains(err.Error(), token) {
		t.Fatalf("store fault: %v", err)
	}
}

func TestMintTokenIsRandom(t *testing.T) {
	a, _, err := MintToken(nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _, _ := MintToken(nil)
	if a == b || len(a) != len(TokenPrefix)+43 {
		t.Fatalf("tokens %q %q", a, b)
	}
	if _, _, err := MintToken(bytes.NewReader(make([]byte, 5))); err == nil {
		t.Fatal("a short random source was accepted")
	}
}

func TestCheckOwnerID(t *testing.T) {
	for _, ok := range []string{"alice", "team-a.ci_1", "A"} {
		if err := CheckOwnerID(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-x", "a b", "a#b", strings.Repeat("a", 65), "ünï"} {
		if err := CheckOwnerID(bad); err == nil || errors.Is(err, ErrReservedOwner) {
			t.Errorf("%q: %v, want a shape error", bad, err)
		}
	}
	for _, reserved := range []string{"admin", "Admin", "ADMIN"} {
		if err := CheckOwnerID(reserved); !errors.Is(err, ErrReservedOwner) {
			t.Errorf("%q: %v, want ErrReservedOwner", reserved, err)
		}
	}
}

func TestScopes(t *testing.T) {
	alice := store.Caller{OwnerID: "alice", AllowedHosts: store.Scope{IDs: []string{"h1"}}, AllowedProjects: store.Scope{All: true}}
	bob := store.Caller{OwnerID: "bob", AllowedHosts: store.Scope{All: true}, AllowedProjects: store.Scope{IDs: []string{"acme"}}}
	admin := BootstrapAdmin()
	run := store.Run{FleetRunID: "fr-1", OwnerID: "alice", HostID: "h1"}
	for _, tc := range []struct {
		name string
		got  bool
		want bool
	}{
		{"alice h1", CanUseHost(alice, "h1"), true},
		{"alice h2", CanUseHost(alice, "h2"), false},
		{"bob h2", CanUseHost(bob, "h2"), true},
		{"alice any project", CanUseProject(alice, "x"), true},
		{"bob acme", CanUseProject(bob, "acme"), true},
		{"bob other", CanUseProject(bob, "other"), false},
		{"alice own run", CanSeeRun(alice, run), true},
		{"bob alice's run", CanSeeRun(bob, run), false},
		{"admin alice's run", CanSeeRun(admin, run), true},
		{"admin any host", CanUseHost(admin, "zz"), true},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

// adminTokens is an AdminTokenSource a test sets: the token, or a fault.
type adminTokens struct {
	token string
	err   error
}

func (s *adminTokens) AdminToken(context.Context) (string, error) { return s.token, s.err }

// TestAdminTokenFromASource: the admin token is whatever the source says
// at each authentication; while it cannot be known, the admin's token is a
// fault (not a 401, and never quoted), and a minted caller still gets in.
func TestAdminTokenFromASource(t *testing.T) {
	token, hash, _ := MintToken(nil)
	st := newStore(t, store.Caller{OwnerID: "alice", TokenHash: hash, CreatedAt: time.Now()})
	src := &adminTokens{token: "admin-token-one-0123456789"}
	a := NewAuthenticatorWithSource(st, src)
	ctx := context.Background()
	if c, err := a.Authenticate(ctx, "Bearer admin-token-one-0123456789"); err != nil || !c.Admin {
		t.Fatalf("admin: %+v %v", c, err)
	}
	src.token = "admin-token-two-0123456789"
	if _, err := a.Authenticate(ctx, "Bearer admin-token-one-0123456789"); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("the replaced admin token: %v, want ErrUnauthenticated", err)
	}
	if c, err := a.Authenticate(ctx, "Bearer admin-token-two-0123456789"); err != nil || !c.Admin {
		t.Fatalf("the new admin token: %+v %v", c, err)
	}
	src.err = errors.New("secrets manager: throttled")
	_, err := a.Authenticate(ctx, "Bearer admin-token-two-0123456789")
	if err == nil || errors.Is(err, ErrUnauthenticated) || strings.Contains(err.Error(), "admin-token-two") {
		t.Fatalf("admin token unknowable: %v, want a fault that does not quote the token", err)
	}
	if c, err := a.Authenticate(ctx, "Bearer "+token); err != nil || c.OwnerID != "alice" {
		t.Fatalf("a minted caller while the admin token is unknowable: %+v %v", c, err)
	}
}
