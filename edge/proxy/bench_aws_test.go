package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/prometheus/client_golang/prometheus"

	logredact "github.com/runfleet/runfleet/edge/internal/redact"
	"github.com/runfleet/runfleet/edge/proxy/awssig"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// The AWS benchmarks set what the proxy does to a task's SigV4 request
// (check the signature made with the placeholder secret, sign the request
// again with the real credentials, re-sign an aws-chunked body chunk by
// chunk) against a header substitution, through the same proxy wiring, to
// the same loopback upstream, in one run, and report the ratios with
// b.ReportMetric. Like every benchmark they run only with -bench.
//
// The upstream lets in only what the real credentials signed: the header
// signature is verified with the real secret while warming up (and its
// access key id and token checked on every request), an aws-chunked body's
// chain is verified chunk by chunk with the real secret, so a proxy that
// stopped re-signing fails the benchmark instead of measuring less work.

const (
	awsBenchHost      = "s3.us-east-1.amazonaws.com"
	awsBenchRegion    = "us-east-1"
	awsBenchService   = "s3"
	awsEmptyHash      = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	awsStreamingValue = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
	// awsBenchUA and the other SDK headers are sent by both sides of a
	// comparison, so that the requests differ only in how they are
	// authorised.
	awsBenchUA = "aws-sdk-go-v2/1.36.3 os/linux lang/go#1.26 md/GOOS#linux md/GOARCH#amd64 api/s3#1.79.2"
)

// awsBenchReal are the aws key's real credentials, temporary ones (so the
// task's placeholders carry a session token too, as an STS session's do).
var awsBenchReal = awssig.Credentials{
	AccessKeyID:     "ASIABENCHREALKEY0001",
	SecretAccessKey: "bEnChReAlSeCrEtbEnChReAlSeCrEtbEnChReAl00",
	SessionToken:    "IQoJb3JpZ2luX2VjEbench//real/session+token=",
}

// awsBenchValue is awsBenchReal as the secrets source holds it.
func awsBenchValue() string {
	v, _ := json.Marshal(awsCredentialsJSON{AccessKeyID: awsBenchReal.AccessKeyID, SecretAccessKey: awsBenchReal.SecretAccessKey, SessionToken: awsBenchReal.SessionToken})
	return string(v)
}

// awsKeyPolicy is an aws key's policy entry for the benchmark's S3 name.
func awsKeyPolicy(port int) string {
	return fmt.Sprintf(`{"kind": "aws", "domains": ["%s:%d"], "aws": {"regions": [%q], "services": [%q]}}`, awsBenchHost, port, awsBenchRegion, awsBenchService)
}

// awsPlaceholders reads an aws task's placeholder credentials from its
// variables (TaskKeys), as the task's SDK reads them from its env.
func awsPlaceholders(b *testing.B, vars map[string]string) aws.Credentials {
	c := aws.Credentials{AccessKeyID: vars["AWS_ACCESS_KEY_ID"], SecretAccessKey: vars["AWS_SECRET_ACCESS_KEY"], SessionToken: vars["AWS_SESSION_TOKEN"]}
	if c.AccessKeyID == "" || c.SecretAccessKey == "" || c.SessionToken == "" {
		b.Fatalf("the aws task's variables lack placeholders: %d of them", len(vars))
	}
	if c.AccessKeyID == awsBenchReal.AccessKeyID || c.SecretAccessKey == awsBenchReal.SecretAccessKey {
		b.Fatal("the task was given the real credentials")
	}
	return c
}

func awsSignS3(o *v4.SignerOptions) { o.DisableURIPathEscaping = true }

func benchHostname(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

// awsResignRig is one proxy, wired as newBenchRig wires it (as edge serve
// does), holding two tasks: run-bench with K, a bearer key for
// api.example.test (newBenchRig's), and run-aws with A, an aws key for
// s3.us-east-1.amazonaws.com. Both names are pinned to one loopback
// upstream whose certificate names both. Each key is its task's only one,
// so neither side pays for reading the other's value per request.
type awsResignRig struct {
	e        *env
	up       *testUpstream
	bearer   *http.Client
	signed   *http.Client
	bearerPH string
	ph       aws.Credentials
	signer   *v4.Signer
	// verify: the upstream checks each re-signed request's signature with
	// the real secret (warm-up); otherwise its access key id and token only.
	verify   atomic.Bool
	verified atomic.Int64
}

func newAWSResignRig(b *testing.B) *awsResignRig {
	uca := edgetest.NewCA(b)
	up := startUpstream(b, uca, false, "api.example.test", awsBenchHost)
	up.noRecord = true
	r := &awsResignRig{up: up, signer: v4.NewSigner()}
	up.handler = r.answer
	r.e = newEnv(b, envOptions{
		uca: uca, quiet: true,
		redactor: logredact.NewSet(0), rawLogs: io.Discard, rawAudit: io.Discard,
		metrics: prometheus.NewRegistry(),
		pins:    map[string]string{"api.example.test": "127.0.0.1", awsBenchHost: "127.0.0.1"},
		keys: fmt.Sprintf(`{"acme": {"keys": {"K": {"domains": ["api.example.test:%d"], "placeholder": {"prefix": "sk-"}}, "A": %s}}}`,
			up.port, awsKeyPolicy(up.port)),
		secrets: map[string]string{"acme/K": benchKey, "acme/A": awsBenchValue()},
	})
	bu, phs := r.e.task("run-bench", runspec.Secret{ProjectID: "acme", Key: "K"})
	au, _ := r.e.task("run-aws", runspec.Secret{ProjectID: "acme", Key: "A"})
	keys, err := r.e.proxy.TaskKeys("run-aws")
	must(b, err)
	vars := map[string]string{}
	for _, k := range keys {
		vars[k.Var] = k.Placeholder
	}
	r.bearerPH, r.ph = phs["K"], awsPlaceholders(b, vars)
	r.bearer, r.signed = r.e.goClient(bu, false), r.e.goClient(au, false)
	for _, c := range []*http.Client{r.bearer, r.signed} {
		c.Transport.(*http.Transport).MaxIdleConnsPerHost = 64
	}
	return r
}

// answer is the upstream: 200 to the real value or to a request the real
// credentials signed, 401 to anything else.
func (r *awsResignRig) answer(w http.ResponseWriter, req *http.Request) {
	verify := r.verify.Load()
	var body []byte
	if verify {
		body, _ = io.ReadAll(req.Body)
	} else {
		io.Copy(io.Discard, req.Body)
	}
	ok := false
	switch benchHostname(req.Host) {
	case "api.example.test":
		ok = req.Header.Get("Authorization") == "Bearer "+benchKey
	case awsBenchHost:
		ok = strings.Contains(req.Header.Get("Authorization"), " Credential="+awsBenchReal.AccessKeyID+"/") &&
			req.Header.Get("X-Amz-Security-Token") == awsBenchReal.SessionToken
		if ok && verify {
			ok = verifyResigned(req, body) == nil
			if ok {
				r.verified.Add(1)
			}
		}
	}
	if !ok {
		w.WriteHeader(http.StatusUnauthorized)
	}
	io.WriteString(w, `{"ok":true}`)
}

// verifyResigned checks a request's SigV4 signature with the real secret,
// and its body against the hash it states.
func verifyResigned(req *http.Request, body []byte) error {
	sig, err := awssig.Parse(req)
	if err != nil {
		return err
	}
	if sig.AccessKeyID != awsBenchReal.AccessKeyID {
		return errors.New("not signed with the real access key id")
	}
	if err := awssig.Verify(req, sig, awsBenchReal.SecretAccessKey, ""); err != nil {
		return err
	}
	if sum := sha256.Sum256(body); sig.PayloadHash != hex.EncodeToString(sum[:]) {
		return errors.New("body does not match x-amz-content-sha256")
	}
	return nil
}

// awsBenchShape is what one request of the keep-alive comparison is.
type awsBenchShape struct {
	name   string
	method string
	body   []byte
}

// build makes n requests of the shape for each side: bearer ones
// carrying K's placeholder, and ones signed by the SDK's v4 signer with
// the aws task's placeholder credentials, each signed anew as an SDK does.
// Both carry the same SDK headers (a distinct invocation id each) and the
// literal x-amz-content-sha256 of their body. signing is what the signing
// alone took per request.
func (r *awsResignRig) build(b *testing.B, s awsBenchShape, n, round int) (bearer, signed []*http.Request, signing time.Duration) {
	sum := sha256.Sum256(s.body)
	payload := hex.EncodeToString(sum[:])
	mk := func(host string, i int) *http.Request {
		var body io.Reader
		if s.body != nil {
			body = bytes.NewReader(s.body)
		}
		req, err := http.NewRequest(s.method, fmt.Sprintf("https://%s:%d/bench-bucket/dir/object.json", host, r.up.port), body)
		must(b, err)
		req.Header.Set("User-Agent", awsBenchUA)
		req.Header.Set("Amz-Sdk-Invocation-Id", fmt.Sprintf("0f6f2c1e-%04x-4c1a-9f0e-%012x", round, i))
		req.Header.Set("Amz-Sdk-Request", "attempt=1; max=3")
		req.Header.Set("X-Amz-Content-Sha256", payload)
		if s.body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		return req
	}
	bearer, signed = make([]*http.Request, n), make([]*http.Request, n)
	for i := range bearer {
		bearer[i] = mk("api.example.test", i)
		bearer[i].Header.Set("Authorization", "Bearer "+r.bearerPH)
		signed[i] = mk(awsBenchHost, i)
	}
	start := time.Now()
	for _, req := range signed {
		must(b, r.signer.SignHTTP(context.Background(), r.ph, req, payload, awsBenchService, awsBenchRegion, time.Now(), awsSignS3))
	}
	return bearer, signed, time.Since(start) / time.Duration(n)
}

// send sends reqs from conc goroutines, each its share in turn, and
// returns requests/s and the process's CPU time per request (client,
// upstream and proxy together; the requests were built and signed before).
func (r *awsResignRig) send(b *testing.B, c *http.Client, reqs []*http.Request, conc int) (rate float64, cpu time.Duration) {
	var wg sync.WaitGroup
	per := len(reqs) / conc
	errs := make([]error, conc)
	cpu0 := processCPU()
	start := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, req := range reqs[w*per : (w+1)*per] {
				res, err := c.Do(req)
				if err != nil {
					errs[w] = err
					return
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					errs[w] = fmt.Errorf("%s %s: status %d", req.Method, req.URL.Host, res.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	return float64(per*conc) / elapsed.Seconds(), (processCPU() - cpu0) / time.Duration(per*conc)
}

// BenchmarkAWSResignKeepAlive: what a request signed with the task's aws
// placeholders costs through the proxy (Parse, the policy's scope
// decision, Verify with the placeholder secret, Resign with the real
// credentials) against a request whose bearer header the proxy
// substitutes (target: ratio, the re-signed request's time over the
// substituted one's, <= 1.5). Keep-alive HTTPS, 8 concurrent, as
// BenchmarkKeepAlive, in interleaved rounds (the order alternating); the
// medians of the rounds are reported: bearer_ns/req and sigv4_ns/req are
// the inverse of each side's requests/s (time per request at 8
// concurrent), ratio the median of the rounds' sigv4 time over bearer
// time, cpu_ratio the same of CPU time. Client, proxy and upstream share
// this process, as in BenchmarkKeepAlive (see the note at the top of
// bench_test.go).
//
// What is compared is the round trip through the proxy of requests built
// beforehand: the SDK's signing of each request, which the bearer client
// has no counterpart of, is done before each round's timing and reported
// apart (client_sign_µs/req, one goroutine). CPU per request is the whole
// process's (client, proxy, upstream), signing excluded. GET has no body;
// PUT-4KiB sends 4 KiB of JSON with its literal x-amz-content-sha256
// (which the proxy does not hash: the service checks the body against
// it), while the bearer PUT's body is scanned for placeholders as any
// body to a header key's host is.
func BenchmarkAWSResignKeepAlive(b *testing.B) {
	for _, s := range []awsBenchShape{
		{name: "GET", method: http.MethodGet},
		{name: "PUT-4KiB", method: http.MethodPut, body: bytes.Repeat([]byte(`{"k":"0123456789abcdef0123456789"}`+"\n"), 4096/35+1)[:4096]},
	} {
		b.Run(s.name, func(b *testing.B) {
			r := newAWSResignRig(b)
			const conc = 8
			// Warm both pools; the upstream verifies every re-signed
			// request's signature with the real secret meanwhile.
			r.verify.Store(true)
			bearer, signed, _ := r.build(b, s, 200, 0)
			r.send(b, r.bearer, bearer, conc)
			r.send(b, r.signed, signed, conc)
			r.verify.Store(false)
			if got := r.verified.Load(); got != int64(len(signed)) {
				b.Fatalf("the upstream verified %d re-signed requests of %d", got, len(signed))
			}
			n := max(b.N/benchRounds, 4000)
			var br, sr, ratio, cpuRatio []float64
			var bc, sc, sign []time.Duration
			b.ResetTimer()
			for round := 1; round <= benchRounds; round++ {
				b.StopTimer()
				bearer, signed, signing := r.build(b, s, n, round)
				b.StartTimer()
				var bRate, sRate float64
				var bCPU, sCPU time.Duration
				if round%2 == 0 {
					bRate, bCPU = r.send(b, r.bearer, bearer, conc)
					sRate, sCPU = r.send(b, r.signed, signed, conc)
				} else {
					sRate, sCPU = r.send(b, r.signed, signed, conc)
					bRate, bCPU = r.send(b, r.bearer, bearer, conc)
				}
				br, sr, ratio = append(br, bRate), append(sr, sRate), append(ratio, bRate/sRate)
				cpuRatio = append(cpuRatio, float64(sCPU)/float64(bCPU))
				bc, sc, sign = append(bc, bCPU), append(sc, sCPU), append(sign, signing)
			}
			b.StopTimer()
			b.ReportMetric(medianOf(br), "bearer_req/s")
			b.ReportMetric(medianOf(sr), "sigv4_req/s")
			b.ReportMetric(1e9/medianOf(br), "bearer_ns/req")
			b.ReportMetric(1e9/medianOf(sr), "sigv4_ns/req")
			b.ReportMetric(medianOf(ratio), "ratio")
			b.ReportMetric(float64(median(bc).Nanoseconds())/1e3, "bearer_cpu_µs/req")
			b.ReportMetric(float64(median(sc).Nanoseconds())/1e3, "sigv4_cpu_µs/req")
			b.ReportMetric(medianOf(cpuRatio), "cpu_ratio")
			b.ReportMetric(float64(median(sign).Nanoseconds())/1e3, "client_sign_µs/req")
		})
	}
}

// awsChunk is the size of an aws-chunked body's chunks, as the Go SDK and
// botocore write them.
const awsChunk = 64 << 10

// awsChunkedLen is the length of an aws-chunked body of size bytes in
// chunks of chunk bytes (size a multiple of it), final chunk included.
func awsChunkedLen(size int64, chunk int) int64 {
	frame := func(n int) int64 {
		return int64(len(strconv.FormatInt(int64(n), 16)) + len(";chunk-signature=") + 64 + 2 + n + 2)
	}
	return size/int64(chunk)*frame(chunk) + frame(0)
}

// awsChainKey is SigV4's signing key.
func awsChainKey(secret, date string) []byte {
	k := []byte("AWS4" + secret)
	for _, s := range []string{date, awsBenchRegion, awsBenchService, "aws4_request"} {
		m := hmac.New(sha256.New, k)
		m.Write([]byte(s))
		k = m.Sum(nil)
	}
	return k
}

// awsChain is a chunk signature chain: the string to sign's fixed start,
// the key's HMAC and the last link.
type awsChain struct {
	prefix []byte // "AWS4-HMAC-SHA256-PAYLOAD\n<X-Amz-Date>\n<scope>\n"
	mac    hash.Hash
	prev   [64]byte
	sum    [sha256.Size]byte
}

func newAWSChain(secret, amzDate, seed string) *awsChain {
	date := amzDate[:8]
	c := &awsChain{
		prefix: []byte("AWS4-HMAC-SHA256-PAYLOAD\n" + amzDate + "\n" + date + "/" + awsBenchRegion + "/" + awsBenchService + "/aws4_request\n"),
		mac:    hmac.New(sha256.New, awsChainKey(secret, date)),
	}
	copy(c.prev[:], seed)
	return c
}

// link advances the chain over a chunk whose data has the hex SHA-256
// dataHash, and returns the new signature (valid until the next link).
func (c *awsChain) link(dataHash string) []byte {
	c.mac.Reset()
	c.mac.Write(c.prefix)
	c.mac.Write(c.prev[:])
	io.WriteString(c.mac, "\n"+awsEmptyHash+"\n")
	io.WriteString(c.mac, dataHash)
	hex.Encode(c.prev[:], c.mac.Sum(c.sum[:0]))
	return c.prev[:]
}

// awsChunkedBody writes an aws-chunked body on the fly, each chunk signed
// in chain: chunks chunks of data, then the final one. Every chunk carries
// the same data, so its hash is computed once and the client's cost per
// chunk is one HMAC (an SDK hashes each chunk; the proxy does too, as it
// cannot know they are alike). Its memory is one chunk whatever the size.
type awsChunkedBody struct {
	chain    *awsChain
	data     []byte
	dataHash string
	chunks   int
	ended    bool
	head     []byte
	parts    [3][]byte
	np, ip   int
}

var awsCRLF = []byte("\r\n")

func (c *awsChunkedBody) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if c.ip == c.np && !c.next() {
			break
		}
		k := copy(p[n:], c.parts[c.ip])
		c.parts[c.ip] = c.parts[c.ip][k:]
		if len(c.parts[c.ip]) == 0 {
			c.ip++
		}
		n += k
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// next queues the next frame's parts; false at the end of the body.
func (c *awsChunkedBody) next() bool {
	c.ip = 0
	switch {
	case c.chunks > 0:
		c.chunks--
		c.head = fmt.Appendf(c.head[:0], "%x;chunk-signature=%s\r\n", len(c.data), c.chain.link(c.dataHash))
		c.parts, c.np = [3][]byte{c.head, c.data, awsCRLF}, 3
	case !c.ended:
		c.ended = true
		c.head = fmt.Appendf(c.head[:0], "0;chunk-signature=%s\r\n\r\n", c.chain.link(awsEmptyHash))
		c.parts, c.np = [3][]byte{c.head}, 1
	default:
		c.np = 0
		return false
	}
	return true
}

// checkAWSChunks reads an aws-chunked body of chunks of data (and the
// final one), checking each chunk's data and its signature in chain; it
// returns the data bytes read.
func checkAWSChunks(body io.Reader, chain *awsChain, data []byte, dataHash string) (int64, error) {
	br := bufio.NewReaderSize(body, 64<<10)
	buf := make([]byte, len(data)+2)
	var decoded int64
	for i := 0; ; i++ {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return decoded, fmt.Errorf("chunk %d header: %w", i, err)
		}
		size, sig, ok := strings.Cut(strings.TrimSuffix(string(line), "\r\n"), ";chunk-signature=")
		n, err := strconv.ParseUint(size, 16, 32)
		if !ok || err != nil || len(sig) != 64 || (n != 0 && n != uint64(len(data))) {
			return decoded, fmt.Errorf("chunk %d header %.40q", i, line)
		}
		frame := buf[:n+2]
		if _, err := io.ReadFull(br, frame); err != nil {
			return decoded, fmt.Errorf("chunk %d: %w", i, err)
		}
		h := dataHash
		switch {
		case string(frame[n:]) != "\r\n":
			return decoded, fmt.Errorf("chunk %d not ended by CRLF", i)
		case n == 0:
			h = awsEmptyHash
		case !bytes.Equal(frame[:n], data):
			return decoded, fmt.Errorf("chunk %d data changed", i)
		}
		if !hmac.Equal(chain.link(h), []byte(sig)) {
			return decoded, fmt.Errorf("chunk %d: its signature is not the chain's", i)
		}
		decoded += int64(n)
		if n == 0 {
			if _, err := br.ReadByte(); err != io.EOF {
				return decoded, errors.New("bytes after the final chunk")
			}
			return decoded, nil
		}
	}
}

// awsUpload is one upload's result at the upstream.
type awsUpload struct {
	raw, decoded int64
	err          error
}

// BenchmarkAWSStreamingUpload1GiB: a 1 GiB aws-chunked upload
// (STREAMING-AWS4-HMAC-SHA256-PAYLOAD, 64 KiB chunks) signed with the
// task's aws placeholders, which the proxy verifies and re-signs chunk by
// chunk as it streams, against the same bytes sent with a bearer header
// key (target: peak RSS of the proxy < 64 MiB, and ratio, the re-signed
// upload's throughput over the bearer one's, >= 0.8).
//
// Each side has a proxy child of its own (as BenchmarkStream1GiBPeakRSS's,
// wired as edge serve is), so that each VmHWM holds one side's upload
// only: sigv4 is an aws key for s3.us-east-1.amazonaws.com; bearer a key
// in headers only for api.example.test, whose bodies the proxy scans for
// placeholders as it streams them. Both children reach one upstream in
// this process. The client writes the same aws-chunked body both times,
// generated on the fly (its chain signed with the placeholder secret);
// the upstream checks every chunk's data and signature: with the real
// secret, seeded by the re-signed header's signature, for the re-signed
// upload (a chain the proxy did not re-sign fails it), with the
// placeholder secret, unchanged, for the bearer one. Client and upstream
// work is thus the same on both sides; only the proxy's differs. Each
// iteration uploads bearer, sigv4, sigv4, bearer; throughput is bytes on
// the wire over the time to the answer, summed per side.
func BenchmarkAWSStreamingUpload1GiB(b *testing.B) {
	const size = 1 << 30
	uca := edgetest.NewCA(b)
	up := startUpstream(b, uca, false, "api.example.test", awsBenchHost)
	up.noRecord = true
	data := bytes.Repeat([]byte("lorem ipsum dolor sit amet, consectetur adipiscing elit 0123456\n"), awsChunk/64)
	sum := sha256.Sum256(data)
	dataHash := hex.EncodeToString(sum[:])
	var ph aws.Credentials
	var bearerSeed atomic.Pointer[string]
	var mu sync.Mutex
	results := map[string]awsUpload{}
	up.handler = func(w http.ResponseWriter, req *http.Request) {
		host := benchHostname(req.Host)
		res := awsUpload{raw: req.ContentLength}
		var chain *awsChain
		switch host {
		case "api.example.test":
			if req.Header.Get("Authorization") != "Bearer "+benchKey {
				res.err = errors.New("no real value in Authorization")
				break
			}
			chain = newAWSChain(ph.SecretAccessKey, req.Header.Get("X-Amz-Date"), *bearerSeed.Load())
		case awsBenchHost:
			sig, err := awssig.Parse(req)
			switch {
			case err != nil:
				res.err = err
			case sig.AccessKeyID != awsBenchReal.AccessKeyID || req.Header.Get("X-Amz-Security-Token") != awsBenchReal.SessionToken:
				res.err = errors.New("not signed with the real credentials")
			default:
				if res.err = awssig.Verify(req, sig, awsBenchReal.SecretAccessKey, ""); res.err == nil {
					chain = newAWSChain(awsBenchReal.SecretAccessKey, req.Header.Get("X-Amz-Date"), sig.Signature)
				}
			}
		}
		if chain != nil {
			res.decoded, res.err = checkAWSChunks(req.Body, chain, data, dataHash)
		}
		io.Copy(io.Discard, req.Body)
		mu.Lock()
		results[host] = res
		mu.Unlock()
		if res.err != nil {
			w.WriteHeader(http.StatusBadRequest)
		}
		io.WriteString(w, "ok")
	}

	sides := []struct {
		name   string
		target string
		c      *child
		client *http.Client
		base   childMem
		bytes  int64
		time   time.Duration
		cpu    time.Duration
	}{
		{name: "bearer", target: "api.example.test", c: startChild(b, childSpec{UpstreamPort: up.port, UpstreamCA: string(uca.PEM),
			Keys: fmt.Sprintf(`{"acme": {"keys": {"K": {"domains": ["api.example.test:%d"], "in": ["header"], "placeholder": {"prefix": "sk-"}}}}}`, up.port)})},
		{name: "sigv4", target: awsBenchHost, c: startChild(b, childSpec{UpstreamPort: up.port, UpstreamCA: string(uca.PEM),
			Keys:    fmt.Sprintf(`{"acme": {"keys": {"K": %s}}}`, awsKeyPolicy(up.port)),
			Secrets: map[string]string{"acme/K": awsBenchValue()}, Pins: []string{awsBenchHost}})},
	}
	ph = awsPlaceholders(b, sides[1].c.hello.TaskKeys)
	for i := range sides {
		s := &sides[i]
		s.base = s.c.mem(b)
		s.client = &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(s.c.proxy), TLSClientConfig: &tls.Config{RootCAs: s.c.pool}}}
	}
	signer := v4.NewSigner()
	raw := awsChunkedLen(size, awsChunk)
	upload := func(i int) {
		s := &sides[i]
		req, err := http.NewRequest(http.MethodPut, fmt.Sprintf("https://%s:%d/bench-bucket/upload.bin", s.target, up.port), nil)
		must(b, err)
		req.ContentLength = raw
		req.Header.Set("User-Agent", awsBenchUA)
		req.Header.Set("Content-Encoding", "aws-chunked")
		req.Header.Set("X-Amz-Content-Sha256", awsStreamingValue)
		req.Header.Set("X-Amz-Decoded-Content-Length", strconv.Itoa(size))
		must(b, signer.SignHTTP(context.Background(), ph, req, awsStreamingValue, awsBenchService, awsBenchRegion, time.Now(), awsSignS3))
		_, seed, _ := strings.Cut(req.Header.Get("Authorization"), "Signature=")
		if s.name == "bearer" {
			// The same request, authorised by the bearer key instead.
			req.Header.Set("Authorization", "Bearer "+s.c.hello.Placeholder)
			req.Header.Del("X-Amz-Security-Token")
			bearerSeed.Store(&seed)
		}
		req.Body = io.NopCloser(&awsChunkedBody{chain: newAWSChain(ph.SecretAccessKey, req.Header.Get("X-Amz-Date"), seed), data: data, dataHash: dataHash, chunks: size / awsChunk})
		cpu0 := s.c.cpu(b)
		start := time.Now()
		res, err := s.client.Do(req)
		must(b, err)
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		elapsed := time.Since(start)
		s.cpu += s.c.cpu(b) - cpu0
		mu.Lock()
		got := results[benchHostname(req.URL.Host)]
		mu.Unlock()
		if res.StatusCode != http.StatusOK || got.err != nil || got.raw != raw || got.decoded != size {
			b.Fatalf("%s upload: status %d; the upstream got %d bytes (%d of data), want %d (%d): %v", s.name, res.StatusCode, got.raw, got.decoded, raw, size, got.err)
		}
		s.bytes += raw
		s.time += elapsed
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, side := range []int{0, 1, 1, 0} {
			upload(side)
		}
	}
	b.StopTimer()
	rate := func(i int) float64 { return float64(sides[i].bytes) / (1 << 20) / sides[i].time.Seconds() }
	cpuPerGiB := func(i int) float64 { return sides[i].cpu.Seconds() / (float64(sides[i].bytes) / (1 << 30)) }
	after := [2]childMem{sides[0].c.mem(b), sides[1].c.mem(b)}
	b.ReportMetric(rate(0), "bearer_MiB/s")
	b.ReportMetric(rate(1), "sigv4_MiB/s")
	b.ReportMetric(rate(1)/rate(0), "ratio")
	b.ReportMetric(float64(after[1].VmHWM)/(1<<20), "peak_RSS_MiB")
	b.ReportMetric(float64(sides[1].base.VmHWM)/(1<<20), "idle_peak_RSS_MiB")
	b.ReportMetric((float64(after[1].VmHWM)-float64(sides[1].base.VmHWM))/(1<<20), "peak_RSS_growth_MiB")
	b.ReportMetric(float64(after[0].VmHWM)/(1<<20), "bearer_peak_RSS_MiB")
	b.ReportMetric(cpuPerGiB(0), "bearer_proxy_cpu_s/GiB")
	b.ReportMetric(cpuPerGiB(1), "sigv4_proxy_cpu_s/GiB")
}
