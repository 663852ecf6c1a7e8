package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	logredact "github.com/runfleet/runfleet/edge/internal/redact"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// tripwireBenchValues are the real values of 20 keys, shaped as vendors
// shape theirs (prefixes, lengths, AWS's '+' and '/'), so the index holds
// what a host's does: each in all its forms.
func tripwireBenchValues() []string {
	var out []string
	for i := range 20 {
		out = append(out, [...]string{
			fmt.Sprintf("sk-proj-%02dT3BlbkFJq8Zr4mW2xYvN7pLkQ9sHdE1uGfAaBbCcDdEeFf", i),
			fmt.Sprintf("ghp_%02dR7mKq2ZxW9vN4bT6yL1pH8sD3fG5jA0cEiu", i),
			fmt.Sprintf("wJalrXUtnFEMI/K7MDENG+bPxRfiCY%02dEXAMPLEKEY", i),
			fmt.Sprintf("xoxb-%02d1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx", i),
			fmt.Sprintf("glpat-%02dxYz9AbC8dEf7GhI6jKl5", i),
		}[i%5])
	}
	return out
}

// BenchmarkTripwire64KiBBody: keep-alive POSTs of a 64 KiB JSON body
// (read whole: the body buffer's size), one substitution in a header each,
// through two proxies wired alike to one upstream, in one run: one whose
// tripwire index holds the values of the task's 20 keys (every request
// reads them: learnGranted), one whose index is empty. Rounds alternate
// between them; the medians of their requests/s are reported, and ratio,
// the median per-round time per request with the index over without
// (target <= 1.10). index_µs/req is one Find over the request (its head
// and body) alone. ns/op and CPU count client, proxies and upstream
// together: the in-process view (bench_test.go says why it is kept).
func BenchmarkTripwire64KiBBody(b *testing.B) {
	uca := edgetest.NewCA(b)
	up := startUpstream(b, uca, false, "api.example.test")
	up.noRecord = true
	values := tripwireBenchValues()
	up.handler = func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		if r.Header.Get("Authorization") != "Bearer "+values[0] || n != 64<<10 {
			w.WriteHeader(http.StatusUnauthorized)
		}
		io.WriteString(w, `{"ok":true}`)
	}
	var keys []string
	secretValues := map[string]string{}
	var declared []runspec.Secret
	for i, v := range values {
		k := fmt.Sprintf("K%02d", i)
		keys = append(keys, fmt.Sprintf(`%q: {"domains": ["api.example.test:%d"], "in": ["header"], "placeholder": {"prefix": "sk-"}}`, k, up.port))
		secretValues["acme/"+k] = v
		declared = append(declared, runspec.Secret{ProjectID: "acme", Key: k})
	}
	type side struct {
		e      *env
		client *http.Client
		ph     string
		index  *logredact.Set
	}
	newSide := func(empty bool) *side {
		s := &side{index: logredact.NewSet(0)}
		s.e = newEnv(b, envOptions{
			uca: uca, quiet: true,
			redactor: s.index, rawLogs: io.Discard, rawAudit: io.Discard,
			metrics: prometheus.NewRegistry(),
			pins:    map[string]string{"api.example.test": "127.0.0.1"},
			keys:    `{"acme": {"keys": {` + strings.Join(keys, ",") + `}}}`,
			secrets: secretValues,
		})
		if empty {
			// The same wiring, but the tripwire's index never learns a
			// value (the log's redactor still does).
			s.e.proxy.cfg.RealValues = logredact.NewSet(0)
		}
		u, phs := s.e.task("run-bench", declared...)
		s.ph = phs["K00"]
		s.client = s.e.goClient(u, false)
		s.client.Transport.(*http.Transport).MaxIdleConnsPerHost = 8
		return s
	}
	with, without := newSide(false), newSide(true)
	target := fmt.Sprintf("https://api.example.test:%d/v1/chat/completions", up.port)
	body := tripwireBenchBody()
	do := func(s *side) error {
		req, _ := http.NewRequest(http.MethodPost, target, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+s.ph)
		req.Header.Set("Content-Type", "application/json")
		res, err := s.client.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			return fmt.Errorf("status %d", res.StatusCode)
		}
		return nil
	}
	run := func(s *side, n int) time.Duration {
		start := time.Now()
		for range n {
			if err := do(s); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start) / time.Duration(n)
	}
	run(with, 50) // leaves issued, pools warm, every value read
	run(without, 50)
	if with.index.Len() < len(values) {
		b.Fatalf("the index holds %d values, want the %d keys'", with.index.Len(), len(values))
	}
	if _, ok := with.index.Find(body); ok {
		b.Fatal("the body holds a value: every request would be blocked")
	}
	n := max(b.N/benchRounds, 200)
	b.ResetTimer()
	var ratios, withRate, withoutRate []float64
	for round := range benchRounds {
		var w, wo time.Duration
		if round%2 == 0 {
			w, wo = run(with, n), run(without, n)
		} else {
			wo, w = run(without, n), run(with, n)
		}
		ratios = append(ratios, float64(w)/float64(wo))
		withRate, withoutRate = append(withRate, float64(time.Second)/float64(w)), append(withoutRate, float64(time.Second)/float64(wo))
	}
	b.StopTimer()
	// What the index itself costs a request: its body and head scanned.
	head := []byte("POST\napi.example.test\n/v1/chat/completions\n/v1/chat/completions\nauthorization\nBearer " + with.ph + "\ncontent-type\napplication/json")
	const finds = 2000
	start := time.Now()
	for range finds {
		with.index.Find(head)
		with.index.Find(body)
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/finds/1e3, "index_µs/req")
	b.ReportMetric(medianOf(withRate), "with_index_req/s")
	b.ReportMetric(medianOf(withoutRate), "empty_index_req/s")
	b.ReportMetric(medianOf(ratios), "ratio")
}

// tripwireBenchBody is a 64 KiB chat request body holding no value.
func tripwireBenchBody() []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"gpt-test","messages":[`)
	for i := 0; b.Len() < 64<<10-100; i++ {
		fmt.Fprintf(&b, `{"role":"user","content":"Line %d of the conversation: lorem ipsum dolor sit amet, consectetur adipiscing elit %s."},`,
			i, url.QueryEscape(fmt.Sprint(i*7919)))
	}
	b.WriteString(`{"role":"user","content":"end"}]}`)
	for b.Len() < 64<<10 {
		b.WriteByte(' ')
	}
	return b.Bytes()[:64<<10]
}
