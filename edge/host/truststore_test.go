package host

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// A task with secrets trusts the proxy's CA through the system trust store
// alone: with every CA variable unset, wget (GnuTLS) and Python's urllib
// verify the proxy's leaf for the upstream and the upstream gets the real
// value; the store is the task's trust.pem, and once the CA's successor is
// delivered, a new read in the same running task holds it.
func TestSystemTrustStoreIsTheTrustFileThroughTheCAsRotation(t *testing.T) {
	f := newFixture(t)
	// Leaves long enough to be fresh when issued (NotBefore is backdated
	// 5 minutes, and a leaf is renewed in its last third).
	f.caCfg = map[string]any{"lifetime": "10m", "successorWindow": "4m", "switchBefore": "1m", "leafLifetime": "4m"}
	fake := clock.NewFake(time.Now())
	e := f.open(hostOptions{clock: fake})
	prompt := fmt.Sprintf(`unset SSL_CERT_FILE REQUESTS_CA_BUNDLE CURL_CA_BUNDLE GIT_SSL_CAINFO NODE_EXTRA_CA_CERTS
sum() { sha256sum | cut -d' ' -f1; }
wget --no-hsts -q -O - --header "Authorization: Bearer $API_TOKEN" https://%[1]s/echo; echo " wget=$?"
/usr/bin/python3 -c 'import os, sys, urllib.request
r = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + os.environ["API_TOKEN"]})
print(urllib.request.urlopen(r).read().decode(), end="")' https://%[1]s/echo; echo " python=$?"
echo "store=$(sum < /etc/ssl/certs/ca-certificates.crt)"
read line
echo "again=$(sum < /etc/ssl/certs/ca-certificates.crt)"
`, f.upstreamHost)
	run := e.start(runspec.Request{Prompt: prompt, Secrets: e.apiToken()})
	trustPath := filepath.Join(f.dataDir, "work", run.RunID, "trust", "trust.pem")
	trustSum := func() string {
		b, err := os.ReadFile(trustPath)
		must(t, err)
		h := sha256.Sum256(b)
		return hex.EncodeToString(h[:])
	}
	out := e.waitOutput(run.RunID, "store=")
	for _, want := range []string{"upstream-ok wget=0", "upstream-ok python=0", "store=" + trustSum()} {
		if !strings.Contains(out, want) {
			t.Errorf("the task's output lacks %q: %s", want, out)
		}
	}
	if saw := f.upstreamSaw(); len(saw) != 2 || saw[0] != "Bearer "+realSecret || saw[1] != "Bearer "+realSecret {
		t.Errorf("the upstream saw %q, want the real value twice", saw)
	}

	// Into the successor window: the CA delivers the two-certificate
	// bundle to every running task.
	fake.Advance(7 * time.Minute)
	await.Cond(t, 20*time.Second, "the task's trust file to receive the successor", func() bool {
		b, _ := os.ReadFile(trustPath)
		return strings.HasSuffix(string(b), string(e.CABundle())) && strings.Count(string(e.CABundle()), "BEGIN CERTIFICATE") == 2
	})
	if _, err := e.client.Input(bg, run.RunID, json.RawMessage(`"go"`)); err != nil {
		t.Fatal(err)
	}
	if out := e.waitOutput(run.RunID, "again="); !strings.Contains(out, "again="+trustSum()) {
		t.Errorf("after the successor's delivery the task's store is not the trust file: %s", out)
	}
	e.waitEnd(run.RunID)
}
