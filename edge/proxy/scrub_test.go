package proxy

import (
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// An upstream that echoes what it got sends the real value back; the task
// gets its placeholder instead, wherever the value stands in the answer:
// a header, a small body sent with its length (the length made right), a
// body too large to read whole (streamed, re-framed), a chunked body with
// the value split between two chunks, and trailers. Over HTTP/1.1 and
// HTTP/2 to the proxy alike.
func TestEchoedValuesAreScrubbedFromAnswers(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			f := newFixture(t, "open")
			var acceptEncoding []string
			f.up.handler = func(w http.ResponseWriter, r *http.Request) {
				acceptEncoding = append(acceptEncoding, r.Header.Get("Accept-Encoding"))
				auth := r.Header.Get("Authorization")
				w.Header().Set("X-Echo", "you sent "+auth)
				switch r.URL.Path {
				case "/small":
					w.Header().Set("Content-Length", fmt.Sprint(len(auth)+8))
					io.WriteString(w, "got: "+auth+"\n!!")
				case "/large":
					pad := strings.Repeat("p", 50000)
					w.Header().Set("Content-Length", fmt.Sprint(len(pad)*2+len(auth)))
					io.WriteString(w, pad+auth+pad)
				case "/split":
					w.Header().Set("Trailer", "X-Echo-Trailer")
					io.WriteString(w, "start "+auth[:12])
					w.(http.Flusher).Flush()
					io.WriteString(w, auth[12:]+" end")
					w.Header().Set("X-Echo-Trailer", auth)
				}
			}
			client := f.goClient(f.proxyURL, h2)
			ph, real := "Bearer "+f.phA, "Bearer "+realA
			for _, c := range []struct{ path, want string }{
				{"/small", "got: " + ph + "\n!!"},
				{"/large", strings.Repeat("p", 50000) + ph + strings.Repeat("p", 50000)},
				{"/split", "start " + ph + " end"},
			} {
				res, err := client.Do(mustRequest(t, "https://"+f.api+c.path, ph))
				must(t, err)
				body, err := io.ReadAll(res.Body)
				res.Body.Close()
				if err != nil || res.StatusCode != 200 {
					t.Fatalf("%s: %d %v", c.path, res.StatusCode, err)
				}
				if string(body) != c.want {
					t.Errorf("%s: the body is not the echo with the placeholder (%d bytes, want %d)", c.path, len(body), len(c.want))
				}
				if res.Header.Get("X-Echo") != "you sent "+ph {
					t.Errorf("%s: X-Echo is not the echo with the placeholder", c.path)
				}
				if c.path == "/split" && res.Trailer.Get("X-Echo-Trailer") != ph {
					t.Errorf("%s: the trailer is not the echo with the placeholder", c.path)
				}
				dump := fmt.Sprint(res.Header, res.Trailer) + string(body)
				if strings.Contains(dump, realA) {
					t.Errorf("%s: the task saw the real value", c.path)
				}
				if res.ContentLength >= 0 && res.ContentLength != int64(len(body)) {
					t.Errorf("%s: Content-Length %d for %d bytes", c.path, res.ContentLength, len(body))
				}
			}
			for _, r := range f.up.requests() {
				if r.Header.Get("Authorization") != real {
					t.Fatal("the upstream did not get the real value")
				}
			}
			for _, ae := range acceptEncoding {
				if ae != "identity" {
					t.Errorf("the upstream was asked for Accept-Encoding %q, not identity", ae)
				}
			}
			for path, n := range map[string]float64{"/small": 2, "/large": 2, "/split": 3} {
				line := f.waitAudit(func(m map[string]any) bool { return m["path"] == path })
				if line["action"] != "substituted" || line["scrubbed"] != n {
					t.Errorf("%s: audit %v, want scrubbed %v", path, line, n)
				}
			}
		})
	}
}

// An upload streamed through the scanner (too large to read whole) gets its
// value put in as it streams; the upstream echoes the upload back, and the
// task gets its own upload, placeholder and all.
func TestEchoOfAStreamedUploadIsScrubbed(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			f := newFixture(t, "open")
			f.up.handler = func(w http.ResponseWriter, r *http.Request) {
				got := f.up.requests() // the recording upstream read the body
				w.Write(got[len(got)-1].Body)
			}
			upload := strings.Repeat("0123456789", 10000) + f.phB + strings.Repeat("z", 70000)
			res, err := f.goClient(f.proxyURL, h2).Post("https://"+f.other+"/echo", "text/plain", strings.NewReader(upload))
			must(t, err)
			echo, err := io.ReadAll(res.Body)
			res.Body.Close()
			if err != nil || res.StatusCode != 200 {
				t.Fatalf("%d %v", res.StatusCode, err)
			}
			if got := f.up.requests(); len(got) != 1 || !strings.Contains(string(got[0].Body), realB) {
				t.Fatal("the upstream did not get the value in the upload")
			}
			if string(echo) != upload {
				t.Fatalf("the echo is not the upload as sent (%d bytes, want %d; holds the value: %v)", len(echo), len(upload), strings.Contains(string(echo), realB))
			}
			line := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/echo" })
			if line["scrubbed"] != float64(1) {
				t.Errorf("audit %v", line)
			}
		})
	}
}

// An upstream that compresses its answer although asked for identity: the
// answer cannot be scanned for a value, so the task gets a 502 and the
// audit says why; so does an answer to a request that carried no value,
// which may hold one stored before. The task's own Accept-Encoding is not
// passed on: the upstream is asked for identity.
func TestCompressedAnswerIsRefused(t *testing.T) {
	f := newFixture(t, "open")
	f.up.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		io.WriteString(zw, "you sent "+r.Header.Get("Authorization")+" accepting "+r.Header.Get("Accept-Encoding"))
		zw.Close()
	}
	res, body := f.get(t, "https://"+f.api+"/gz", http.Header{"Authorization": {"Bearer " + f.phA}})
	if res.StatusCode != http.StatusBadGateway || !strings.Contains(body, "content-coded") {
		t.Fatalf("%d %q", res.StatusCode, body)
	}
	line := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/gz" })
	if line["action"] != "blocked" || line["status"] != float64(502) || fmt.Sprint(line["keys"]) != "[acme/A]" {
		t.Errorf("audit %v", line)
	}
	req := mustRequest(t, "https://"+f.api+"/gz-plain", "")
	req.Header.Set("Accept-Encoding", "gzip")
	res, err := f.goClient(f.proxyURL, false).Do(req)
	must(t, err)
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusBadGateway || !strings.Contains(string(raw), "content-coded") {
		t.Fatalf("an answer to a request without a value: %d %q", res.StatusCode, raw)
	}
	f.waitAudit(func(m map[string]any) bool {
		return m["path"] == "/gz-plain" && m["action"] == "blocked" && m["status"] == float64(502)
	})
	if got := f.up.requests(); got[len(got)-1].Header.Get("Accept-Encoding") != "identity" {
		t.Errorf("the upstream was asked for %q", got[len(got)-1].Header.Get("Accept-Encoding"))
	}
}
