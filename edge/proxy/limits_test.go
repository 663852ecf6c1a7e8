package proxy

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// send is one request through the fixture's proxy with a Go client, over
// HTTP/2 or HTTP/1.1, checked to have been answered with that protocol.
func (f *fixture) send(t *testing.T, h2 bool, method, rawURL string, header http.Header, body io.Reader) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, rawURL, body)
	must(t, err)
	for k, vs := range header {
		req.Header[k] = vs
	}
	res, err := f.goClient(f.proxyURL, h2).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, rawURL, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if want := map[bool]int{false: 1, true: 2}[h2]; res.ProtoMajor != want {
		t.Fatalf("answered over HTTP/%d, want HTTP/%d", res.ProtoMajor, want)
	}
	return res, string(b)
}

// refusedByLimit checks that the request to path was answered status with
// the limit's reason, audited as blocked with that reason and status.
func (f *fixture) refusedByLimit(t *testing.T, res *http.Response, body, path string, status int, reason string) {
	t.Helper()
	if res.StatusCode != status || !strings.Contains(body, reason) {
		t.Fatalf("%s: %d %q, want %d with %q", path, res.StatusCode, body, status, reason)
	}
	line := f.waitAudit(func(m map[string]any) bool { return m["path"] == path })
	if line["action"] != "blocked" || line["status"] != float64(status) || line["reason"] != reason {
		t.Fatalf("%s: audit line %v, want blocked, %d, %q", path, line, status, reason)
	}
}

func (f *fixture) upstreamGot(path string) int {
	n := 0
	for _, r := range f.up.requests() {
		if r.Path == path {
			n++
		}
	}
	return n
}

// A placeholder repeated a thousand times in one header used to be
// substituted a thousand times: now the 33rd is refused, 431, on HTTP/1.1
// and HTTP/2 alike, from a Go client and from curl, and the upstream gets
// nothing.
func TestRepeatedPlaceholderIsRefusedOnHTTP1AndHTTP2Alike(t *testing.T) {
	f := newFixture(t, "")
	many := strings.Repeat(f.phA+",", 1000)
	for _, h2 := range []bool{false, true} {
		path := fmt.Sprintf("/many-h2=%v", h2)
		res, body := f.send(t, h2, http.MethodGet, "https://"+f.api+path, http.Header{"X-Keys": {many}}, nil)
		f.refusedByLimit(t, res, body, path, http.StatusRequestHeaderFieldsTooLarge, reasonTooManySubstitutions)
		if f.upstreamGot(path) != 0 {
			t.Errorf("%s reached the upstream", path)
		}
	}
	// A few are substituted, each one. (A head has room for fewer than
	// maxSubstitutions: each takes headValueAllowance of maxHeadBytes.)
	const few = 8
	several := strings.TrimSuffix(strings.Repeat(f.phA+",", few), ",")
	res, _ := f.send(t, true, http.MethodGet, "https://"+f.api+"/several", http.Header{"X-Keys": {several}}, nil)
	if res.StatusCode != http.StatusOK || f.upstreamGot("/several") != 1 {
		t.Fatalf("%d placeholders: %d, upstream %d", few, res.StatusCode, f.upstreamGot("/several"))
	}
	got := f.up.requests()[len(f.up.requests())-1].Header.Get("X-Keys")
	if strings.Count(got, realA) != few || strings.Contains(got, f.phA) {
		t.Fatalf("the upstream got %d values", strings.Count(got, realA))
	}
	// Past the head's room, below the count: the head's bound refuses.
	res, body := f.send(t, false, http.MethodGet, "https://"+f.api+"/sixteen",
		http.Header{"X-Keys": {strings.Repeat(f.phA+",", maxHeadBytes/headValueAllowance)}}, nil)
	f.refusedByLimit(t, res, body, "/sixteen", http.StatusRequestHeaderFieldsTooLarge, reasonHeadTooLarge)

	// curl, both protocols.
	hdr := f.dir + "/many.hdr"
	must(t, os.WriteFile(hdr, []byte("X-Keys: "+many+"\r\n"), 0o644))
	for _, proto := range []string{"--http1.1", "--http2"} {
		out := runClient(t, f.clientEnv(f.proxyURL), "/usr/bin/curl", "-sS", proto, "-o", "/dev/null", "-w", "%{http_code} %{http_version}",
			"-H", "@"+hdr, "https://"+f.api+"/curl"+proto)
		want := map[string]string{"--http1.1": "431 1.1", "--http2": "431 2"}[proto]
		if out != want {
			t.Errorf("curl %s: %q, want %q", proto, out, want)
		}
		f.waitAudit(func(m map[string]any) bool {
			return m["path"] == "/curl"+proto && m["status"] == float64(431) && m["reason"] == reasonTooManySubstitutions
		})
	}
	if f.upstreamGot("/curl--http1.1")+f.upstreamGot("/curl--http2") != 0 {
		t.Error("curl's request reached the upstream")
	}
}

// A head that substitution could grow past maxHeadBytes is refused before
// any value is read into it, 431, on both protocols; the bound is decided
// on the head as sent plus headValueAllowance per substitution, so the
// same head with a shorter padding goes through.
func TestHeadThatWouldGrowPastTheBoundIsRefused(t *testing.T) {
	f := newFixture(t, "")
	for _, h2 := range []bool{false, true} {
		// A head that fits as sent (about 62 KiB of it in one field),
		// and would not with a value's allowance in it.
		pad := strings.Repeat("p", maxHeadBytes-headValueAllowance/2)
		path := fmt.Sprintf("/grow-h2=%v", h2)
		res, body := f.send(t, h2, http.MethodGet, "https://"+f.api+path,
			http.Header{"X-Pad": {pad}, "Authorization": {"Bearer " + f.phA}}, nil)
		f.refusedByLimit(t, res, body, path, http.StatusRequestHeaderFieldsTooLarge, reasonHeadTooLarge)
		if f.upstreamGot(path) != 0 {
			t.Errorf("%s reached the upstream", path)
		}
		// Room for the allowance: substituted and sent.
		pad = strings.Repeat("p", maxHeadBytes-2*headValueAllowance)
		path = fmt.Sprintf("/fits-h2=%v", h2)
		res, _ = f.send(t, h2, http.MethodGet, "https://"+f.api+path,
			http.Header{"X-Pad": {pad}, "Authorization": {"Bearer " + f.phA}}, nil)
		if res.StatusCode != http.StatusOK || f.upstreamGot(path) != 1 {
			t.Fatalf("%s: %d", path, res.StatusCode)
		}
	}
	f.upstreamNeverSaw(t, f.phA)
}

// A value longer than headValueAllowance is never substituted into a head,
// whatever the head's size: the refusal depends on the key, not on how
// much a task pads its head.
func TestValueLongerThanTheHeadAllowanceIsRefusedInTheHead(t *testing.T) {
	uca := edgetest.NewCA(t)
	up := startUpstream(t, uca, false, "api.example.test")
	long := strings.Repeat("L", headValueAllowance+200) // more than the allowance over the placeholder
	e := newEnv(t, envOptions{uca: uca, pins: map[string]string{"api.example.test": "127.0.0.1"},
		keys:    fmt.Sprintf(`{"acme": {"keys": {"L": {"domains": ["api.example.test:%d"], "in": ["header", "body"]}}}}`, up.port),
		secrets: map[string]string{"acme/L": long}})
	u, phs := e.task("run-long", runspec.Secret{ProjectID: "acme", Key: "L"})
	f := &fixture{env: e, up: up, proxyURL: u, api: "api.example.test:" + itoa(up.port)}
	t.Cleanup(func() { e.assertNoLeak(long, phs["L"]) })
	for _, h2 := range []bool{false, true} {
		path := fmt.Sprintf("/long-h2=%v", h2)
		res, body := f.send(t, h2, http.MethodGet, "https://"+f.api+path, http.Header{"Authorization": {"Bearer " + phs["L"]}}, nil)
		f.refusedByLimit(t, res, body, path, http.StatusRequestHeaderFieldsTooLarge, reasonHeadValueTooLong)
	}
	// In a body it has no such bound.
	res, _ := f.send(t, false, http.MethodPost, "https://"+f.api+"/body", nil, strings.NewReader(`{"key":"`+phs["L"]+`"}`))
	if res.StatusCode != http.StatusOK || len(up.requests()) != 1 || !bytes.Contains(up.requests()[0].Body, []byte(long)) {
		t.Fatalf("a long value in a body: %d, upstream %d", res.StatusCode, len(up.requests()))
	}
}

// The count is the request's, body included: 33 placeholders in a body
// read whole are refused, 413, before anything goes upstream; in a
// streamed body the 33rd stops the stream (the upstream has what came
// before, never a whole request) and the task gets 413 too. 32 pass.
func TestSubstitutionsInTheBodyAreBounded(t *testing.T) {
	f := newFixture(t, "")
	over := strings.Repeat(f.phB+" ", maxSubstitutions+1)
	for _, h2 := range []bool{false, true} {
		path := fmt.Sprintf("/body-h2=%v", h2)
		res, body := f.send(t, h2, http.MethodPost, "https://"+f.other+path, nil, strings.NewReader(over))
		f.refusedByLimit(t, res, body, path, http.StatusRequestEntityTooLarge, reasonTooManySubstitutions)
		if f.upstreamGot(path) != 0 {
			t.Errorf("%s reached the upstream", path)
		}

		// Streamed (no length: through the body scanner), in two
		// writes: 20 placeholders, then 13 more.
		path = fmt.Sprintf("/stream-h2=%v", h2)
		pr, pw := io.Pipe()
		go func() {
			pw.Write([]byte(strings.Repeat(f.phB+" ", 20)))
			pw.Write([]byte(strings.Repeat(f.phB+" ", maxSubstitutions+1-20)))
			pw.Close()
		}()
		res, body = f.send(t, h2, http.MethodPost, "https://"+f.other+path, nil, pr)
		f.refusedByLimit(t, res, body, path, http.StatusRequestEntityTooLarge, reasonTooManySubstitutions)
		for _, r := range f.up.requests() {
			if r.Path == path && strings.Count(string(r.Body), realB) > maxSubstitutions {
				t.Errorf("the upstream got %d values", strings.Count(string(r.Body), realB))
			}
		}
	}
	exactly := strings.Repeat(f.phB+" ", maxSubstitutions)
	res, _ := f.send(t, false, http.MethodPost, "https://"+f.other+"/exactly", nil, strings.NewReader(exactly))
	if res.StatusCode != http.StatusOK || f.upstreamGot("/exactly") != 1 {
		t.Fatalf("%d placeholders in a body: %d", maxSubstitutions, res.StatusCode)
	}
	f.upstreamNeverSaw(t, f.phB)
}

// An HTTP/2 head over maxHeadBytes is refused with 431 and audited as an
// HTTP/1.1 one is, from a client that ignores the SETTINGS_MAX_HEADER_LIST_SIZE the front
// advertises (a Go client would not send it at all): the front no longer
// takes the 1 MiB net/http's default allows.
func TestHTTP2HeadOverTheBoundIsRefusedLikeHTTP1(t *testing.T) {
	f := newFixture(t, "")
	// Two fields, 72 KiB together (one string past the bound is a
	// connection error in HPACK, COMPRESSION_ERROR, not a 431).
	pad := strings.Repeat("p", 36<<10)

	tc, br := f.dialIntercepted(f.proxyURL, f.api, "api.example.test", "http/1.1")
	res, _ := roundTrip(t, tc, br, "GET /big-h1 HTTP/1.1\r\nHost: "+f.api+"\r\nX-Pad: "+pad+"\r\nX-Pad-2: "+pad+"\r\n\r\n")
	tc.Close()
	if res.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("HTTP/1.1: %d", res.StatusCode)
	}

	tc, _ = f.dialIntercepted(f.proxyURL, f.api, "api.example.test", "h2")
	defer tc.Close()
	status, listSize := rawH2Request(t, tc, f.api, "/big-h2", pad)
	if listSize != maxHeadBytes {
		t.Errorf("SETTINGS_MAX_HEADER_LIST_SIZE %d, want %d", listSize, maxHeadBytes)
	}
	if status != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("HTTP/2: %d", status)
	}
	if f.upstreamGot("/big-h1")+f.upstreamGot("/big-h2") != 0 {
		t.Error("an oversized head reached the upstream")
	}
	// Each is audited, alike: the task and host, nothing of the request.
	var lines []map[string]any
	await.Within(5*time.Second, func() bool {
		lines = lines[:0]
		for _, m := range f.auditLines() {
			if m["status"] == float64(http.StatusRequestHeaderFieldsTooLarge) {
				lines = append(lines, m)
			}
		}
		return len(lines) == 2
	})
	if len(lines) != 2 {
		t.Fatalf("audit lines for 431: %v, want one per protocol", lines)
	}
	for _, m := range lines {
		if m["action"] != "denied" || m["reason"] != reasonHeadOverBound || m["task"] != "run-a" || m["host"] != f.api || m["path"] != nil {
			t.Errorf("audit line %v", m)
		}
	}
}

// rawH2Request sends one GET with the fields X-Pad and X-Pad-2 over tc with x/net's
// framer (in CONTINUATION frames as the front's frame size needs) and
// returns the answer's status and the front's advertised
// SETTINGS_MAX_HEADER_LIST_SIZE.
func rawH2Request(t *testing.T, tc *tls.Conn, authority, path, pad string) (status int, listSize uint32) {
	t.Helper()
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(tc, http2.ClientPreface)
	fr := http2.NewFramer(tc, tc)
	must(t, fr.WriteSettings())
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, hf := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", authority}, {":path", path}, {"x-pad", pad}, {"x-pad-2", pad}} {
		must(t, enc.WriteField(hpack.HeaderField{Name: hf[0], Value: hf[1]}))
	}
	b := block.Bytes()
	const chunk = h2MaxFrameSize
	first := b[:min(len(b), chunk)]
	b = b[len(first):]
	must(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: first, EndStream: true, EndHeaders: len(b) == 0}))
	for len(b) > 0 {
		part := b[:min(len(b), chunk)]
		b = b[len(part):]
		must(t, fr.WriteContinuation(1, len(b) == 0, part))
	}
	dec := hpack.NewDecoder(4096, nil)
	for {
		frame, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		switch fr := frame.(type) {
		case *http2.SettingsFrame:
			if v, ok := fr.Value(http2.SettingMaxHeaderListSize); ok {
				listSize = v
			}
		case *http2.HeadersFrame:
			fields, err := dec.DecodeFull(fr.HeaderBlockFragment())
			must(t, err)
			for _, hf := range fields {
				if hf.Name == ":status" {
					fmt.Sscan(hf.Value, &status)
				}
			}
			return status, listSize
		case *http2.RSTStreamFrame:
			t.Fatalf("stream reset: %v", fr.ErrCode)
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY: %v", fr.ErrCode)
		}
	}
}
