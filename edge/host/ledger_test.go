package host

import (
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
)

// ledger reads the run's whole egress ledger through the host API, by
// pages of size, and returns it with the last page (its summary and seal).
func (e *edgeHost) ledger(runID string, size int) ([]egress.Record, hostproto.EgressPage) {
	e.f.t.Helper()
	var all []egress.Record
	after := int64(0)
	for {
		p, err := e.client.Egress(bg, runID, after, size)
		must(e.f.t, err)
		all = append(all, p.Records...)
		if p.NextCursor == nil {
			e.f.t.Fatalf("a page after %d has no nextCursor", after)
		}
		after = *p.NextCursor
		if !p.HasMore {
			return all, p
		}
	}
}

// ledgerKey is the key /healthz reports for the host's ledgers.
func (e *edgeHost) ledgerKey() ed25519.PublicKey {
	e.f.t.Helper()
	h, err := e.client.Health(bg)
	must(e.f.t, err)
	key, err := egress.ParsePublicKey(h.LedgerKey)
	if err != nil {
		e.f.t.Fatalf("/healthz ledgerKey %q: %v", h.LedgerKey, err)
	}
	return key
}

// withLedgerBound sets proxy.ledger.maxRecords in the fixture's edge.json.
func (f *fixture) withLedgerBound(n int) {
	f.t.Helper()
	f.writeConfig()
	b, err := os.ReadFile(f.cfgPath)
	must(f.t, err)
	var cfg map[string]any
	must(f.t, json.Unmarshal(b, &cfg))
	cfg["proxy"].(map[string]any)["ledger"] = map[string]any{"maxRecords": n}
	b, _ = json.Marshal(cfg)
	must(f.t, os.WriteFile(f.cfgPath, b, 0o600))
}

// A run calls the granted upstream twice (a query, its values masked),
// is refused a third destination (the metadata address, by the upstream
// guard) and a DNS name (one no resolver could answer), and opens a
// tunnel (egress open): its ledger, read through the host API, holds each
// decision in order with what a reviewer needs, its summary counts them,
// and, sealed at the run's end, it verifies with the key /healthz reports
// and with no other. Nothing of the key's value or placeholder is in it.
func TestARunsLedgerThroughTheHostAPI(t *testing.T) {
	f := newFixture(t)
	e := f.open(hostOptions{})
	const exfil = "exfil_data.example.test"
	prompt := fmt.Sprintf(`curl -sS --fail -H "Authorization: Bearer $API_TOKEN" "https://%[1]s/v1/one?page=2&q=private-search-terms"; echo
curl -sS --fail -H "Authorization: Bearer $API_TOKEN" https://%[1]s/v1/two; echo
curl -sS --max-time 10 https://169.254.169.254/latest/meta-data/ || echo refused-metadata
%[2]scurl -sS --fail https://%[3]s/; echo`, f.upstreamHost, probeScript(probes{DNS: []probe{{Label: "exfil", Addr: "127.0.0.53:53", Say: exfil}}}), f.tunnelHost)
	run := e.start(runspec.Request{Prompt: prompt, Secrets: e.apiToken()})
	end := e.waitEnd(run.RunID)
	out := e.output(run.RunID)
	if end.Status != hostproto.StatusSucceeded || strings.Count(out, "upstream-ok") != 2 || !strings.Contains(out, "refused-metadata") ||
		!strings.Contains(out, "dns-udp exfil rcode 3") || !strings.Contains(out, "tunnel-ok") {
		t.Fatalf("the task ended %+v:\n%s", end, out)
	}

	recs, last := e.ledger(run.RunID, 2)
	type want struct {
		via, authority, method, path, action, reason string
		status                                       int
		keys                                         string
	}
	wants := []want{
		{egress.ViaProxy, f.upstreamHost, "GET", "/v1/one?page=*&q=*", egress.Substituted, "", 200, "[acme/API_TOKEN]"},
		{egress.ViaProxy, f.upstreamHost, "GET", "/v1/two", egress.Substituted, "", 200, "[acme/API_TOKEN]"},
		{egress.ViaProxy, "169.254.169.254:443", "CONNECT", "", egress.Denied, "upstream refused: a metadata address, not in upstream.allowPrivate", 403, "[]"},
		{egress.ViaDNS, exfil, "", "", egress.Denied, "not a name edge resolves: not a valid DNS name", 0, "[]"},
		{egress.ViaProxy, f.tunnelHost, "CONNECT", "", egress.Tunnelled, "", 200, "[]"},
	}
	if len(recs) != len(wants) {
		t.Fatalf("the ledger holds %d records, want %d: %+v", len(recs), len(wants), recs)
	}
	for i, w := range wants {
		r := recs[i]
		got := want{r.Via, r.Authority, r.Method, r.Path, r.Action, r.Reason, r.Status, fmt.Sprint(r.Keys)}
		if got != w || r.Seq != int64(i+1) || r.TS.IsZero() || (i > 0 && r.TS.Before(recs[i-1].TS)) {
			t.Errorf("record %d\n got %+v\nwant %+v", i+1, r, w)
		}
	}
	if recs[4].BytesDown == 0 || recs[4].BytesUp == 0 {
		t.Errorf("the tunnel's record counts no bytes: %+v", recs[4])
	}
	s := last.Summary
	if s.Requests != 5 || s.Blocked != 2 || s.Dropped != 0 || len(s.Authorities) != 4 || s.Authorities[0].Authority != f.upstreamHost ||
		s.Authorities[0].Requests != 2 || fmt.Sprint(s.Authorities[0].Keys) != "[acme/API_TOKEN]" {
		t.Errorf("summary %+v", s)
	}
	key := e.ledgerKey()
	if last.Seal == nil || last.Seal.Count != 5 || last.Seal.PublicKey != egress.FormatPublicKey(key) {
		t.Fatalf("seal %+v", last.Seal)
	}
	if v := egress.Verify(run.RunID, recs, last.Seal, key); !v.OK {
		t.Fatalf("the ledger does not verify with /healthz's key: %+v", v)
	}
	other, _, _ := ed25519.GenerateKey(nil)
	if v := egress.Verify(run.RunID, recs, last.Seal, other); v.OK {
		t.Fatal("the ledger verifies with another host's key")
	}
	b, _ := json.Marshal(recs)
	// The fixture's placeholders all start "ph-".
	if strings.Contains(string(b), realSecret) || strings.Contains(string(b), "ph-") || strings.Contains(string(b), "private-search") {
		t.Fatalf("the ledger holds the key's value, a placeholder or a query value: %s", b)
	}
	// The host-wide audit file is as it was: the query and the DNS name are
	// the run's ledger's alone.
	for _, l := range f.auditEntries() {
		if l.Host == exfil || strings.Contains(l.Path, "?") {
			t.Errorf("the audit file holds a line the ledger alone should: %+v", l)
		}
	}
}

// taskProxy starts a run that holds its attempt open and returns the
// proxy URL with the attempt's credential and the key's placeholder, as
// its task sees them: the test then calls through edge as that task.
func (e *edgeHost) taskProxy() (runID string, proxyURL *url.URL, placeholder string) {
	e.f.t.Helper()
	run := e.start(runspec.Request{Prompt: `echo "proxy=$HTTPS_PROXY"; echo "token=$API_TOKEN"; sleep 1000`, Secrets: e.apiToken()})
	e.f.t.Cleanup(func() { e.client.Cancel(bg, run.RunID) })
	out := strings.ReplaceAll(e.waitOutput(run.RunID, "token="), "\r\n", "\n")
	u, err := url.Parse(envLine(strings.ReplaceAll(out, "proxy=", "HTTPS_PROXY="), "HTTPS_PROXY"))
	must(e.f.t, err)
	return run.RunID, u, envLine(strings.ReplaceAll(out, "token=", "API_TOKEN="), "API_TOKEN")
}

// proxiedClient is a keep-alive client through proxyURL that trusts edge's
// CA, with up to conns connections, HTTP/2 when h2 is set.
func (e *edgeHost) proxiedClient(proxyURL *url.URL, conns int, h2 bool) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.CABundle())
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(proxyURL), TLSClientConfig: &tls.Config{RootCAs: pool},
		MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, ForceAttemptHTTP2: h2,
	}}
}

// call sends one request with the placeholder; an error unless it is 200.
func call(c *http.Client, target, placeholder string) error {
	req, _ := http.NewRequest(http.MethodGet, target, nil)
	req.Header.Set("Authorization", "Bearer "+placeholder)
	res, err := c.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", res.StatusCode)
	}
	return nil
}

// A run of 100,000 requests through the real proxy (keep-alive, its
// attempt's credential) keeps a bounded ledger: the first maxRecords
// records and, sealed at its end, one Dropped record counting exactly the
// rest; its summary counts every request, and the ledger verifies.
func TestALedgerOfAHundredThousandRequestsStaysBounded(t *testing.T) {
	// 16 keep-alive connections: about a minute under -race on a
	// loaded 2-core machine, the real proxy and ledger all the way.
	const requests, bound, conc = 100_000, 1000, 16
	f := newFixture(t)
	f.withLedgerBound(bound)
	e := f.openWritten(hostOptions{})
	runID, proxyURL, ph := e.taskProxy()
	c := e.proxiedClient(proxyURL, conc, false)
	target := "https://" + f.upstreamHost + "/v1/bulk"
	began := time.Now()
	errs := make(chan error, conc)
	for w := range conc {
		go func() {
			for i := w; i < requests; i += conc {
				if err := call(c, target, ph); err != nil {
					errs <- fmt.Errorf("request %d: %w", i, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range conc {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d requests in %v", requests, time.Since(began).Round(time.Millisecond))
	if _, err := e.client.Cancel(bg, runID); err != nil {
		t.Fatal(err)
	}
	e.waitEnd(runID)

	recs, last := e.ledger(runID, 1000)
	var dropped, kept int64
	for _, r := range recs {
		if r.Action == egress.Dropped {
			dropped += r.Dropped
		} else {
			kept++
		}
	}
	if kept != bound || dropped != requests-bound || len(recs) != bound+1 || recs[bound].Action != egress.Dropped {
		t.Errorf("%d records: %d kept, %d dropped; want %d kept and one Dropped record of %d", len(recs), kept, dropped, bound, requests-bound)
	}
	if s := last.Summary; s.Requests != requests || s.Dropped != requests-bound || s.Authorities[0].Requests != requests {
		t.Errorf("summary %+v, want %d requests, %d dropped", s, requests, requests-bound)
	}
	if v := egress.Verify(runID, recs, last.Seal, e.ledgerKey()); !v.OK {
		t.Fatalf("the ledger does not verify: %+v", v)
	}
}
