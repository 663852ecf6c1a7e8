package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/fleetapi"
)

// runs get shows each brokered key with the life left to the value its
// host holds, and when Fleet revoked the run's own token.
func TestCredentialLineSaysWhenTheValueExpires(t *testing.T) {
	now := time.Date(2026, 12, 6, 11, 0, 0, 0, time.UTC)
	revoked := now.Add(-2 * time.Minute)
	for _, tc := range []struct {
		c    fleetapi.BrokeredCredential
		want []string
	}{
		{fleetapi.BrokeredCredential{ProjectID: "acme", Key: "GITHUB_TOKEN", Kind: "githubApp", ExpiresAt: now.Add(42 * time.Minute)},
			[]string{"acme/GITHUB_TOKEN (githubApp)", "(in 42m0s)"}},
		{fleetapi.BrokeredCredential{ProjectID: "acme", Key: "GITHUB_TOKEN", Kind: "githubApp", ExpiresAt: now.Add(-3 * time.Minute), RevokedAt: &revoked},
			[]string{"(expired 3m ago)", "revoked " + revoked.Local().Format(time.RFC3339) + " (2m ago)"}},
	} {
		got := credentialLine(now, tc.c)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("credentialLine = %q; want it to say %q", got, w)
			}
		}
	}
}
