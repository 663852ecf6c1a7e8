package broker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/broker"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/tests/kit/fakegithub"
	"github.com/runfleet/runfleet/tests/kit/leakcheck"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// echoProvider is a provider that answers what real ones sometimes do
// when they fail: the credential it was sent, quoted in its message (a
// proxy's error page, a debug build, a GitHub Enterprise quoting the
// header it refused). It also answers a GitHub token for every repository
// of the installation, as a GitHub that ignores "repositories" does.
type echoProvider struct {
	srv *httptest.Server

	mu      sync.Mutex
	mode    string   // what the next answer is
	sent    []string // every credential the broker sent
	revoked []string // tokens DELETE /installation/token was called with
}

const echoToken = "ghs_EchoMintedTokenABCDEFGHIJ0123456789"

func newEchoProvider(t *testing.T) *echoProvider {
	p := &echoProvider{}
	pad := strings.Repeat("x", 100) // the credential within the bound, the JWT cut by it
	mux := http.NewServeMux()
	answer := func(w http.ResponseWriter, status int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("POST /app/installations/70/access_tokens", func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		p.mu.Lock()
		p.sent = append(p.sent, strings.TrimPrefix(auth, "Bearer "))
		mode := p.mode
		p.mu.Unlock()
		switch mode {
		case "every repository":
			answer(w, http.StatusCreated, map[string]any{"token": echoToken, "expires_at": time.Now().Add(time.Hour),
				"repository_selection": "all"})
		case "echo":
			answer(w, http.StatusUnauthorized, map[string]any{"message": pad + " refused " + auth})
		default:
			answer(w, http.StatusCreated, map[string]any{"token": echoToken, "expires_at": time.Now().Add(time.Hour),
				"repository_selection": "selected", "repositories": []map[string]any{{"full_name": "acme/app"}}})
		}
	})
	mux.HandleFunc("DELETE /installation/token", func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		p.mu.Lock()
		p.revoked = append(p.revoked, strings.TrimPrefix(auth, "token "))
		mode := p.mode
		p.mu.Unlock()
		if mode == "echo" {
			answer(w, http.StatusInternalServerError, map[string]any{"message": pad + " cannot revoke " + auth})
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /token", func(w http.ResponseWriter, r *http.Request) {
		user, pass, _ := r.BasicAuth()
		_ = r.ParseForm()
		p.mu.Lock()
		mode := p.mode
		p.mu.Unlock()
		// An "error" of a code's shape that is in fact what was sent.
		code := r.PostForm.Get("refresh_token")
		if mode == "echo client secret" {
			code, _ = url.QueryUnescape(pass)
		}
		answer(w, http.StatusBadRequest, map[string]any{"error": code, "error_description": user + ":" + pass})
	})
	p.srv = httptest.NewTLSServer(mux)
	t.Cleanup(p.srv.Close)
	return p
}

func (p *echoProvider) set(mode string) {
	p.mu.Lock()
	p.mode = mode
	p.mu.Unlock()
}

// Whatever a provider answers, no credential the broker sent (the App's
// JWT, a token, a refresh token, the client secret) reaches an error or a
// log line, not even cut at the message's bound; and a GitHub token that
// reaches more than the run's repository is revoked and refused.
func TestProviderAnswersQuotingACredentialReachNoErrorNorLog(t *testing.T) {
	p := newEchoProvider(t)
	clk := clock.NewFake(time.Now())
	dir := t.TempDir()
	key := fakegithub.NewAppKey(t)
	const (
		refreshToken = "rt_SeedRefreshTokenOfCodeShape0123456789"
		clientSecret = "cs_ClientSecretOfCodeShape0123456789"
	)
	for name, value := range map[string]string{"app.pem": string(fakegithub.PKCS1PEM(key)), "refresh.token": refreshToken, "client.secret": clientSecret} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(value), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sealer, err := broker.OpenSealer("file:"+keyFile(t), broker.SealerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	b, err := broker.New(map[string]broker.Recipe{
		"acme/GITHUB_TOKEN": {GitHubApp: &broker.GitHubApp{
			AppID: 7, PrivateKeySecret: "file:app.pem", InstallationID: broker.InstallationID{ID: 70},
			Permissions: map[string]string{"contents": "write"}, APIURL: p.srv.URL,
		}},
		"acme/DRIVE": {OAuth2: &broker.OAuth2{
			TokenURL: p.srv.URL + "/token", ClientID: "client", ClientSecretSecret: "file:client.secret", RefreshTokenSecret: "file:refresh.token",
		}},
	}, broker.Deps{
		Secrets: broker.NewSecrets(broker.SecretsConfig{BaseDir: dir}), Sealer: sealer, States: newMemStates(clk), Clock: clk,
		HTTPClient: p.srv.Client(), Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	gh := broker.MintRequest{FleetRunID: "r-1", ProjectID: "acme", Key: "GITHUB_TOKEN", Repository: "acme/app"}
	var seen []string
	note := func(err error) {
		if err != nil {
			seen = append(seen, err.Error(), fmt.Sprintf("%+v %#v", err, err))
		}
	}

	p.set("every repository")
	if _, err := b.Mint(ctx, gh); err == nil {
		t.Fatal("a token for every repository of the installation was handed out")
	} else {
		note(err)
	}
	p.mu.Lock()
	revoked := strings.Join(p.revoked, ",")
	p.mu.Unlock()
	if revoked != echoToken {
		t.Fatal("the token for every repository was not revoked")
	}

	p.set("echo")
	_, err = b.Mint(ctx, gh)
	note(err)
	p.set("")
	m, err := b.Mint(ctx, gh)
	if err != nil {
		t.Fatal(err)
	}
	p.set("echo")
	note(b.Revoke(ctx, gh, m.Sealed))

	drive := broker.MintRequest{FleetRunID: "r-1", ProjectID: "acme", Key: "DRIVE"}
	_, err = b.Mint(ctx, drive)
	note(err)
	clk.Advance(time.Minute) // past the held refusal
	p.set("echo client secret")
	_, err = b.Mint(ctx, drive)
	note(err)
	if len(seen) != 10 {
		t.Fatalf("%d errors, want 5: the test did not exercise what it checks", len(seen)/2)
	}

	text := []byte(strings.Join(seen, "\n") + "\n" + logs.String())
	leakcheck.AssertClean(t, "errors and log", text, leakcheck.Real{Key: "the token", Value: echoToken, Public: len("ghs_")})
	leakcheck.AssertClean(t, "errors and log", text, leakcheck.Real{Key: "the refresh token", Value: refreshToken, Public: len("rt_")})
	leakcheck.AssertClean(t, "errors and log", text, leakcheck.Real{Key: "the client secret", Value: clientSecret, Public: len("cs_")})
	p.mu.Lock()
	jwts := p.sent
	p.mu.Unlock()
	for i, jwt := range jwts {
		header := strings.Index(jwt, ".") + 1
		leakcheck.AssertClean(t, "errors and log", text, leakcheck.Real{Key: fmt.Sprintf("JWT %d", i), Value: jwt, Public: header})
	}
}
