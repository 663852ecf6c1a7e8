package host

import (
	"net/http"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
)

// A value from Fleet never moves backwards: a PUT whose value expires
// before the one the run holds (a delivery Fleet gave up on that arrived
// late, or a slower refresher's) is refused 400, naming the key and never
// a value, and the run keeps sending the newer value. Fleet, told the host
// did not take it, revokes the token it sent.
func TestAPUTNeverReplacesAValueWithAnOlderOne(t *testing.T) {
	f := newFleetFixture(t)
	e := f.open(hostOptions{})
	req := runspec.Request{Prompt: reflectSteps(f.upstreamHost, 1), Secrets: e.ghAndAPIToken()}
	now := time.Now()
	value := func(v string, expires time.Duration) hostproto.CredentialsRequest {
		b := fleetValue("GH", v)
		b.ExpiresAt = now.Add(expires)
		return hostproto.CredentialsRequest{Credentials: []hostproto.BrokeredValue{b}}
	}
	run := e.startWith("ct-older", req, value(ghFirst, time.Hour).Credentials...)
	e.waitOutput(run.RunID, "GH=")

	if _, err := e.client.PutCredentials(bg, run.RunID, value(ghSecond, 2*time.Hour)); err != nil {
		t.Fatalf("PUT of a newer value: %v", err)
	}
	_, err := e.client.PutCredentials(bg, run.RunID, value(ghReused, 90*time.Minute))
	hostError(t, err, http.StatusBadRequest, hostproto.CodeBadRequest, "acme/GH")
	if _, err := e.client.PutCredentials(bg, run.RunID, value(ghSecond, 2*time.Hour)); err != nil {
		t.Fatalf("PUT of the same expiry again: %v", err)
	}

	e.step(run.RunID, "status=200", 1)
	if seen, n := e.lastSeen(); n != 1 || seen != "Bearer "+ghSecond {
		t.Fatalf("the upstream saw %d requests, the last with the newer value: %v", n, seen == "Bearer "+ghSecond)
	}
	e.waitEnd(run.RunID)
	noFleetValue(t, e, nil, []string{run.RunID}, ghFirst, ghSecond, ghReused)
}
