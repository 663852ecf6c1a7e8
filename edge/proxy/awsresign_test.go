package proxy

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"github.com/aws/smithy-go"
	"github.com/runfleet/runfleet/tests/kit/awsfront"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy/awssig"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/edge/upstream"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// These tests drive SigV4 re-signing as a task meets it: aws-sdk-go-v2's
// STS, S3 and DynamoDB clients (and its v4 signer, for requests an SDK
// would not make on its own) configured with nothing but the task's
// placeholder credentials (TaskKeys), the proxy as their HTTPS proxy and
// its CA as their trust, against one loopback TLS upstream standing for
// AWS (sts, s3 and dynamodb in us-east-1 pinned to it). The upstream lets
// in only what the REAL credentials signed, checked twice: with awssig's
// Parse and Verify, and by the verifier of tests/kit/awsfront, written from
// the specification apart from awssig, so that a canonicalisation the proxy's
// signer and verifier share cannot pass unseen; an aws-chunked body's
// chain is checked chunk by chunk with the real secret. It answers as AWS
// does (XML and JSON, an error quoting the key id). The proxy's clock is
// a Fake the tests set, so X-Amz-Date is judged against a time they
// control; nothing sleeps.

// The task's own AWS key (no placeholder of edge's): requests it signs are
// the task's business, passed on untouched. The upstream knows it too.
const (
	ownAWSID     = "AKIAOWNTASKKEY0EXMPL"
	ownAWSSecret = "tAsKoWnSeCrEttAsKoWnSeCrEttAsKoWnSeCrEt0"
)

// sigAWSKeys is what the upstream, as AWS, knows of each access key id.
var sigAWSKeys = map[string]struct{ secret, token string }{
	realAWSID:  {realAWSSecret, ""},
	realASIAID: {realASIASec, realASIAToken},
	ownAWSID:   {ownAWSSecret, ""},
}

const (
	stsHost = "sts.us-east-1.amazonaws.com"
	s3Host  = "s3.us-east-1.amazonaws.com"
	ddbHost = "dynamodb.us-east-1.amazonaws.com"
	apiHost = "api.example.test"
)

// sigRig is one proxy, its clock a Fake, whose policy gives project acme
//
//	DEPLOY  an aws key of long-term credentials (realAWSID), for sts, s3
//	        and dynamodb in us-east-1, reaching the three names;
//	TEMP    an aws key of temporary credentials (realASIAID and a token),
//	        envPrefix TEMP_AWS_, for s3 in us-east-1, reaching s3 only;
//	A       a plain header key for api.example.test.
type sigRig struct {
	*env
	clk               *clock.Fake
	up                *testUpstream
	sts, s3, ddb, api string // host:port
	mu                sync.Mutex
	checks            []*sigCheck
	sentEcho          map[string]string // path: the body of an echoing answer as the upstream sent it
}

// sigCheck is what the upstream made of one request to an AWS name.
type sigCheck struct {
	method, host, path string
	// id is the access key id the request was signed with; token the
	// security token it carried (header, or query when presigned).
	id, token string
	presigned bool
	// err: nil when the signature verifies (awssig.Verify) with the
	// secret of id, the token is id's, and the body is the one signed.
	err error
	// indep: nil when awsfront.VerifySignature agrees.
	indep error
	// chunks and data: an aws-chunked body's chunks whose real-chain
	// signature checked, and their data.
	chunks int
	data   []byte
}

func newSigRig(t *testing.T) *sigRig {
	t.Helper()
	uca := edgetest.NewCA(t)
	up := startUpstream(t, uca, false, stsHost, s3Host, ddbHost, apiHost)
	p := up.port
	e := newEnv(t, envOptions{
		uca:  uca,
		pins: map[string]string{stsHost: "127.0.0.1", s3Host: "127.0.0.1", ddbHost: "127.0.0.1", apiHost: "127.0.0.1"},
		keys: fmt.Sprintf(`{"acme": {"keys": {
			"DEPLOY": {"kind": "aws", "domains": ["%s:%d", "%s:%d", "%s:%d"], "aws": {"regions": ["us-east-1"], "services": ["sts", "s3", "dynamodb"]}},
			"TEMP": {"kind": "aws", "domains": ["%s:%d"], "aws": {"regions": ["us-east-1"], "services": ["s3"], "envPrefix": "TEMP_AWS_"}},
			"A": {"domains": ["%s:%d"], "in": ["header"]}}}}`, stsHost, p, s3Host, p, ddbHost, p, s3Host, p, apiHost, p),
		secrets: map[string]string{"acme/DEPLOY": staticAWSValue, "acme/TEMP": temporaryAWSValue, "acme/A": realA},
	})
	clk := clock.NewFake(time.Now())
	e.useClock(t, clk)
	g := &sigRig{env: e, clk: clk, up: up, sentEcho: map[string]string{},
		sts: stsHost + ":" + itoa(p), s3: s3Host + ":" + itoa(p), ddb: ddbHost + ":" + itoa(p), api: apiHost + ":" + itoa(p)}
	up.handler = g.answer
	t.Cleanup(func() {
		e.assertNoLeak(realAWSID, realAWSSecret, realASIAID, realASIASec, realASIAToken, realA)
	})
	return g
}

// awsErrorOf reads a refusal as an AWS client does: S3's <Error>, the
// query protocol's <ErrorResponse><Error>, or the JSON protocols'
// {"__type", "message"}; it fails the test for any other body.
func awsErrorOf(t *testing.T, body string) (code, message string) {
	t.Helper()
	var e struct {
		Code    string `xml:"Code" json:"__type"`
		Message string `xml:"Message" json:"message"`
		Error   *struct {
			Code    string `xml:"Code"`
			Message string `xml:"Message"`
		} `xml:"Error" json:"-"`
	}
	if strings.HasPrefix(body, "{") {
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			t.Fatalf("a refusal that is no AWS JSON error: %q", body)
		}
		return e.Code, e.Message
	}
	if err := xml.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("a refusal that is no AWS XML error: %q", body)
	}
	if e.Error != nil {
		return e.Error.Code, e.Error.Message
	}
	return e.Code, e.Message
}

// testAWSBodyLimit is the rig's Config.AWSBodyLimit: small, so a body
// past it is cheap to send.
const testAWSBodyLimit = 1 << 20

// useClock replaces the env's proxy by one wired the same (newEnv's
// listener, guard, upstream trust, secrets file, audit and log) whose
// Config.Clock is clk: newEnv has no clock option. Nothing is registered
// yet, so nothing is lost.
func (e *env) useClock(t *testing.T, clk clock.Clock) {
	t.Helper()
	must(t, e.proxy.Close())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	guard, err := upstream.NewGuard(upstream.GuardConfig{Resolver: e.resolver,
		AllowPrivate: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Own:          []netip.AddrPort{netip.MustParseAddrPort(ln.Addr().String())}})
	must(t, err)
	tlsCfg, err := upstream.ClientTLSConfig(filepath.Join(e.dir, "upstream-ca.pem"))
	must(t, err)
	src, err := secrets.NewFileSource(filepath.Join(e.dir, "secrets.json"))
	must(t, err)
	logger := slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p, err := New(Config{
		Listener: ln, Egress: policy.EgressOpen, DataDir: e.dir, Policy: e.watcher, Leaves: e.authority,
		Secrets: src, Upstream: guard, UpstreamTLS: tlsCfg, Audit: e.audit, Logger: logger, Clock: clk,
		AWSBodyLimit: testAWSBodyLimit,
	})
	must(t, err)
	e.proxy, e.listener = p, ln // newEnv's cleanup closes e.proxy: this one
	go p.Serve()
	await.Cond(t, 5*time.Second, "the proxy with the test's clock to serve", func() bool { return p.Ready() == nil })
}

// answer is the upstream, as AWS: it checks each request's signature
// with the real secret of the access key id it names and answers as the
// service does; api.example.test answers "ok".
func (g *sigRig) answer(w http.ResponseWriter, r *http.Request) {
	got := g.up.requests() // the recording upstream read the body
	body := got[len(got)-1].Body
	host := benchHostname(r.Host)
	if host == apiHost {
		io.WriteString(w, "ok\n")
		return
	}
	c := sigVerify(r, body)
	g.mu.Lock()
	g.checks = append(g.checks, c)
	g.mu.Unlock()
	if c.err != nil || c.indep != nil {
		// As AWS answers a signature it cannot verify: naming the key id.
		sigXMLError(w, http.StatusForbidden, "SignatureDoesNotMatch", "The request signature we calculated does not match the signature you provided. Check your key and signing method.",
			"<AWSAccessKeyId>"+c.id+"</AWSAccessKeyId>")
		return
	}
	switch {
	case host == stsHost:
		form, _ := url.ParseQuery(string(body))
		if r.Method == http.MethodGet {
			form = r.URL.Query()
		}
		if form.Get("Action") != "GetCallerIdentity" {
			sigXMLError(w, http.StatusBadRequest, "InvalidAction", "Could not find operation "+form.Get("Action"), "")
			return
		}
		w.Header().Set("Content-Type", "text/xml")
		fmt.Fprintf(w, `<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <GetCallerIdentityResult>
    <Arn>arn:aws:iam::123456789012:user/deploy</Arn>
    <UserId>AIDAEXAMPLEUSERID0001</UserId>
    <Account>123456789012</Account>
  </GetCallerIdentityResult>
  <ResponseMetadata><RequestId>01234567-89ab-cdef-0123-456789abcdef</RequestId></ResponseMetadata>
</GetCallerIdentityResponse>`)
	case host == ddbHost:
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		io.WriteString(w, `{"TableNames":["acme-table"]}`)
	case strings.Contains(r.URL.Path, "/echo"):
		// An error body quoting what the request carried, as AWS's
		// quote the key id (and, here, all the rest).
		k := sigAWSKeys[c.id]
		detail := "<AWSAccessKeyId>" + c.id + "</AWSAccessKeyId><Authorization>" + r.Header.Get("Authorization") +
			"</Authorization><SecurityToken>" + c.token + "</SecurityToken><Secret>" + k.secret + "</Secret>"
		w.Header().Set("X-Amz-Echo-Key", c.id)
		w.Header().Set("X-Amz-Echo-Token", c.token)
		sent := sigXMLError(w, http.StatusForbidden, "AccessDenied", "Access Denied for "+c.id, detail)
		g.mu.Lock()
		g.sentEcho[r.URL.Path] = sent
		g.mu.Unlock()
	case r.Method == http.MethodPut:
		sum := sha256.Sum256(c.data)
		if c.chunks == 0 {
			sum = sha256.Sum256(body)
		}
		w.Header().Set("ETag", `"`+hex.EncodeToString(sum[:16])+`"`)
	default:
		w.Header().Set("Content-Type", "binary/octet-stream")
		io.WriteString(w, "object data of "+r.URL.Path)
	}
}

// sigXMLError writes an AWS XML error and returns the body written.
func sigXMLError(w http.ResponseWriter, status int, code, message, detail string) string {
	body := `<?xml version="1.0" encoding="UTF-8"?>` + "\n<Error><Code>" + code + "</Code><Message>" + message + "</Message>" +
		detail + "<RequestId>4442587FB7D0A2F9</RequestId></Error>"
	w.Header().Set("Content-Type", "application/xml")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	io.WriteString(w, body)
	return body
}

// sigVerify checks a request as AWS would, with the secret of the access
// key id it names.
func sigVerify(r *http.Request, body []byte) *sigCheck {
	c := &sigCheck{method: r.Method, host: benchHostname(r.Host), path: r.URL.Path}
	sig, err := awssig.Parse(r)
	if err != nil {
		c.err = err
		return c
	}
	c.id, c.presigned = sig.AccessKeyID, sig.Presigned
	c.token = r.Header.Get("X-Amz-Security-Token")
	if sig.Presigned {
		c.token = r.URL.Query().Get("X-Amz-Security-Token")
	}
	k, ok := sigAWSKeys[sig.AccessKeyID]
	switch {
	case !ok:
		c.err = errors.New("the access key id is not one AWS knows")
		return c
	case c.token != k.token:
		c.err = errors.New("the security token is not the key's")
		return c
	}
	bodyHash := ""
	if sig.PayloadHash == "" && !(sig.Presigned && sig.Service == "s3") {
		bodyHash = sigSHA(body)
	}
	c.err = awssig.Verify(r, sig, k.secret, bodyHash)
	c.indep = awsfront.VerifySignature(r, k.secret, body)
	switch {
	case c.err != nil:
	case sig.Payload == awssig.Literal && sig.PayloadHash != "" && sig.PayloadHash != sigSHA(body):
		c.err = errors.New("the body is not the one x-amz-content-sha256 names")
	case sig.Payload == awssig.Streaming:
		c.data, c.chunks, c.err = sigDecodeChunked(body, k.secret, r.Header.Get("X-Amz-Date"), sig.Signature)
	}
	return c
}

func sigSHA(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func sigHMAC(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

// sigEncodeChunked writes chunks as an aws-chunked body, each signed in
// the chain of secret seeded by the request's signature, as an SDK writes
// it; the chunk at tamper (-1: none) then has a byte of its data changed,
// its signature left as signed.
func sigEncodeChunked(secret, amzDate, seed string, chunks [][]byte, tamper int) []byte {
	chain := newAWSChain(secret, amzDate, seed)
	var b bytes.Buffer
	for i, c := range chunks {
		fmt.Fprintf(&b, "%x;chunk-signature=%s\r\n", len(c), chain.link(sigSHA(c)))
		if i == tamper {
			c = bytes.Clone(c)
			c[len(c)/2] ^= 1
		}
		b.Write(c)
		b.WriteString("\r\n")
	}
	fmt.Fprintf(&b, "0;chunk-signature=%s\r\n\r\n", chain.link(awsEmptyHash))
	return b.Bytes()
}

// sigDecodeChunked reads an aws-chunked body, checking each chunk's
// signature in the chain of secret seeded by seed; it returns the data and
// how many chunks (final one excluded) checked.
func sigDecodeChunked(body []byte, secret, amzDate, seed string) ([]byte, int, error) {
	chain := newAWSChain(secret, amzDate, seed)
	var data []byte
	for i := 0; ; i++ {
		line, rest, ok := bytes.Cut(body, []byte("\r\n"))
		if !ok {
			return data, i, fmt.Errorf("chunk %d: truncated header", i)
		}
		size, sig, ok := strings.Cut(string(line), ";chunk-signature=")
		n, err := strconv.ParseUint(size, 16, 31)
		if !ok || err != nil {
			return data, i, fmt.Errorf("chunk %d: header malformed", i)
		}
		if uint64(len(rest)) < n+2 {
			return data, i, fmt.Errorf("chunk %d: truncated", i)
		}
		chunk := rest[:n]
		if string(chain.link(sigSHA(chunk))) != sig {
			return data, i, fmt.Errorf("chunk %d: its signature is not the real chain's", i)
		}
		if string(rest[n:n+2]) != "\r\n" {
			return data, i, fmt.Errorf("chunk %d: not ended by CRLF", i)
		}
		body = rest[n+2:]
		if n == 0 {
			if len(body) != 0 {
				return data, i, errors.New("bytes after the final chunk")
			}
			return data, i, nil
		}
		data = append(data, chunk...)
	}
}

// requests to path as the upstream got them, and its checks of them.
func (g *sigRig) reached(path string) []seen {
	var out []seen
	for _, r := range g.up.requests() {
		if r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

func (g *sigRig) checksOf(path string) []*sigCheck {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []*sigCheck
	for _, c := range g.checks {
		if c.path == path {
			out = append(out, c)
		}
	}
	return out
}

// assertResigned: the upstream got exactly one request at path, signed
// with the real credentials of id (and its token), both checks passing.
func (g *sigRig) assertResigned(t *testing.T, path, id string) *sigCheck {
	t.Helper()
	cs := g.checksOf(path)
	if len(cs) != 1 {
		t.Fatalf("%s: the upstream checked %d requests, want 1", path, len(cs))
	}
	c := cs[0]
	if c.id != id {
		t.Errorf("%s: signed with access key id %q, want the real one", path, c.id)
	}
	if want := sigAWSKeys[id].token; c.token != want {
		t.Errorf("%s: security token %d chars, not the real one", path, len(c.token))
	}
	if c.err != nil {
		t.Errorf("%s: the signature does not verify with the real secret (awssig): %v", path, c.err)
	}
	if c.indep != nil {
		t.Errorf("%s: the signature does not verify with the real secret (recomputed from the specification): %v", path, c.indep)
	}
	return c
}

// auditOf waits for the audit line of the request at path to host.
func (g *sigRig) auditOf(host, path string) map[string]any {
	return g.waitAudit(func(m map[string]any) bool {
		return m["path"] == path && strings.HasPrefix(fmt.Sprint(m["host"]), host+":") && m["method"] != "CONNECT"
	})
}

// assertAuditResigned: the line is substituted, names key alone, and has
// the aws block want.
func assertAuditResigned(t *testing.T, line map[string]any, key string, want map[string]any) {
	t.Helper()
	if line["action"] != "substituted" || fmt.Sprint(line["keys"]) != "["+key+"]" || line["status"] == nil {
		t.Errorf("audit %v: want action substituted, keys [%s]", line, key)
	}
	got, _ := line["aws"].(map[string]any)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("audit aws %v, want %v", got, want)
	}
}

// sigTask is a registered run holding DEPLOY, TEMP and A, its
// placeholders as its variables give them, and a client through the proxy
// that records every answer it reads.
type sigTask struct {
	runID        string
	proxy        *url.URL
	deploy, temp aws.Credentials
	tap          *answerTap
}

func (g *sigRig) newTask(t *testing.T, runID string, h2 bool) *sigTask {
	t.Helper()
	u, _ := g.env.task(runID, runspec.Secret{ProjectID: "acme", Key: "DEPLOY"}, runspec.Secret{ProjectID: "acme", Key: "TEMP"}, runspec.Secret{ProjectID: "acme", Key: "A"})
	keys, err := g.proxy.TaskKeys(runID)
	must(t, err)
	vars := map[string]string{}
	for _, k := range keys {
		vars[k.Var] = k.Placeholder
	}
	k := &sigTask{runID: runID, proxy: u, tap: &answerTap{c: g.goClient(u, h2)},
		deploy: aws.Credentials{AccessKeyID: vars["AWS_ACCESS_KEY_ID"], SecretAccessKey: vars["AWS_SECRET_ACCESS_KEY"], SessionToken: vars["AWS_SESSION_TOKEN"]},
		temp:   aws.Credentials{AccessKeyID: vars["TEMP_AWS_ACCESS_KEY_ID"], SecretAccessKey: vars["TEMP_AWS_SECRET_ACCESS_KEY"], SessionToken: vars["TEMP_AWS_SESSION_TOKEN"]},
	}
	if !awsIDPattern.MatchString(k.deploy.AccessKeyID) || k.deploy.SecretAccessKey == "" || k.deploy.SessionToken != "" ||
		!awsTempIDPattern.MatchString(k.temp.AccessKeyID) || k.temp.SecretAccessKey == "" || k.temp.SessionToken == "" {
		t.Fatalf("the task's aws variables are not placeholders of its keys' kinds: %d variables", len(vars))
	}
	t.Cleanup(func() {
		k.tap.assertReadNoRealValue(t, runID)
		// Nothing edge writes holds a placeholder either.
		g.assertNoLeak(k.deploy.AccessKeyID, k.deploy.SecretAccessKey, k.temp.AccessKeyID, k.temp.SecretAccessKey, k.temp.SessionToken)
	})
	return k
}

// overH2 is the same task with a client of its own speaking HTTP/2 to
// the proxy.
func (k *sigTask) overH2(t *testing.T, g *sigRig) *sigTask {
	h2 := *k
	h2.tap = &answerTap{c: g.goClient(k.proxy, true)}
	t.Cleanup(func() { h2.tap.assertReadNoRealValue(t, k.runID+" over HTTP/2") })
	return &h2
}

// answerTap is the task's HTTP client, recording every answer's status,
// fields and body as the client reads them (an SDK's too: it is the SDK's
// HTTPClient).
type answerTap struct {
	c    *http.Client
	mu   sync.Mutex
	seen bytes.Buffer
}

func (a *answerTap) Do(req *http.Request) (*http.Response, error) {
	res, err := a.c.Do(req)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		fmt.Fprintf(&a.seen, "error: %v\n", err)
		return nil, err
	}
	fmt.Fprintf(&a.seen, "%s\n", res.Status)
	res.Header.Write(&a.seen)
	res.Body = &tappedBody{rc: res.Body, a: a, res: res}
	return res, nil
}

// assertReadNoRealValue: no answer the client read holds a real
// credential.
func (a *answerTap) assertReadNoRealValue(t *testing.T, who string) {
	t.Helper()
	saw := a.saw()
	for _, real := range []string{realAWSID, realAWSSecret, realASIAID, realASIASec, realASIAToken} {
		if strings.Contains(saw, real) {
			t.Errorf("%s: the client read a real credential (%d chars) in an answer", who, len(real))
		}
	}
}

func (a *answerTap) saw() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.seen.String()
}

type tappedBody struct {
	rc  io.ReadCloser
	a   *answerTap
	res *http.Response
}

func (b *tappedBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.a.mu.Lock()
	b.a.seen.Write(p[:n])
	if err == io.EOF {
		b.res.Trailer.Write(&b.a.seen)
	}
	b.a.mu.Unlock()
	return n, err
}

func (b *tappedBody) Close() error { return b.rc.Close() }

// do sends req with the task's client and reads the answer.
func (k *sigTask) do(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	res, err := k.tap.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", req.Method, req.URL.Path, err)
	}
	return res.StatusCode, string(body)
}

// sdk is an SDK configuration of creds alone, the proxy as its HTTPS
// proxy and edge's CA its trust (the tap's client), no retries.
func (k *sigTask) sdk(creds aws.Credentials) aws.Config {
	return aws.Config{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider(creds.AccessKeyID, creds.SecretAccessKey, creds.SessionToken),
		HTTPClient:  k.tap,
		Retryer:     func() aws.Retryer { return aws.NopRetryer{} },
	}
}

func (g *sigRig) stsClient(k *sigTask, creds aws.Credentials) *sts.Client {
	return sts.NewFromConfig(k.sdk(creds), func(o *sts.Options) { o.BaseEndpoint = aws.String("https://" + g.sts) })
}

func (g *sigRig) s3Client(k *sigTask, creds aws.Credentials) *s3.Client {
	return s3.NewFromConfig(k.sdk(creds), func(o *s3.Options) {
		o.BaseEndpoint = aws.String("https://" + g.s3)
		o.UsePathStyle = true
	})
}

func (g *sigRig) ddbClient(k *sigTask, creds aws.Credentials, opts ...func(*dynamodb.Options)) *dynamodb.Client {
	return dynamodb.NewFromConfig(k.sdk(creds), append([]func(*dynamodb.Options){func(o *dynamodb.Options) { o.BaseEndpoint = aws.String("https://" + g.ddb) }}, opts...)...)
}

// Payload modes of signed.
const (
	literalNoHeader = "" // the body's hash signed, no x-amz-content-sha256 (most services)
	literalHeader   = "literal"
)

// signed builds a request signed by the SDK's v4 signer with creds for
// service and region at time at: payload is literalNoHeader,
// literalHeader (x-amz-content-sha256 the body's hash) or the
// x-amz-content-sha256 value to sign with (UNSIGNED-PAYLOAD, STREAMING-...).
// header is set before signing.
func signed(t *testing.T, creds aws.Credentials, method, rawURL string, body []byte, payload, service, region string, at time.Time, header http.Header) *http.Request {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, rawURL, rd)
	must(t, err)
	for k, vs := range header {
		req.Header[k] = vs
	}
	hash := payload
	switch payload {
	case literalNoHeader:
		hash = sigSHA(body)
	case literalHeader:
		hash = sigSHA(body)
		req.Header.Set("X-Amz-Content-Sha256", hash)
	default:
		req.Header.Set("X-Amz-Content-Sha256", payload)
	}
	var opts []func(*v4.SignerOptions)
	if service == "s3" {
		opts = append(opts, awsSignS3)
	}
	must(t, v4.NewSigner().SignHTTP(context.Background(), creds, req, hash, service, region, at, opts...))
	return req
}

// presigned is a presigned URL made by the SDK's v4 signer with creds,
// valid for expires from at.
func presigned(t *testing.T, creds aws.Credentials, method, rawURL, service string, at time.Time, expires time.Duration) *http.Request {
	t.Helper()
	u, err := url.Parse(rawURL)
	must(t, err)
	q := u.Query()
	q.Set("X-Amz-Expires", strconv.Itoa(int(expires.Seconds())))
	u.RawQuery = q.Encode()
	req, err := http.NewRequest(method, u.String(), nil)
	must(t, err)
	var opts []func(*v4.SignerOptions)
	if service == "s3" {
		opts = append(opts, awsSignS3)
	}
	signedURL, hdr, err := v4.NewSigner().PresignHTTP(context.Background(), creds, req, "UNSIGNED-PAYLOAD", service, "us-east-1", at, opts...)
	must(t, err)
	out, err := http.NewRequest(method, signedURL, nil)
	must(t, err)
	for k, vs := range hdr {
		if k != "Host" {
			out.Header[k] = vs
		}
	}
	return out
}

// assertNoPlaceholderReached: no request the upstream got holds one of the
// task's aws placeholders anywhere (they are only ever signed with).
func (g *sigRig) assertNoPlaceholderReached(t *testing.T, k *sigTask) {
	t.Helper()
	for _, r := range g.up.requests() {
		all := fmt.Sprint(r.Path, r.RawQuery, r.Header) + string(r.Body)
		for _, ph := range []string{k.deploy.AccessKeyID, k.deploy.SecretAccessKey, k.temp.AccessKeyID, k.temp.SecretAccessKey, k.temp.SessionToken} {
			if strings.Contains(all, ph) {
				t.Errorf("%s %s reached the upstream holding an aws placeholder (%d chars)", r.Method, r.Path, len(ph))
			}
		}
	}
}

// sts GetCallerIdentity, as `aws sts get-caller-identity` makes it: a
// POST of a form body without x-amz-content-sha256, so the proxy reads
// the body to check the hash the signature covers. The SDK gets the
// identity; the upstream got the real access key id and a signature the
// real secret gives, never the placeholder; the audit line names the key
// and the scope. DynamoDB's JSON protocol (ListTables) takes the same
// path. Over HTTP/1.1 and HTTP/2 to the proxy.
func TestAWSResignSTSAndDynamoDBBySDK(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			g := newSigRig(t)
			k := g.newTask(t, "run-sts", h2)
			ctx := context.Background()
			out, err := g.stsClient(k, k.deploy).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
			if err != nil {
				t.Fatalf("GetCallerIdentity through the proxy: %v", err)
			}
			if aws.ToString(out.Account) != "123456789012" || aws.ToString(out.Arn) != "arn:aws:iam::123456789012:user/deploy" {
				t.Errorf("GetCallerIdentity: account %q arn %q", aws.ToString(out.Account), aws.ToString(out.Arn))
			}
			c := g.assertResigned(t, "/", realAWSID)
			if c.host != stsHost || c.method != http.MethodPost {
				t.Errorf("the upstream got %s to %s", c.method, c.host)
			}
			got := g.reached("/")[0]
			if got.Header.Get("X-Amz-Content-Sha256") != "" || !strings.Contains(string(got.Body), "Action=GetCallerIdentity") {
				t.Errorf("not the literal-hash form POST: x-amz-content-sha256 %q, body %q", got.Header.Get("X-Amz-Content-Sha256"), got.Body)
			}
			if got.Header.Get("X-Amz-Security-Token") != "" {
				t.Error("a long-term key's request reached the upstream with a security token")
			}
			assertAuditResigned(t, g.auditOf(stsHost, "/"), "acme/DEPLOY", map[string]any{"region": "us-east-1", "service": "sts", "payload": "literal"})

			tables, err := g.ddbClient(k, k.deploy).ListTables(ctx, &dynamodb.ListTablesInput{})
			if err != nil {
				t.Fatalf("ListTables through the proxy: %v", err)
			}
			if len(tables.TableNames) != 1 || tables.TableNames[0] != "acme-table" {
				t.Errorf("ListTables: %v", tables.TableNames)
			}
			cs := g.checksOf("/")
			if len(cs) != 2 || cs[1].host != ddbHost {
				t.Fatalf("the upstream checked %d requests, want sts's and dynamodb's", len(cs))
			}
			if cs[1].id != realAWSID || cs[1].err != nil || cs[1].indep != nil {
				t.Errorf("dynamodb: signed with %q; awssig: %v; recomputed: %v", cs[1].id, cs[1].err, cs[1].indep)
			}
			assertAuditResigned(t, g.auditOf(ddbHost, "/"), "acme/DEPLOY", map[string]any{"region": "us-east-1", "service": "dynamodb", "payload": "literal"})
			g.assertNoPlaceholderReached(t, k)
		})
	}
}

// S3 uploads: the SDK's PutObject with the temporary key (whatever
// payload mode it chooses), and PUTs signed UNSIGNED-PAYLOAD and with the
// literal x-amz-content-sha256, with either key. Each reaches the upstream
// signed with the real id, and the temporary key's with X-Amz-Security-
// Token the real token, never the placeholder's; a long-term key's
// carries none. The body is the task's, byte for byte.
func TestAWSResignS3Uploads(t *testing.T) {
	g := newSigRig(t)
	k := g.newTask(t, "run-s3", false)
	ctx := context.Background()
	data := []byte(`{"build": 42, "artifact": "app.tar.gz"}` + "\n")
	if _, err := g.s3Client(k, k.temp).PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String("acme-artifacts"), Key: aws.String("sdk/put.json"), Body: bytes.NewReader(data),
	}); err != nil {
		t.Fatalf("PutObject through the proxy: %v", err)
	}
	g.assertResigned(t, "/acme-artifacts/sdk/put.json", realASIAID)
	put := g.reached("/acme-artifacts/sdk/put.json")[0]
	mode := put.Header.Get("X-Amz-Content-Sha256")
	t.Logf("the SDK's PutObject signed x-amz-content-sha256 %q, content-encoding %q", mode, put.Header.Get("Content-Encoding"))
	if mode != "STREAMING-UNSIGNED-PAYLOAD-TRAILER" && !bytes.Equal(put.Body, data) {
		t.Errorf("PutObject: the upstream got %d body bytes, not the object", len(put.Body))
	}
	wantMode := mode
	if len(mode) == 64 {
		wantMode = "literal"
	}
	assertAuditResigned(t, g.auditOf(s3Host, "/acme-artifacts/sdk/put.json"), "acme/TEMP", map[string]any{"region": "us-east-1", "service": "s3", "payload": wantMode})

	// A body the SDK cannot rewind, with a checksum: it streams it
	// aws-chunked, the checksum in an unsigned trailer
	// (STREAMING-UNSIGNED-PAYLOAD-TRAILER); only the header is re-signed
	// and the body goes as it is.
	streamed := bytes.Repeat([]byte("streamed by the SDK\n"), 2000)
	if _, err := g.s3Client(k, k.deploy).PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String("acme-artifacts"), Key: aws.String("sdk/trailer.bin"), Body: io.MultiReader(bytes.NewReader(streamed)),
		ContentLength: aws.Int64(int64(len(streamed))), ChecksumAlgorithm: s3types.ChecksumAlgorithmCrc32,
	}); err != nil {
		t.Fatalf("PutObject of an unseekable body through the proxy: %v", err)
	}
	g.assertResigned(t, "/acme-artifacts/sdk/trailer.bin", realAWSID)
	put = g.reached("/acme-artifacts/sdk/trailer.bin")[0]
	if mode := put.Header.Get("X-Amz-Content-Sha256"); mode != "STREAMING-UNSIGNED-PAYLOAD-TRAILER" || !bytes.Contains(put.Body, streamed[:4096]) ||
		!bytes.Contains(put.Body, []byte("x-amz-checksum-crc32:")) {
		t.Errorf("PutObject of an unseekable body: x-amz-content-sha256 %q; the upstream got %d body bytes, not the object's aws-chunked with its trailer", mode, len(put.Body))
	}
	assertAuditResigned(t, g.auditOf(s3Host, "/acme-artifacts/sdk/trailer.bin"), "acme/DEPLOY", map[string]any{"region": "us-east-1", "service": "s3", "payload": "STREAMING-UNSIGNED-PAYLOAD-TRAILER"})

	for _, c := range []struct {
		name    string
		creds   aws.Credentials
		realID  string
		key     string
		payload string
		audit   string
	}{
		{"temporary-unsigned", k.temp, realASIAID, "acme/TEMP", "UNSIGNED-PAYLOAD", "UNSIGNED-PAYLOAD"},
		{"temporary-literal", k.temp, realASIAID, "acme/TEMP", literalHeader, "literal"},
		{"static-unsigned", k.deploy, realAWSID, "acme/DEPLOY", "UNSIGNED-PAYLOAD", "UNSIGNED-PAYLOAD"},
		{"static-literal", k.deploy, realAWSID, "acme/DEPLOY", literalHeader, "literal"},
	} {
		path := "/acme-artifacts/" + c.name + ".bin"
		body := bytes.Repeat([]byte(c.name+" 0123456789\n"), 300)
		req := signed(t, c.creds, http.MethodPut, "https://"+g.s3+path, body, c.payload, "s3", "us-east-1", g.clk.Now(),
			http.Header{"Content-Type": {"application/octet-stream"}})
		status, answer := k.do(t, req)
		if status != http.StatusOK {
			t.Errorf("%s: %d %q", c.name, status, answer)
			continue
		}
		g.assertResigned(t, path, c.realID)
		got := g.reached(path)[0]
		if !bytes.Equal(got.Body, body) {
			t.Errorf("%s: the upstream got %d body bytes, want the %d sent", c.name, len(got.Body), len(body))
		}
		if got.Header.Get("Content-Type") != "application/octet-stream" || got.Header.Get("X-Amz-Content-Sha256") != req.Header.Get("X-Amz-Content-Sha256") {
			t.Errorf("%s: a signed header changed on the way", c.name)
		}
		assertAuditResigned(t, g.auditOf(s3Host, path), c.key, map[string]any{"region": "us-east-1", "service": "s3", "payload": c.audit})
	}
	g.assertNoPlaceholderReached(t, k)
}

// Presigned URLs the task made itself with its placeholders (the SDK's
// presign client for S3 GetObject, with either key, and for STS
// GetCallerIdentity, as EKS tokens are made), fetched through the proxy:
// the upstream sees the real id in X-Amz-Credential (and the real token
// in X-Amz-Security-Token), with a presigned signature the real secret
// gives; the audit says presigned.
func TestAWSResignPresignedURLs(t *testing.T) {
	g := newSigRig(t)
	k := g.newTask(t, "run-presign", false)
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		creds  aws.Credentials
		realID string
		key    string
	}{
		{"static", k.deploy, realAWSID, "acme/DEPLOY"},
		{"temporary", k.temp, realASIAID, "acme/TEMP"},
	} {
		objKey := "presigned/" + c.name + ".txt"
		ps, err := s3.NewPresignClient(g.s3Client(k, c.creds)).PresignGetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("acme-artifacts"), Key: aws.String(objKey)},
			s3.WithPresignExpires(10*time.Minute))
		must(t, err)
		if !strings.Contains(ps.URL, "X-Amz-Credential="+c.creds.AccessKeyID) {
			t.Fatalf("%s: the presigned URL does not name the placeholder id", c.name)
		}
		req, err := http.NewRequest(ps.Method, ps.URL, nil)
		must(t, err)
		for h, vs := range ps.SignedHeader {
			if h != "Host" {
				req.Header[h] = vs
			}
		}
		path := "/acme-artifacts/" + objKey
		status, body := k.do(t, req)
		if status != http.StatusOK || body != "object data of "+path {
			t.Fatalf("%s: GET of the presigned URL: %d %q", c.name, status, body)
		}
		ch := g.assertResigned(t, path, c.realID)
		if !ch.presigned {
			t.Errorf("%s: the upstream did not get a presigned request", c.name)
		}
		q, _ := url.ParseQuery(g.reached(path)[0].RawQuery)
		if !strings.HasPrefix(q.Get("X-Amz-Credential"), c.realID+"/") || q.Get("X-Amz-Expires") != "600" {
			t.Errorf("%s: X-Amz-Credential %q, X-Amz-Expires %q", c.name, q.Get("X-Amz-Credential"), q.Get("X-Amz-Expires"))
		}
		assertAuditResigned(t, g.auditOf(s3Host, path), c.key, map[string]any{"region": "us-east-1", "service": "s3", "payload": "UNSIGNED-PAYLOAD", "presigned": true})
	}

	ps, err := sts.NewPresignClient(g.stsClient(k, k.deploy)).PresignGetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	must(t, err)
	req, err := http.NewRequest(ps.Method, ps.URL, nil)
	must(t, err)
	for h, vs := range ps.SignedHeader {
		if h != "Host" {
			req.Header[h] = vs
		}
	}
	if status, body := k.do(t, req); status != http.StatusOK || !strings.Contains(body, "<Account>123456789012</Account>") {
		t.Fatalf("%s of the presigned GetCallerIdentity: %d %q", ps.Method, status, body)
	}
	ch := g.assertResigned(t, "/", realAWSID)
	if !ch.presigned {
		t.Error("sts: the upstream did not get a presigned request")
	}
	assertAuditResigned(t, g.auditOf(stsHost, "/"), "acme/DEPLOY", map[string]any{"region": "us-east-1", "service": "sts", "payload": "literal", "presigned": true})
	g.assertNoPlaceholderReached(t, k)
}

// An upstream that quotes in its XML error body what the re-signed
// request carried (the Authorization header with the real id, the real
// session token, and here the secret too) and echoes the id and token in
// header fields: the task's client reads each replaced by its placeholder,
// and the rest of the answer as sent. By the SDK's client (its error) and
// a plain request, over HTTP/1.1 and HTTP/2 to the proxy.
func TestAWSResignAnswersAreScrubbed(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			g := newSigRig(t)
			k := g.newTask(t, "run-echo", h2)
			for _, c := range []struct {
				name   string
				creds  aws.Credentials
				realID string
			}{
				{"temporary", k.temp, realASIAID},
				{"static", k.deploy, realAWSID},
			} {
				path := "/acme-artifacts/echo-" + c.name
				req := signed(t, c.creds, http.MethodGet, "https://"+g.s3+path, nil, "UNSIGNED-PAYLOAD", "s3", "us-east-1", g.clk.Now(), nil)
				res, err := k.tap.Do(req)
				must(t, err)
				raw, err := io.ReadAll(res.Body)
				res.Body.Close()
				must(t, err)
				g.assertResigned(t, path, c.realID)
				g.mu.Lock()
				sent := g.sentEcho[path]
				g.mu.Unlock()
				real := sigAWSKeys[c.realID]
				if !strings.Contains(sent, c.realID) || (real.token != "" && !strings.Contains(sent, real.token)) {
					t.Fatalf("%s: the upstream's answer does not quote the real credentials", c.name)
				}
				want := strings.NewReplacer(c.realID, c.creds.AccessKeyID, real.secret, c.creds.SecretAccessKey, realASIAToken, c.creds.SessionToken).Replace(sent)
				if res.StatusCode != http.StatusForbidden || string(raw) != want {
					t.Errorf("%s: the client read %d %q,\nwant the upstream's answer with placeholders: %q", c.name, res.StatusCode, raw, want)
				}
				if res.Header.Get("X-Amz-Echo-Key") != c.creds.AccessKeyID || res.Header.Get("X-Amz-Echo-Token") != c.creds.SessionToken {
					t.Errorf("%s: the echoing fields are not the placeholders", c.name)
				}
				if res.ContentLength >= 0 && res.ContentLength != int64(len(raw)) {
					t.Errorf("%s: Content-Length %d for %d bytes", c.name, res.ContentLength, len(raw))
				}
				line := g.auditOf(s3Host, path)
				if n, _ := line["scrubbed"].(float64); line["action"] != "substituted" || n < 3 {
					t.Errorf("%s: audit %v, want substituted with the echoed values scrubbed", c.name, line)
				}
			}
			// The SDK's own reading of such an error: its message names the
			// placeholder id.
			_, err := g.s3Client(k, k.temp).GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String("acme-artifacts"), Key: aws.String("echo-sdk")})
			var re *awshttp.ResponseError
			if !errors.As(err, &re) || re.HTTPStatusCode() != http.StatusForbidden {
				t.Fatalf("GetObject of the echoing object: %v, want a 403", err)
			}
			if msg := err.Error(); strings.Contains(msg, realASIAID) || !strings.Contains(msg, k.temp.AccessKeyID) {
				t.Errorf("the SDK's error does not name the placeholder id, and only it: %s", msg)
			}
			if saw := k.tap.saw(); !strings.Contains(saw, "<SecurityToken>"+k.temp.SessionToken+"</SecurityToken>") {
				t.Error("the SDK did not read the echoed token as the placeholder")
			}
		})
	}
}

// Requests signed with a task's aws placeholder that the proxy will not
// sign again, and requests signed in schemes it cannot re-sign sent where
// an aws key of the task reaches: each is answered 403 naming the reason,
// audited blocked with it, and never reaches the upstream.
func TestAWSResignRefusals(t *testing.T) {
	g := newSigRig(t)
	k := g.newTask(t, "run-refused", false)
	other := g.newTask(t, "run-other", false)
	now := g.clk.Now()
	amzNow := now.UTC().Format("20060102T150405Z")
	wrong := k.deploy
	wrong.SecretAccessKey = "wRoNgSeCrEtwRoNgSeCrEtwRoNgSeCrEtwRoNgSe"
	big := bytes.Repeat([]byte("Action=GetCallerIdentity&Version=2011-06-15&Pad="), testAWSBodyLimit/48+1) // > AWSBodyLimit
	form := []byte("Action=GetCallerIdentity&Version=2011-06-15")

	for _, c := range []struct {
		name   string
		build  func(path string) *http.Request
		key    string // the key the line names ("" for either aws key)
		reason string // what the reason starts with
		has    string // and holds
		// h2: sent over HTTP/2 to the proxy (a refusal of a large body
		// over HTTP/1.1 may reach the client as a reset: see
		// TestAWSResignRefusalOfALargeBodyReachesTheClient).
		h2 bool
	}{
		{"another secret", func(p string) *http.Request {
			return signed(t, wrong, http.MethodGet, "https://"+g.s3+p, nil, "UNSIGNED-PAYLOAD", "s3", "us-east-1", now, nil)
		}, "acme/DEPLOY", "signature_mismatch: ", "", false},
		{"another secret, literal body", func(p string) *http.Request {
			return signed(t, wrong, http.MethodPost, "https://"+g.sts+p, form, literalNoHeader, "sts", "us-east-1", now,
				http.Header{"Content-Type": {"application/x-www-form-urlencoded"}})
		}, "acme/DEPLOY", "signature_mismatch: ", "", false},
		{"body changed after signing", func(p string) *http.Request {
			req := signed(t, k.deploy, http.MethodPost, "https://"+g.sts+p, form, literalNoHeader, "sts", "us-east-1", now,
				http.Header{"Content-Type": {"application/x-www-form-urlencoded"}})
			changed := []byte("Action=GetSessionToken&Version=2011-06-15")
			req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(changed)), int64(len(changed))
			return req
		}, "acme/DEPLOY", "signature_mismatch: ", "", false},
		{"region outside the key", func(p string) *http.Request {
			return signed(t, k.deploy, http.MethodGet, "https://"+g.s3+p, nil, "UNSIGNED-PAYLOAD", "s3", "us-west-2", now, nil)
		}, "acme/DEPLOY", "scope_refused: ", `region "us-west-2"`, false},
		{"service outside the key", func(p string) *http.Request {
			return signed(t, k.deploy, http.MethodGet, "https://"+g.s3+p, nil, "UNSIGNED-PAYLOAD", "sqs", "us-east-1", now, nil)
		}, "acme/DEPLOY", "scope_refused: ", `service "sqs"`, false},
		{"signed for s3, sent to dynamodb", func(p string) *http.Request {
			return signed(t, k.deploy, http.MethodPost, "https://"+g.ddb+p, []byte(`{}`), literalHeader, "s3", "us-east-1", now, nil)
		}, "acme/DEPLOY", "scope_refused: ", "goes to " + ddbHost, false},
		{"signed for sts, sent to s3", func(p string) *http.Request {
			return signed(t, k.deploy, http.MethodPost, "https://"+g.s3+p, form, literalNoHeader, "sts", "us-east-1", now, nil)
		}, "acme/DEPLOY", "scope_refused: ", "goes to " + s3Host, false},
		{"X-Amz-Date 16 minutes behind edge", func(p string) *http.Request {
			return signed(t, k.deploy, http.MethodGet, "https://"+g.s3+p, nil, "UNSIGNED-PAYLOAD", "s3", "us-east-1", now.Add(-16*time.Minute), nil)
		}, "acme/DEPLOY", "stale_date: ", "X-Amz-Date", false},
		{"X-Amz-Date 16 minutes ahead of edge", func(p string) *http.Request {
			return signed(t, k.temp, http.MethodGet, "https://"+g.s3+p, nil, "UNSIGNED-PAYLOAD", "s3", "us-east-1", now.Add(16*time.Minute), nil)
		}, "acme/TEMP", "stale_date: ", "X-Amz-Date", false},
		{"presigned URL past its X-Amz-Expires", func(p string) *http.Request {
			return presigned(t, k.deploy, http.MethodGet, "https://"+g.s3+p, "s3", now.Add(-2*time.Minute), time.Minute)
		}, "acme/DEPLOY", "stale_date: ", "presigned", false},
		{"presigned URL not yet valid", func(p string) *http.Request {
			return presigned(t, k.temp, http.MethodGet, "https://"+g.s3+p, "s3", now.Add(20*time.Minute), time.Hour)
		}, "acme/TEMP", "stale_date: ", "presigned", false},
		{"SigV2 header", func(p string) *http.Request {
			req, _ := http.NewRequest(http.MethodGet, "https://"+g.s3+p, nil)
			req.Header.Set("Date", now.UTC().Format(http.TimeFormat))
			req.Header.Set("Authorization", "AWS "+k.deploy.AccessKeyID+":frJIUN8DYpKDtOLCwo//yllqDzg=")
			return req
		}, "acme/DEPLOY", "sigv2_unsupported: ", "", false},
		{"SigV2 query", func(p string) *http.Request {
			req, _ := http.NewRequest(http.MethodGet, "https://"+g.s3+p+"?AWSAccessKeyId="+k.temp.AccessKeyID+"&Expires=1893456000&Signature=vjbyPxybdZaNmGa%2ByT272YEAiv4%3D", nil)
			return req
		}, "acme/TEMP", "sigv2_unsupported: ", "", false},
		{"SigV2 header of no placeholder, where an aws key reaches", func(p string) *http.Request {
			req, _ := http.NewRequest(http.MethodGet, "https://"+g.s3+p, nil)
			req.Header.Set("Date", now.UTC().Format(http.TimeFormat))
			req.Header.Set("Authorization", "AWS "+ownAWSID+":frJIUN8DYpKDtOLCwo//yllqDzg=")
			return req
		}, "", "sigv2_unsupported: ", "", false},
		{"SigV4A header", func(p string) *http.Request {
			req, _ := http.NewRequest(http.MethodGet, "https://"+g.s3+p, nil)
			req.Header.Set("X-Amz-Date", amzNow)
			req.Header.Set("X-Amz-Region-Set", "us-east-1")
			req.Header.Set("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD")
			req.Header.Set("Authorization", "AWS4-ECDSA-P256-SHA256 Credential="+k.deploy.AccessKeyID+"/"+amzNow[:8]+"/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-region-set, Signature=3045022100"+strings.Repeat("ab", 32)+"02200"+strings.Repeat("cd", 31))
			return req
		}, "acme/DEPLOY", "sigv4a_unsupported: ", "", false},
		{"event-stream signing", func(p string) *http.Request {
			return signed(t, k.deploy, http.MethodPost, "https://"+g.s3+p, []byte("events"), "STREAMING-AWS4-HMAC-SHA256-EVENTS", "s3", "us-east-1", now, nil)
		}, "acme/DEPLOY", "event_stream_unsupported: ", "", false},
		{"another task's placeholder", func(p string) *http.Request {
			return signed(t, other.deploy, http.MethodGet, "https://"+g.s3+p, nil, "UNSIGNED-PAYLOAD", "s3", "us-east-1", now, nil)
		}, "acme/DEPLOY", "blocked: ", "another task", false},
		{"placeholder sent where another aws key of the task reaches", func(p string) *http.Request {
			return signed(t, k.temp, http.MethodPost, "https://"+g.ddb+p, []byte(`{}`), literalNoHeader, "dynamodb", "us-east-1", now, nil)
		}, "acme/TEMP", "blocked: ", "acme/TEMP may not reach " + g.ddb, false},
		{"placeholder sent where a plain key of the task reaches", func(p string) *http.Request {
			return signed(t, k.deploy, http.MethodGet, "https://"+g.api+p, nil, literalHeader, "s3", "us-east-1", now, nil)
		}, "acme/DEPLOY", "blocked: ", "acme/DEPLOY may not reach " + g.api, false},
		{"literal body over the limit", func(p string) *http.Request {
			return signed(t, k.deploy, http.MethodPost, "https://"+g.sts+p, big, literalNoHeader, "sts", "us-east-1", now,
				http.Header{"Content-Type": {"application/x-www-form-urlencoded"}})
		}, "acme/DEPLOY", "payload_unverifiable: ", "x-amz-content-sha256", true},
		{"literal body of no length over the limit", func(p string) *http.Request {
			req := signed(t, k.deploy, http.MethodPost, "https://"+g.sts+p, big, literalNoHeader, "sts", "us-east-1", now,
				http.Header{"Content-Type": {"application/x-www-form-urlencoded"}})
			req.Body, req.ContentLength = io.NopCloser(io.MultiReader(bytes.NewReader(big))), -1 // sent chunked
			return req
		}, "acme/DEPLOY", "payload_unverifiable: ", "x-amz-content-sha256", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := "/refused-" + strings.NewReplacer(" ", "-", ",", "", "'", "").Replace(c.name)
			req := c.build(path)
			host := benchHostname(req.URL.Host)
			via := k
			if c.h2 {
				via = k.overH2(t, g)
			}
			status, body := via.do(t, req)
			if code, msg := awsErrorOf(t, body); status != http.StatusForbidden || !strings.HasPrefix(msg, "runfleet edge: "+c.reason) || !strings.Contains(msg, c.has) ||
				code != map[bool]string{true: "SignatureDoesNotMatch", false: "AccessDenied"}[c.reason == "signature_mismatch: "] {
				t.Errorf("answer %d %q (code %q, message %q), want 403 %q... holding %q", status, body, code, msg, c.reason, c.has)
			}
			line := g.auditOf(host, path)
			reason := fmt.Sprint(line["reason"])
			keys := fmt.Sprint(line["keys"])
			if line["action"] != "blocked" || line["status"] != float64(403) || !strings.HasPrefix(reason, c.reason) || !strings.Contains(reason, c.has) {
				t.Errorf("audit %v, want blocked 403 with reason %q... holding %q", line, c.reason, c.has)
			}
			if c.key != "" && keys != "["+c.key+"]" || c.key == "" && keys != "[acme/DEPLOY]" && keys != "[acme/TEMP]" {
				t.Errorf("audit names keys %s, want [%s]", keys, c.key)
			}
			if got := g.reached(path); len(got) != 0 {
				t.Errorf("the upstream got the refused request (%d times)", len(got))
			}
			for _, ph := range []string{k.deploy.AccessKeyID, k.deploy.SecretAccessKey, k.temp.AccessKeyID, k.temp.SecretAccessKey, k.temp.SessionToken, other.deploy.AccessKeyID} {
				if strings.Contains(body, ph) {
					t.Errorf("the refusal quotes a placeholder (%d chars)", len(ph))
				}
			}
		})
	}
	// A date within the 15 minutes goes (the clock the bound is judged by
	// is edge's, the test's Fake).
	path := "/within-skew"
	req := signed(t, k.deploy, http.MethodGet, "https://"+g.s3+path, nil, "UNSIGNED-PAYLOAD", "s3", "us-east-1", now.Add(-14*time.Minute), nil)
	if status, body := k.do(t, req); status != http.StatusOK {
		t.Fatalf("X-Amz-Date 14 minutes behind edge: %d %q", status, body)
	}
	g.assertResigned(t, path, realAWSID)
	g.assertNoPlaceholderReached(t, k)
	g.assertNoPlaceholderReached(t, other)
}

// A body signed over its hash without x-amz-content-sha256 (every service
// but S3) is read whole to check it: past the body buffer (64 KiB) it is
// spooled to a file, and one of no stated length too; each is verified,
// re-signed and reaches the upstream byte for byte with its length.
func TestAWSResignSpoolsLargeHashedBodies(t *testing.T) {
	g := newSigRig(t)
	k := g.newTask(t, "run-spool", false)
	now := g.clk.Now()
	large := bytes.Repeat([]byte("Action=GetCallerIdentity&Version=2011-06-15&Pad="), 3000) // 144 KiB
	for _, c := range []struct {
		name    string
		chunked bool
	}{{"sized", false}, {"of no length", true}} {
		t.Run(c.name, func(t *testing.T) {
			path := "/spooled-" + strings.ReplaceAll(c.name, " ", "-")
			req := signed(t, k.deploy, http.MethodPost, "https://"+g.sts+path, large, literalNoHeader, "sts", "us-east-1", now,
				http.Header{"Content-Type": {"application/x-www-form-urlencoded"}})
			if c.chunked {
				req.Body, req.ContentLength = io.NopCloser(io.MultiReader(bytes.NewReader(large))), -1
			}
			if status, body := k.do(t, req); status != http.StatusOK {
				t.Fatalf("a %d-byte body %s: %d %q", len(large), c.name, status, body)
			}
			got := g.reached(path)
			if len(got) != 1 || !bytes.Equal(got[0].Body, large) {
				t.Fatalf("the upstream got %d requests, want one with the body as sent", len(got))
			}
			g.assertResigned(t, path, realAWSID)
		})
	}
	entries, err := os.ReadDir(filepath.Join(g.dir, "secrets-proxy", "spool"))
	if err != nil || len(entries) != 0 {
		t.Errorf("the spool holds %d files (%v): a spooled body must not outlive its request, nor be named on disk", len(entries), err)
	}
}

// X-Amz-Date is judged by edge's clock (Config.Clock), not the wall's: the
// SDK's GetCallerIdentity, signed now, goes; the same call once edge's
// clock is 16 minutes ahead is refused stale_date before anything reaches
// the upstream.
func TestAWSResignJudgesTimeByEdgesClock(t *testing.T) {
	g := newSigRig(t)
	k := g.newTask(t, "run-clock", false)
	client := g.stsClient(k, k.deploy)
	if _, err := client.GetCallerIdentity(context.Background(), &sts.GetCallerIdentityInput{}); err != nil {
		t.Fatalf("GetCallerIdentity with edge's clock at now: %v", err)
	}
	g.clk.Advance(16 * time.Minute)
	_, err := client.GetCallerIdentity(context.Background(), &sts.GetCallerIdentityInput{})
	var re *awshttp.ResponseError
	if !errors.As(err, &re) || re.HTTPStatusCode() != http.StatusForbidden {
		t.Fatalf("GetCallerIdentity with edge's clock 16 minutes ahead: %v, want a 403", err)
	}
	if n := len(g.reached("/")); n != 1 {
		t.Errorf("the upstream got %d requests, want the first only", n)
	}
	line := g.waitAudit(func(m map[string]any) bool { return strings.HasPrefix(fmt.Sprint(m["reason"]), "stale_date: ") })
	if line["action"] != "blocked" || line["status"] != float64(403) || fmt.Sprint(line["keys"]) != "[acme/DEPLOY]" || line["host"] != g.sts {
		t.Errorf("audit %v, want blocked 403 stale_date naming acme/DEPLOY", line)
	}
}

// A request signed with an access key id that is no placeholder (the
// task's own credentials) is the task's business: it reaches the upstream
// as the task signed it, Authorization and all, and its signature still
// verifies with the task's own secret; the audit line names no key and no
// signing.
func TestAWSResignLeavesOtherSignaturesAlone(t *testing.T) {
	g := newSigRig(t)
	k := g.newTask(t, "run-own", false)
	own := aws.Credentials{AccessKeyID: ownAWSID, SecretAccessKey: ownAWSSecret}
	path := "/acme-artifacts/own-key.txt"
	req := signed(t, own, http.MethodPut, "https://"+g.s3+path, []byte("mine"), literalHeader, "s3", "us-east-1", g.clk.Now(), nil)
	auth := req.Header.Get("Authorization")
	if status, body := k.do(t, req); status != http.StatusOK {
		t.Fatalf("PUT signed with the task's own key: %d %q", status, body)
	}
	g.assertResigned(t, path, ownAWSID)
	if got := g.reached(path)[0]; got.Header.Get("Authorization") != auth || got.Header.Get("X-Amz-Security-Token") != "" {
		t.Error("the task's own signature did not reach the upstream as it signed it")
	}
	line := g.auditOf(s3Host, path)
	if line["action"] != "forwarded" || line["keys"] != nil || line["aws"] != nil {
		t.Errorf("audit %v, want forwarded with no key and no aws signing", line)
	}

	// The SDK's STS client with the task's own key: the same.
	if _, err := g.stsClient(k, own).GetCallerIdentity(context.Background(), &sts.GetCallerIdentityInput{}); err != nil {
		t.Fatalf("GetCallerIdentity with the task's own key: %v", err)
	}
	g.assertResigned(t, "/", ownAWSID)
}

// A streamed upload (STREAMING-AWS4-HMAC-SHA256-PAYLOAD, built as the SDK
// writes it: each chunk signed in the chain of the placeholder secret
// seeded by the header signature) is re-signed chunk by chunk: the
// upstream verifies the header signature and every chunk with the real
// secret, and gets the data as sent. The same upload with a chunk changed
// in the middle (its signature left as signed) is refused
// signature_mismatch: the client gets 403, the line is blocked, and no
// complete, verified body reaches the upstream. Over HTTP/1.1 and HTTP/2
// to the proxy.
func TestAWSResignStreamedChunks(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			g := newSigRig(t)
			k := g.newTask(t, "run-stream", h2)
			chunks := [][]byte{
				bytes.Repeat([]byte("first chunk of the upload.\n"), 8<<10/27+1)[:8<<10],
				bytes.Repeat([]byte("second, the middle one....\n"), 8<<10/27+1)[:8<<10],
				bytes.Repeat([]byte("the last and shorter one..\n"), 100),
			}
			var data []byte
			for _, c := range chunks {
				data = append(data, c...)
			}
			upload := func(path string, creds aws.Credentials, tamper int) (*http.Request, int, string) {
				size := int64(len(sigEncodeChunked("x", "20250101T000000Z", strings.Repeat("0", 64), chunks, -1)))
				req, err := http.NewRequest(http.MethodPut, "https://"+g.s3+path, nil)
				must(t, err)
				req.ContentLength = size
				req.Header.Set("Content-Encoding", "aws-chunked")
				req.Header.Set("X-Amz-Decoded-Content-Length", strconv.Itoa(len(data)))
				req.Header.Set("X-Amz-Content-Sha256", awsStreamingValue)
				must(t, v4.NewSigner().SignHTTP(context.Background(), creds, req, awsStreamingValue, "s3", "us-east-1", g.clk.Now(), awsSignS3))
				_, seed, _ := strings.Cut(req.Header.Get("Authorization"), "Signature=")
				body := sigEncodeChunked(creds.SecretAccessKey, req.Header.Get("X-Amz-Date"), seed, chunks, tamper)
				req.Body = io.NopCloser(bytes.NewReader(body))
				req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
				status, answer := k.do(t, req)
				return req, status, answer
			}
			for _, c := range []struct {
				name   string
				creds  aws.Credentials
				realID string
				key    string
			}{
				{"static", k.deploy, realAWSID, "acme/DEPLOY"},
				{"temporary", k.temp, realASIAID, "acme/TEMP"},
			} {
				path := "/acme-artifacts/streamed-" + c.name + ".bin"
				_, status, answer := upload(path, c.creds, -1)
				if status != http.StatusOK {
					t.Fatalf("%s: streamed upload: %d %q", c.name, status, answer)
				}
				ch := g.assertResigned(t, path, c.realID)
				if ch.chunks != len(chunks) || !bytes.Equal(ch.data, data) {
					t.Errorf("%s: the upstream verified %d chunks of %d and got %d data bytes of %d", c.name, ch.chunks, len(chunks), len(ch.data), len(data))
				}
				assertAuditResigned(t, g.auditOf(s3Host, path), c.key, map[string]any{"region": "us-east-1", "service": "s3", "payload": awsStreamingValue})
			}

			path := "/acme-artifacts/streamed-tampered.bin"
			_, status, answer := upload(path, k.deploy, 1)
			if code, msg := awsErrorOf(t, answer); status != http.StatusForbidden || code != "SignatureDoesNotMatch" || !strings.HasPrefix(msg, "runfleet edge: signature_mismatch: ") {
				t.Errorf("a chunk tampered in the middle: %d %q, want 403 signature_mismatch", status, answer)
			}
			line := g.auditOf(s3Host, path)
			if line["action"] != "blocked" || !strings.HasPrefix(fmt.Sprint(line["reason"]), "signature_mismatch: ") || fmt.Sprint(line["keys"]) != "[acme/DEPLOY]" {
				t.Errorf("audit %v, want blocked signature_mismatch naming acme/DEPLOY", line)
			}
			for _, ch := range g.checksOf(path) {
				if ch.err == nil {
					t.Errorf("the upstream verified a complete body of a tampered upload (%d chunks)", ch.chunks)
				}
				if ch.chunks > 1 {
					t.Errorf("the upstream got %d chunks re-signed, the tampered one among them", ch.chunks)
				}
			}
			g.assertNoPlaceholderReached(t, k)
		})
	}
}

// DynamoDB's client with EnableAcceptEncodingGzip signs Accept-Encoding:
// gzip (the Go SDK signs every header but a few, Accept-Encoding among
// them); the request must still reach AWS with a signature that verifies.
func TestAWSResignSignedAcceptEncoding(t *testing.T) {
	g := newSigRig(t)
	k := g.newTask(t, "run-gzip", false)
	_, err := g.ddbClient(k, k.deploy, func(o *dynamodb.Options) { o.EnableAcceptEncodingGzip = true }).ListTables(context.Background(), &dynamodb.ListTablesInput{})
	if err != nil {
		t.Errorf("ListTables with EnableAcceptEncodingGzip through the proxy: %v", err)
	}
	g.assertResigned(t, "/", realAWSID)

	path := "/acme-artifacts/gzip.txt"
	req := signed(t, k.deploy, http.MethodGet, "https://"+g.s3+path, nil, "UNSIGNED-PAYLOAD", "s3", "us-east-1", g.clk.Now(), http.Header{"Accept-Encoding": {"gzip"}})
	if status, body := k.do(t, req); status != http.StatusOK {
		t.Errorf("GET signed over Accept-Encoding: gzip: %d %q", status, body)
	}
	g.assertResigned(t, path, realAWSID)
	if got := g.reached(path); len(got) == 1 {
		t.Logf("the task signed Accept-Encoding %q; the upstream got %q", req.Header.Get("Accept-Encoding"), got[0].Header.Get("Accept-Encoding"))
	}
}

// A request the proxy refuses before reading its body, here the SDK's
// DynamoDB BatchWriteItem of 16 items of 256 KiB (a body over the body
// buffer, signed over its hash without x-amz-content-sha256:
// payload_unverifiable), must reach the client as the 403 naming the
// reason, over HTTP/1.1 as it does over HTTP/2, not as a connection reset
// the SDK reports (and, with its default retryer, retries) without a word
// of why.
func TestAWSResignRefusalOfALargeBodyReachesTheClient(t *testing.T) {
	g := newSigRig(t)
	k := g.newTask(t, "run-large", false)
	var writes []ddbtypes.WriteRequest
	for i := range 16 {
		writes = append(writes, ddbtypes.WriteRequest{PutRequest: &ddbtypes.PutRequest{Item: map[string]ddbtypes.AttributeValue{
			"pk":   &ddbtypes.AttributeValueMemberS{Value: fmt.Sprintf("build-%d", i)},
			"blob": &ddbtypes.AttributeValueMemberB{Value: bytes.Repeat([]byte("0123456789abcdef"), 256<<10/16)},
		}}})
	}
	batch := &dynamodb.BatchWriteItemInput{RequestItems: map[string][]ddbtypes.WriteRequest{"acme-table": writes}}
	for _, h2 := range []bool{true, false} {
		via := k
		if h2 {
			via = k.overH2(t, g)
		}
		for i := range 10 {
			_, err := g.ddbClient(via, k.deploy).BatchWriteItem(context.Background(), batch)
			var re *awshttp.ResponseError
			if !errors.As(err, &re) || re.HTTPStatusCode() != http.StatusForbidden {
				t.Errorf("h2=%v, BatchWriteItem %d of 4 MiB: %v, want the 403 payload_unverifiable", h2, i, err)
			}
		}
		if saw := via.tap.saw(); !strings.Contains(saw, "runfleet edge: payload_unverifiable: ") {
			t.Errorf("h2=%v: the client never read the reason", h2)
		}
	}
	if n := len(g.checksOf("/")); n != 0 {
		t.Errorf("the upstream got %d of the refused requests", n)
	}
}

// A refusal reaches each SDK as its service's own error, so the task's
// tool shows edge's reason: DynamoDB's JSON, STS's query XML and S3's XML,
// each read by aws-sdk-go-v2 into an error code and message.
func TestAWSResignRefusalsReadAsServiceErrors(t *testing.T) {
	g := newSigRig(t)
	k := g.newTask(t, "run-errors", false)
	wrong := k.deploy
	wrong.SecretAccessKey = "wRoNgSeCrEtwRoNgSeCrEtwRoNgSeCrEtwRoNgSe"
	ctx := context.Background()
	_, ddbErr := g.ddbClient(k, wrong).ListTables(ctx, &dynamodb.ListTablesInput{})
	_, stsErr := g.stsClient(k, wrong).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	_, s3Err := g.s3Client(k, wrong).HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String("acme-artifacts")})
	_, s3GetErr := g.s3Client(k, wrong).GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("acme-artifacts"), Key: aws.String("k")})
	for name, err := range map[string]error{"dynamodb": ddbErr, "sts": stsErr, "s3 GetObject": s3GetErr} {
		var api smithy.APIError
		if !errors.As(err, &api) || api.ErrorCode() != "SignatureDoesNotMatch" || !strings.HasPrefix(api.ErrorMessage(), "runfleet edge: signature_mismatch: ") {
			t.Errorf("%s: the SDK read %v, want SignatureDoesNotMatch with edge's reason", name, err)
		}
	}
	// HEAD answers carry no body: the status is all a client gets.
	var re *awshttp.ResponseError
	if !errors.As(s3Err, &re) || re.HTTPStatusCode() != http.StatusForbidden {
		t.Errorf("s3 HeadBucket: %v, want a 403", s3Err)
	}
	if n := len(g.reached("/")) + len(g.reached("/acme-artifacts")) + len(g.reached("/acme-artifacts/k")); n != 0 {
		t.Errorf("the upstream got %d refused requests", n)
	}
}
