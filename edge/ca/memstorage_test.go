package ca

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"testing"
	"time"
)

func TestMemoryStorageContract(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	s := newMemoryStorage(func() time.Time { return at })

	if _, err := s.Load(ctx, "certificates/x/a.crt"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load of a missing key: %v, want fs.ErrNotExist", err)
	}
	if _, err := s.Stat(ctx, "certificates"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Stat of a missing key: %v, want fs.ErrNotExist", err)
	}
	if _, err := s.List(ctx, "certificates", true); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("List of an empty dir: %v, want fs.ErrNotExist", err)
	}

	value := []byte("leaf")
	for _, k := range []string{"certificates/x/a/a.crt", "certificates/x/a/a.key", "certificates/x/b/b.crt", "other"} {
		if err := s.Store(ctx, k, value); err != nil {
			t.Fatal(err)
		}
	}
	value[0] = 'X' // the storage keeps its own copy
	got, err := s.Load(ctx, "certificates/x/a/a.crt")
	if err != nil || string(got) != "leaf" {
		t.Fatalf("Load = %q, %v", got, err)
	}
	got[0] = 'Y'
	if again, _ := s.Load(ctx, "certificates/x/a/a.crt"); string(again) != "leaf" {
		t.Fatal("a loaded value aliases the stored one")
	}

	for key, want := range map[string]bool{"certificates": true, "certificates/x/a": true, "certificates/x/a/a.crt": true, "certificates/x/c": false, "cert": false} {
		if got := s.Exists(ctx, key); got != want {
			t.Errorf("Exists(%q) = %v, want %v", key, got, want)
		}
	}
	if info, err := s.Stat(ctx, "certificates/x/a/a.crt"); err != nil || !info.IsTerminal || info.Size != 4 || !info.Modified.Equal(at) {
		t.Errorf("Stat of a value = %+v, %v", info, err)
	}
	if info, err := s.Stat(ctx, "certificates/x"); err != nil || info.IsTerminal {
		t.Errorf("Stat of a directory = %+v, %v", info, err)
	}

	flat, err := s.List(ctx, "certificates/x", false)
	if err != nil || !slices.Equal(flat, []string{"certificates/x/a", "certificates/x/b"}) {
		t.Errorf("List non-recursive = %q, %v", flat, err)
	}
	deep, err := s.List(ctx, "certificates", true)
	want := []string{"certificates/x", "certificates/x/a", "certificates/x/a/a.crt", "certificates/x/a/a.key", "certificates/x/b", "certificates/x/b/b.crt"}
	if err != nil || !slices.Equal(deep, want) {
		t.Errorf("List recursive = %q, %v", deep, err)
	}

	if err := s.Delete(ctx, "certificates/x/a"); err != nil {
		t.Fatal(err)
	}
	if s.Exists(ctx, "certificates/x/a/a.key") || !s.Exists(ctx, "certificates/x/b/b.crt") {
		t.Error("Delete of a directory did not remove exactly what is below it")
	}
	if err := s.Delete(ctx, "no/such/key"); err != nil {
		t.Errorf("Delete of a missing key: %v", err)
	}
	if err := s.Delete(ctx, "certificates/x/b/b.crt"); err != nil {
		t.Fatal(err)
	}
	if s.Exists(ctx, "certificates") || !s.Exists(ctx, "other") {
		t.Error("a directory emptied by Delete still exists, or Delete removed too much")
	}
	if keys, err := s.List(ctx, "", true); err != nil || !slices.Equal(keys, []string{"other"}) {
		t.Errorf("List of the root = %q, %v", keys, err)
	}
	// Deleting a directory that is its parent's only child empties the parent too.
	for _, k := range []string{"certificates/y/site/site.crt", "certificates/y/site/site.key"} {
		if err := s.Store(ctx, k, value); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Delete(ctx, "certificates/y/site"); err != nil {
		t.Fatal(err)
	}
	if s.Exists(ctx, "certificates/y") || s.Exists(ctx, "certificates") {
		t.Error("directories emptied by deleting a subdirectory still exist")
	}
}

func TestMemoryStorageLock(t *testing.T) {
	ctx := context.Background()
	s := newMemoryStorage(time.Now)
	if err := s.Lock(ctx, "issue_cert_a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Lock(ctx, "issue_cert_b"); err != nil {
		t.Fatal("a lock of another name blocked")
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Lock(canceled, "issue_cert_a"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock of a held name with a cancelled ctx: %v", err)
	}
	acquired := make(chan error)
	go func() { acquired <- s.Lock(ctx, "issue_cert_a") }()
	select {
	case <-acquired:
		t.Fatal("Lock of a held name did not wait")
	default:
	}
	if err := s.Unlock(ctx, "issue_cert_a"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-acquired:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter never got the released lock")
	}
	if err := s.Unlock(ctx, "never_locked"); err == nil {
		t.Error("Unlock of a name not held succeeded")
	}
}
