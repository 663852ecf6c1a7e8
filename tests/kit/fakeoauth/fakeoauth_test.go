package fakeoauth_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/tests/kit/fakeoauth"
)

type answer struct {
	status                    int
	AccessToken, RefreshToken string
	ExpiresIn                 int64 `json:"expires_in"`
	Error                     string
}

func refresh(t *testing.T, s *fakeoauth.Server, id, secret, rt string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.URL, strings.NewReader(url.Values{"grant_type": {"refresh_token"}, "refresh_token": {rt}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(url.QueryEscape(id), url.QueryEscape(secret))
	resp, err := s.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a struct {
		AccessToken  string `json:"access_token"`
		RefreshToken string `json:"refresh_token"`
		ExpiresIn    int64  `json:"expires_in"`
		Error        string `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, a.AccessToken, a.RefreshToken, a.ExpiresIn, a.Error}
}

func TestRotationAndReuseRevokeTheFamily(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s := fakeoauth.Start(t, fakeoauth.Config{ClientID: "id:1", ClientSecret: "s&cret", ExpiresIn: 30 * time.Minute, Clock: clk})
	seed := s.Seed()

	if a := refresh(t, s, "id:1", "wrong", seed); a.status != http.StatusUnauthorized || a.Error != "invalid_client" {
		t.Fatalf("a wrong client secret: %+v", a)
	}
	first := refresh(t, s, "id:1", "s&cret", seed)
	if first.status != http.StatusOK || first.RefreshToken == "" || first.RefreshToken == seed || first.ExpiresIn != 1800 {
		t.Fatalf("first refresh: %+v", first)
	}
	second := refresh(t, s, "id:1", "s&cret", first.RefreshToken)
	if second.status != http.StatusOK || !s.Honoured(second.AccessToken) || !s.Honoured(first.AccessToken) {
		t.Fatalf("second refresh: %+v", second)
	}
	clk.Advance(30 * time.Minute)
	if s.Honoured(second.AccessToken) {
		t.Fatal("an access token is honoured past its expiry")
	}
	// The retired seed presented again: the whole family ends.
	if a := refresh(t, s, "id:1", "s&cret", seed); a.status != http.StatusBadRequest || a.Error != "invalid_grant" {
		t.Fatalf("a reused refresh token: %+v", a)
	}
	if a := refresh(t, s, "id:1", "s&cret", second.RefreshToken); a.Error != "invalid_grant" {
		t.Fatalf("the family's newest refresh token after a reuse: %+v", a)
	}
	if s.Refreshes() != 2 || s.InvalidGrants() != 2 || s.BadClients() != 1 {
		t.Fatalf("counts: %d refreshes, %d invalid_grant, %d bad clients", s.Refreshes(), s.InvalidGrants(), s.BadClients())
	}
	// A new seed is a new family.
	if a := refresh(t, s, "id:1", "s&cret", s.Seed()); a.status != http.StatusOK {
		t.Fatalf("a new family's first refresh: %+v", a)
	}
}
