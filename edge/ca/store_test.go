package ca_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/ca"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

func TestRestartAtEveryPhaseReturnsTheSameCAFromDisk(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewFake(epoch)
	cfg := shortConfig(t, dir, clk) // successor at 6h, switch at 9h, end at 10h
	a := mustOpen(t, cfg)
	phases := []struct {
		name         string
		at           time.Duration
		certs        int
		hasSuccessor bool
	}{
		{"before the successor window", 2 * time.Hour, 1, false},
		{"with a successor", 7 * time.Hour, 2, true},
		{"after the switch", 9*time.Hour + 30*time.Minute, 1, false},
	}
	var switchedFrom string
	for _, ph := range phases {
		clk.Set(epoch.Add(ph.at))
		bundle, status := a.Bundle(), a.Status()
		if n := bytes.Count(bundle, []byte("BEGIN CERTIFICATE")); n != ph.certs || (status.Successor != nil) != ph.hasSuccessor {
			t.Fatalf("%s: %d certificates, successor %v", ph.name, n, status.Successor != nil)
		}
		if ph.name == "with a successor" {
			switchedFrom = status.Successor.Fingerprint
		}
		store := dirFiles(t, cfg.Dir)
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		cfg.Sealer = reopenSealer(t, dir) // a new process reads the seal key afresh
		a = mustOpen(t, cfg)
		if got := a.Bundle(); !bytes.Equal(got, bundle) {
			t.Errorf("%s: after a restart the bundle differs:\n%s\nwant\n%s", ph.name, got, bundle)
		}
		if got := a.Status(); !statusEqual(got, status) {
			t.Errorf("%s: after a restart the status is %+v, want %+v", ph.name, got, status)
		}
		if cert, err := leafFor(a, proxiedName); err != nil {
			t.Errorf("%s: after a restart: %v", ph.name, err)
		} else if err := verifyLeaf(t, cert, bundle, proxiedName, clk.Now()); err != nil {
			t.Errorf("%s: after a restart the leaf does not verify against the bundle from before: %v", ph.name, err)
		}
		for path, b := range dirFiles(t, cfg.Dir) {
			if !bytes.Equal(store[path], b) && !strings.HasSuffix(path, "/lock") {
				t.Errorf("%s: the restart rewrote %s", ph.name, path)
			}
		}
	}
	if a.Status().Signer.Fingerprint != switchedFrom {
		t.Error("after the switch the signer is not the former successor")
	}
}

func statusEqual(a, b ca.Status) bool {
	if a.Signer != b.Signer || (a.Successor == nil) != (b.Successor == nil) {
		return false
	}
	return a.Successor == nil || *a.Successor == *b.Successor
}

func reopenSealer(t *testing.T, dir string) *ca.FileSealer {
	t.Helper()
	s, err := ca.NewFileSealer(filepath.Join(dir, "seal.key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestCAThatEndedWhileEdgeWasDownIsReplacedAtStart(t *testing.T) {
	tests := []struct {
		name string
		// closeAt is when edge stops; openAt when it starts again.
		closeAt, openAt time.Duration
		// want: which CA signs after the start.
		want string
	}{
		{"the signer passed its switch point with no successor", 2 * time.Hour, 9*time.Hour + 30*time.Minute, "new"},
		{"the signer expired with no successor", 2 * time.Hour, 30 * time.Hour, "new"},
		{"the signer passed its switch point; its successor signs", 7 * time.Hour, 9*time.Hour + 30*time.Minute, "successor"},
		{"the successor's own window opened meanwhile", 7 * time.Hour, 13*time.Hour + 30*time.Minute, "successor"},
		{"the successor too passed its switch point", 7 * time.Hour, 17 * time.Hour, "new"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			clk := clock.NewFake(epoch)
			cfg := shortConfig(t, dir, clk)
			a := mustOpen(t, cfg)
			clk.Set(epoch.Add(tc.closeAt))
			before := a.Status()
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			clk.Set(epoch.Add(tc.openAt))
			a = mustOpen(t, cfg)
			now := clk.Now()
			after := a.Status()
			if !after.Valid(now) {
				t.Fatalf("after the start the signer is not valid: %+v", after.Signer)
			}
			switch tc.want {
			case "successor":
				if after.Signer.Fingerprint != before.Successor.Fingerprint {
					t.Fatalf("the signer is %s, want the former successor %s", after.Signer.Fingerprint, before.Successor.Fingerprint)
				}
			case "new":
				if after.Signer.Fingerprint == before.Signer.Fingerprint ||
					(before.Successor != nil && after.Signer.Fingerprint == before.Successor.Fingerprint) {
					t.Fatal("a CA past its switch point still signs")
				}
			}
			if !now.Before(after.Signer.NotAfter.Add(-cfg.SwitchBefore)) {
				t.Fatalf("the signer is past its own switch point at start")
			}
			wantSuccessor := !now.Before(after.Signer.NotAfter.Add(-cfg.SuccessorWindow))
			if (after.Successor != nil) != wantSuccessor {
				t.Fatalf("successor present %v, want %v", after.Successor != nil, wantSuccessor)
			}
			cert, err := leafFor(a, proxiedName)
			if err != nil {
				t.Fatal(err)
			}
			if err := verifyLeaf(t, cert, a.Bundle(), proxiedName, now); err != nil {
				t.Fatalf("the leaf after the start does not verify: %v", err)
			}
			if err := handshake(t, a, proxiedName, a.Bundle(), now); err != nil {
				t.Fatalf("handshake after the start: %v", err)
			}
		})
	}
}

func TestUnopenableStoreRefusesTheStartAndMintsNothing(t *testing.T) {
	tests := []struct {
		name   string
		damage func(t *testing.T, dir, store string)
		want   error
		says   string
	}{
		{"a tampered sealed key", func(t *testing.T, dir, store string) {
			editStore(t, store, func(a map[string]any) {
				sealed := a["sealedKey"].(string)
				i := len(sealed) / 2
				c := byte('A')
				if sealed[i] == 'A' {
					c = 'B'
				}
				a["sealedKey"] = sealed[:i] + string(c) + sealed[i+1:]
			})
		}, ca.ErrSealedKey, "altered"},
		{"a truncated sealed key", func(t *testing.T, dir, store string) {
			editStore(t, store, func(a map[string]any) {
				sealed := a["sealedKey"].(string)
				a["sealedKey"] = sealed[:len(sealed)-8]
			})
		}, ca.ErrSealedKey, "sealed CA key cannot be opened"},
		{"a tampered certificate", func(t *testing.T, dir, store string) {
			editStore(t, store, func(a map[string]any) {
				// Another valid CA certificate: the sealed key is bound to the old one.
				other := mustOpen(t, shortConfig(t, t.TempDir(), clock.NewFake(epoch)))
				a["certificate"] = string(other.Bundle())
			})
		}, ca.ErrSealedKey, "altered"},
		{"a wrong seal key", func(t *testing.T, dir, store string) {
			writeFile(t, filepath.Join(dir, "seal.key"), bytes.Repeat([]byte{7}, 32))
		}, ca.ErrSealedKey, "sealed under another seal key"},
		{"a lost seal key", func(t *testing.T, dir, store string) {
			if err := os.Remove(filepath.Join(dir, "seal.key")); err != nil {
				t.Fatal(err)
			}
		}, ca.ErrSealedKey, "seal.key"},
		{"a truncated store file", func(t *testing.T, dir, store string) {
			b, err := os.ReadFile(store)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, store, b[:len(b)/2])
		}, ca.ErrStoreUnreadable, "truncated or corrupt"},
		{"an empty store file", func(t *testing.T, dir, store string) {
			writeFile(t, store, nil)
		}, ca.ErrStoreUnreadable, "truncated or corrupt"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			clk := clock.NewFake(epoch)
			cfg := shortConfig(t, dir, clk)
			a := mustOpen(t, cfg)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			store := filepath.Join(cfg.Dir, "authorities.json")
			tc.damage(t, dir, store)
			before := dirFiles(t, dir)

			cfg.Sealer = nil
			if s, err := ca.NewFileSealer(filepath.Join(dir, "seal.key"), nil); err == nil {
				cfg.Sealer = s
			} else {
				t.Fatal(err)
			}
			for _, at := range []time.Duration{0, 7 * time.Hour, 30 * time.Hour} { // whatever rotation would want
				clk.Set(epoch.Add(at))
				b, err := ca.Open(context.Background(), cfg)
				if err == nil {
					b.Close()
					t.Fatalf("Open at +%v succeeded over %s", at, tc.name)
				}
				if !errors.Is(err, tc.want) {
					t.Errorf("Open: %v, want %v", err, tc.want)
				}
				for _, says := range []string{"refusing to start", "never minted over it", tc.says} {
					if !strings.Contains(err.Error(), says) {
						t.Errorf("the refusal %q does not say %q", err, says)
					}
				}
			}
			after := dirFiles(t, dir)
			for path, b := range after {
				if !bytes.Equal(before[path], b) && !strings.HasSuffix(path, "/lock") {
					t.Errorf("%s changed though the start was refused", path)
				}
			}
			for path := range before {
				if _, ok := after[path]; !ok {
					t.Errorf("%s was removed though the start was refused", path)
				}
			}
			if len(after) > len(before)+1 { // the lock file may be new
				t.Errorf("a refused start left new files: %d before, %d after", len(before), len(after))
			}
		})
	}
}

// editStore changes the first stored CA as JSON.
func editStore(t *testing.T, store string, edit func(map[string]any)) {
	t.Helper()
	b, err := os.ReadFile(store)
	if err != nil {
		t.Fatal(err)
	}
	var set map[string]any
	if err := json.Unmarshal(b, &set); err != nil {
		t.Fatal(err)
	}
	edit(set["authorities"].([]any)[0].(map[string]any))
	b, err = json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, store, b)
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// breakDir makes every write under dir fail, even for root: the directory
// is moved aside and a file takes its place. The returned func restores it.
func breakDir(t *testing.T, dir string) (restore func()) {
	t.Helper()
	if err := os.Rename(dir, dir+".aside"); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, []byte("not a directory"))
	return func() {
		if err := os.Remove(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(dir+".aside", dir); err != nil {
			t.Fatal(err)
		}
	}
}

func TestStoreErrorDuringAReviewKeepsServingAndRetries(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewFake(epoch)
	cfg := shortConfig(t, dir, clk) // successor at 6h, switch at 9h; reviewed every 30m
	logs := &syncbuf.Buffer{}
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	a := mustOpen(t, cfg)
	signer := a.Status().Signer

	restore := breakDir(t, cfg.Dir)
	clk.Set(epoch.Add(6 * time.Hour)) // the successor is due; minting it cannot be stored
	now := clk.Now()
	cert, err := leafFor(a, proxiedName)
	if err != nil {
		t.Fatalf("a handshake failed on a store error: %v", err)
	}
	if err := verifyLeaf(t, cert, a.Bundle(), proxiedName, now); err != nil {
		t.Fatal(err)
	}
	if st := a.Status(); st.Signer != signer || st.Successor != nil {
		t.Fatalf("after a failed review: %+v; want the same signer and no successor (never one whose key is not stored)", st)
	}
	if !strings.Contains(logs.String(), "review failed") || !strings.Contains(logs.String(), "not a directory") {
		t.Fatalf("the store error was not logged:\n%s", logs)
	}
	failures := strings.Count(logs.String(), "review failed")
	clk.Advance(29 * time.Minute) // handshakes before the retry time do not retry
	for range 3 {
		if _, err := leafFor(a, proxiedName); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "review failed"); n != failures {
		t.Fatalf("%d failed reviews logged before the retry time, want %d", n, failures)
	}

	restore()
	clk.Advance(time.Minute) // the retry
	st := a.Status()
	if st.Successor == nil || st.Signer != signer {
		t.Fatalf("the retry after the store came back did not mint the successor: %+v", st)
	}
	if n := storedCAs(t, cfg.Dir); n != 2 {
		t.Fatalf("the store holds %d CAs after the retry, want 2", n)
	}
	withSuccessor := a.Bundle()

	// A switch needs no write: it happens even while the store fails.
	restore = breakDir(t, cfg.Dir)
	defer restore()
	clk.Set(epoch.Add(9 * time.Hour))
	cert, err = leafFor(a, proxiedName)
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Status().Signer; got != *st.Successor {
		t.Fatalf("the signer did not switch while the store failed: %+v", got)
	}
	if err := verifyLeaf(t, cert, withSuccessor, proxiedName, clk.Now()); err != nil {
		t.Fatalf("after the switch the leaf does not verify against the bundle tasks installed: %v", err)
	}
	// The old signer stays in the store, retired: the switch wrote nothing,
	// so nothing failed.
	if n := strings.Count(logs.String(), "review failed"); n != failures {
		t.Errorf("the switch tried to write the store (%d failed reviews logged, want %d):\n%s", n, failures, logs)
	}
}

func storedCAs(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "authorities.json"))
	if err != nil {
		t.Fatal(err)
	}
	var set struct{ Authorities []json.RawMessage }
	if err := json.Unmarshal(b, &set); err != nil {
		t.Fatal(err)
	}
	return len(set.Authorities)
}
