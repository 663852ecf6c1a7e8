package broker_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/broker"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/tests/kit/fakegithub"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// A GitHub token minted through the Broker comes sealed bound to its run:
// Revoke with that run's request ends it at GitHub; the sealed value
// copied to another run's record opens nowhere else.
func TestBrokerSealsAGitHubTokenForItsRunAndRevokesIt(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC))
	key := fakegithub.NewAppKey(t)
	gh := fakegithub.New(t, fakegithub.Options{Clock: clk, Apps: []fakegithub.App{{
		ID: 7, Key: &key.PublicKey, Permissions: map[string]string{"contents": "write", "metadata": "read"},
		Installations: []fakegithub.Installation{{ID: 70, Repos: []string{"acme/app"}}},
	}}})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "app.pem"), fakegithub.PKCS1PEM(key), 0o600); err != nil {
		t.Fatal(err)
	}
	sealer, err := broker.OpenSealer("file:"+keyFile(t), broker.SealerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	ev := &events{}
	b, err := broker.New(map[string]broker.Recipe{"acme/GITHUB_TOKEN": {GitHubApp: &broker.GitHubApp{
		AppID: 7, PrivateKeySecret: "file:app.pem", InstallationID: broker.InstallationID{ID: 70},
		Permissions: map[string]string{"contents": "write"}, APIURL: gh.APIURL(),
	}}}, broker.Deps{
		Secrets: broker.NewSecrets(broker.SecretsConfig{BaseDir: dir}), Sealer: sealer, Clock: clk,
		HTTPClient: gh.Client(), Logger: slog.New(slog.NewJSONHandler(logs, nil)), OnEvent: ev.add,
	})
	if err != nil {
		t.Fatal(err)
	}
	if kind, ok := b.Kind("acme", "GITHUB_TOKEN"); !ok || kind != broker.KindGitHubApp {
		t.Fatalf("Kind = %q, %v", kind, ok)
	}
	ctx := context.Background()
	run1 := broker.MintRequest{FleetRunID: "r-1", ProjectID: "acme", Key: "GITHUB_TOKEN", Repository: "acme/app"}
	m, err := b.Mint(ctx, run1)
	if err != nil {
		t.Fatal(err)
	}
	if m.Kind != broker.KindGitHubApp || !gh.Live(string(m.Value)) || m.Sealed == nil || bytes.Contains(m.Sealed, []byte(m.Value)) {
		t.Fatalf("minted %+v: live %v", m, gh.Live(string(m.Value)))
	}
	if _, err := b.Mint(ctx, broker.MintRequest{ProjectID: "acme", Key: "GITHUB_TOKEN", Repository: "acme/app"}); err == nil {
		t.Fatal("a GitHub token minted for no run")
	}

	run2 := run1
	run2.FleetRunID = "r-2"
	var e *broker.Error
	if err := b.Revoke(ctx, run2, m.Sealed); !errors.As(err, &e) || e.Kind != broker.KindGitHubApp || !strings.Contains(e.Detail, "opening the run's token") {
		t.Fatalf("revoking run 1's token as run 2's: %v", err)
	}
	if !gh.Live(string(m.Value)) || gh.Revocations() != 0 {
		t.Fatal("another run's revocation reached the token")
	}
	if err := b.Revoke(ctx, run1, m.Sealed); err != nil {
		t.Fatal(err)
	}
	if gh.Live(string(m.Value)) || gh.Revocations() != 1 {
		t.Fatalf("after Revoke: live %v, %d revocations", gh.Live(string(m.Value)), gh.Revocations())
	}
	for event, want := range map[string]int{broker.EventMint: 1, broker.EventRevocation: 1, broker.EventFailure: 2} {
		if got := ev.count(broker.KindGitHubApp, event); got != want {
			t.Errorf("%d %s events, want %d", got, event, want)
		}
	}
	if strings.Contains(logs.String(), string(m.Value)) {
		t.Fatal("the token is in a log line")
	}
}
