package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/ca"
	"github.com/runfleet/runfleet/shared/clock"
)

// caFixture writes an edge.json for a data dir whose CA (10h lifetime,
// successor window 9h, switch 1h before the end) was created at
// created and last reviewed at reviewed; the commands read it at the real
// time now.
func caFixture(t *testing.T, created, reviewed time.Time) (configPath string, a *ca.Authority) {
	t.Helper()
	dir := t.TempDir()
	configPath = filepath.Join(dir, "edge.json")
	conf := fmt.Sprintf(`{"dataDir": %q, "api": {"tokenFile": %q},
		"ca": {"lifetime": "10h", "successorWindow": "9h", "switchBefore": "1h"}}`,
		filepath.Join(dir, "data"), filepath.Join(dir, "token"))
	if err := os.WriteFile(configPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	sealer, err := ca.NewFileSealer(filepath.Join(dir, "data", "seal.key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(created)
	a, err = ca.Open(context.Background(), ca.Config{
		Dir: filepath.Join(dir, "data", "ca"), Sealer: sealer, Clock: clk,
		Lifetime: 10 * time.Hour, SuccessorWindow: 9 * time.Hour, SwitchBefore: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	clk.Set(reviewed)
	a.Bundle()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	return configPath, a
}

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestCABundleAndStatus(t *testing.T) {
	now := time.Now()
	// Created 2h ago; reviewed 30m ago, inside the successor window (open
	// since 1h ago): signer and successor are stored.
	path, a := caFixture(t, now.Add(-2*time.Hour), now.Add(-30*time.Minute))
	status := a.Status()
	if status.Successor == nil {
		t.Fatal("fixture: no successor")
	}

	code, out, errOut := runCmd(t, "ca", "bundle", "--config", path)
	if code != 0 {
		t.Fatalf("edge ca bundle: exit %d: %s", code, errOut)
	}
	if out != string(a.Bundle()) || strings.Count(out, "BEGIN CERTIFICATE") != 2 {
		t.Fatalf("edge ca bundle printed\n%s\nwant the signer and successor\n%s", out, a.Bundle())
	}

	code, out, errOut = runCmd(t, "ca", "status", "--config", path)
	if code != 0 {
		t.Fatalf("edge ca status: exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"signer:", status.Signer.Subject, status.Signer.Fingerprint, status.Signer.NotAfter.UTC().Format(time.RFC3339),
		"switch:  " + status.Signer.NotAfter.Add(-time.Hour).UTC().Format(time.RFC3339),
		"successor:", status.Successor.Subject, status.Successor.Fingerprint,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("edge ca status lacks %q:\n%s", want, out)
		}
	}
}

func TestCAStatusBeforeAndInsideTheWindow(t *testing.T) {
	now := time.Now()
	// Created and closed 30m ago: the window opens in 30m.
	path, _ := caFixture(t, now.Add(-30*time.Minute), now.Add(-30*time.Minute))
	code, out, errOut := runCmd(t, "ca", "status", "--config", path)
	if code != 0 || !strings.Contains(out, "successor: none yet (minted from ") {
		t.Fatalf("exit %d, stdout\n%s\nstderr %s\nwant no successor yet", code, out, errOut)
	}

	// Created 2h ago and never reviewed since: the window is open, no
	// successor is stored; the command says so and writes nothing.
	path, _ = caFixture(t, now.Add(-2*time.Hour), now.Add(-2*time.Hour))
	store := filepath.Join(filepath.Dir(path), "data", "ca", "authorities.json")
	before, err := os.ReadFile(store)
	if err != nil {
		t.Fatal(err)
	}
	code, out, _ = runCmd(t, "ca", "status", "--config", path)
	if code != 0 || !strings.Contains(out, "successor: due since ") {
		t.Fatalf("exit %d, stdout\n%s\nwant the successor due", code, out)
	}
	if after, _ := os.ReadFile(store); !bytes.Equal(before, after) {
		t.Fatal("edge ca status wrote the store")
	}
}

func TestCACommandErrors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "edge.json")
	conf := fmt.Sprintf(`{"dataDir": %q, "api": {"tokenFile": "/t"}}`, filepath.Join(dir, "data"))
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		code int
		says string
	}{
		{[]string{"ca"}, 2, "edge ca: a command is missing\n\nusage: edge ca <command>"},
		{[]string{"ca", "rotate", "--config", path}, 2, "edge ca: unknown command \"rotate\"\n\nusage: edge ca <command>"},
		{[]string{"ca", "bundle"}, 2, "edge ca bundle: --config is required\n\nusage: edge ca bundle --config edge.json"},
		{[]string{"ca", "bundle", "--config", path}, 1, "no CA under " + filepath.Join(dir, "data", "ca") + " yet"},
		{[]string{"ca", "status", "--config", filepath.Join(dir, "missing.json")}, 1, "missing.json"},
	}
	for _, tc := range tests {
		code, out, errOut := runCmd(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.says) || out != "" {
			t.Errorf("edge %s: exit %d, stdout %q, stderr %q; want exit %d saying %q",
				strings.Join(tc.args, " "), code, out, errOut, tc.code, tc.says)
		}
	}
}
