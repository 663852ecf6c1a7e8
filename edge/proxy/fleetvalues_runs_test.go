package proxy

import (
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/tests/kit/leakcheck"
)

// Two runs on one host with the same key taken from Fleet hold different
// values (a GitHub token per run). An upstream both may reach can keep
// what one run's request carried (a note, a request log) and hand it to
// the other: that run's answers are scrubbed of it, as of its own, in
// every form, whether it registered before the value came, or after it was
// replaced; and its placeholder is never sent with the other run's value.
func TestAnotherRunsValueFromFleetIsScrubbedFromAnswers(t *testing.T) {
	f := newFleetEnv(t, "", nil, nil)
	var mu sync.Mutex
	var stored []string
	f.up.handler = func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path == "/store" {
			stored = append(stored, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
			return
		}
		for _, v := range stored {
			io.WriteString(w, "raw="+v+" b64="+base64.StdEncoding.EncodeToString([]byte(v))+"\n")
		}
	}
	expires := time.Now().Add(time.Hour)
	const otherValue = "ghs_FleetMintedOtherRunToken9876543210zyx"
	uB, phB := f.run(t, "run-b", fleetValue(otherValue, expires))
	uA, phA := f.run(t, "run-a", fleetValue(fleetFirst, expires))
	f.get(t, uA, "https://"+f.api+"/store", "Bearer "+phA)
	must(t, f.proxy.SetCredentials("run-a", []Credential{fleetValue(fleetSecond, expires.Add(time.Hour))}))
	f.get(t, uA, "https://"+f.api+"/store", "Bearer "+phA)
	uC, phC := f.run(t, "run-c", fleetValue("ghs_FleetMintedThirdRunTokenABCDEFabcdef01", expires))

	for _, r := range []struct {
		name string
		u    *url.URL
		ph   string
	}{{"run-b (registered before)", uB, phB}, {"run-c (registered after)", uC, phC}} {
		res, body := f.get(t, r.u, "https://"+f.api+"/read", "none")
		if res.StatusCode != 200 || !strings.Contains(body, "raw="+r.ph) {
			t.Fatalf("%s reading what run-a stored: %d %q", r.name, res.StatusCode, body)
		}
		for _, v := range []string{fleetFirst, fleetSecond} {
			leakcheck.AssertClean(t, r.name+"'s answer", []byte(body), leakcheck.Real{Key: "run-a's value from Fleet", Value: v, Public: len("ghs_")})
		}
	}
	// Each run's placeholder carries its own value only.
	f.up.handler = nil
	for _, r := range []struct {
		name, ph, want string
		u              *url.URL
	}{{"run-b", phB, otherValue, uB}, {"run-a", phA, fleetSecond, uA}} {
		res, _ := f.get(t, r.u, "https://"+f.api+"/user", "Bearer "+r.ph)
		if auth, _ := f.lastAuth(); res.StatusCode != 200 || auth != "Bearer "+r.want {
			t.Errorf("%s's placeholder: %d, sent with its own value: %v", r.name, res.StatusCode, auth == "Bearer "+r.want)
		}
	}
	f.noLeak(t, fleetFirst, fleetSecond, otherValue)
}
