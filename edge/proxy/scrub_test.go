package proxy

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/secrets"
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
// answer cannot be scanned for the value, so the task gets a 502 and the
// audit says why; an answer to a request that carried no value passes on
// compressed, untouched.
func TestCompressedAnswerToARequestCarryingAValueIsRefused(t *testing.T) {
	f := newFixture(t, "open")
	f.up.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		io.WriteString(zw, "you sent "+r.Header.Get("Authorization"))
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
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	must(t, err)
	plain, _ := io.ReadAll(zr)
	if res.StatusCode != 200 || res.Header.Get("Content-Encoding") != "gzip" || string(plain) != "you sent " {
		t.Fatalf("an answer to a request without a value: %d %q", res.StatusCode, plain)
	}
}

// The scrubber on a stream, cut at every place: the same bytes as
// replacing the values in the whole body. What it holds back is a fixed
// window, lines excepted, whatever the bytes are: a tail that begins a value
// is held back no more and no less than one that does not.
func TestScrubberSplitReads(t *testing.T) {
	st := &requestState{}
	st.subs = []substitution{
		{value: secrets.NewValue("VALUE-one-1234"), placeholder: "ph-one-Qm7vR2Qm7vR2Qm7v"},
		{value: secrets.NewValue("V2"), placeholder: "ph-two-Hw4sLpHw4sLpHw4sLpHw4"},
	}
	var sc scrubber
	sc.reset(st)
	body := "head VALUE-one-1234 V2 VALUE-one-123 VVALUE-one-1234V2 tail VALUE-one-1234"
	want := strings.NewReplacer("VALUE-one-1234", "ph-one-Qm7vR2Qm7vR2Qm7v", "V2", "ph-two-Hw4sLpHw4sLpHw4sLpHw4").Replace(body)
	for cut := 1; cut < len(body); cut++ {
		for _, sizes := range [][]int{{cut}, {cut, 1, 1, 1, 2}, {1, cut}} {
			src := &chunkReader{data: []byte(body), sizes: append([]int(nil), sizes...)}
			s := newPooledScanner(src, &sc)
			got, err := io.ReadAll(s)
			s.release()
			if err != nil || string(got) != want {
				t.Fatalf("sizes %v: %q %v", sizes, got, err)
			}
		}
	}
	pad := strings.Repeat("p", 300)
	for _, c := range []struct {
		b       string
		settled int
	}{
		{"abc", 0}, {"abcV", 0}, {"abcVALUE-one-123", 0}, {"VALUE-one-1234V", 0}, {"xV2", 0},
		{pad + "abc", 47}, {pad + "abcV", 48}, {pad + "abcVALUE-one-123", 60}, {pad + "VALUE-one-1234V", 59},
		// Every complete line goes: no value holds a line break.
		{"data: a\n\ndata: VALUE-one", 9}, {pad + "\nVALUE-one-12", 301},
	} {
		if got := sc.settled([]byte(c.b)); got != c.settled {
			t.Errorf("settled(%d bytes ending %q) = %d, want %d", len(c.b), c.b[max(len(c.b)-20, 0):], got, c.settled)
		}
	}
	// A value with a line break can span one: lines are held back too.
	st.subs = append(st.subs, substitution{value: secrets.NewValue("multi\nline"), placeholder: "ph-three-ZZZZZZZZZZZZZZZZZZZZZZZZ"})
	if got := sc.settled([]byte("data: a\n\ndata: multi\n")); got != 0 {
		t.Errorf("with a value holding a line break, settled = %d, want 0", got)
	}
}

// The window is at least the longest value less one byte, a power of two,
// and the same for every value up to 257 bytes.
func TestAnswerWindow(t *testing.T) {
	for _, c := range []struct{ longest, want int }{
		{0, 0}, {1, 256}, {29, 256}, {257, 256}, {258, 512}, {513, 512}, {514, 1024}, {3300, 4096},
	} {
		if got := answerWindow(c.longest); got != c.want {
			t.Errorf("answerWindow(%d) = %d, want %d", c.longest, got, c.want)
		}
	}
}

// A value put into a streamed request body after the answer began (an
// upstream answering at once, then echoing the body as it comes) is
// scrubbed from the answer even when its echo is split across reads: the
// scanner takes the request's values again before it decides what to hold
// back, not after.
func TestScrubberTakesAValueAddedWhileTheAnswerStreams(t *testing.T) {
	st := &requestState{}
	st.subs = st.subsBuf[:0]
	var sc scrubber
	sc.reset(st)
	const value, placeholder = "VALUE-added-later-0123456789", "ph-later-Qm7vR2Qm7vR2Qm7vR2Qm7vR2Qm"
	src := &hookReader{reads: []string{"before ", "echo " + value[:9], value[9:] + " after"}, hook: func(i int) {
		if i == 1 { // the value is recorded before the upstream can echo it
			st.mu.Lock()
			st.subs = append(st.subs, substitution{value: secrets.NewValue(value), placeholder: placeholder})
			st.mu.Unlock()
		}
	}}
	s := newPooledScanner(src, &sc)
	defer s.release()
	got, err := io.ReadAll(s)
	if err != nil || string(got) != "before echo "+placeholder+" after" {
		t.Fatalf("%q %v (holds the value's first part: %v)", got, err, strings.Contains(string(got), value[:9]))
	}
}

// hookReader returns reads one per Read, calling hook with each's index
// first.
type hookReader struct {
	reads []string
	i     int
	hook  func(int)
}

func (r *hookReader) Read(p []byte) (int, error) {
	if r.i == len(r.reads) {
		return 0, io.EOF
	}
	r.hook(r.i)
	n := copy(p, r.reads[r.i])
	r.i++
	return n, nil
}

// FuzzScrubber: whatever an answer holds and however it is split into
// reads, the scrubbed stream equals the whole answer scrubbed, and no value
// is left in it; how much of it the scanner may pass on depends on its
// length and line breaks alone, not on what else it holds. The values are spelt with bytes no placeholder has, so a
// placeholder put in never forms a value with its neighbours.
func FuzzScrubber(f *testing.F) {
	f.Add([]byte("echo: "), uint8(3), []byte{5, 200, 1})
	f.Add([]byte("~!~#~#~!"), uint8(1), []byte{1, 2, 3})
	f.Add([]byte(""), uint8(0), []byte{64})
	values := []string{"~!~!~ab", "#~#", "!"}
	st := &requestState{}
	for i, v := range values {
		st.subs = append(st.subs, substitution{value: secrets.NewValue(v), placeholder: fmt.Sprintf("ph-%d-Qm7vR2Qm7vR2Qm7vR2Qm7vR2", i)})
	}
	f.Fuzz(func(t *testing.T, data []byte, insert uint8, sizes []byte) {
		var b bytes.Buffer
		for i, c := range data {
			b.WriteByte(c)
			if insert != 0 && i%int(insert) == 0 && len(sizes) > 0 {
				b.WriteString(values[int(sizes[i%len(sizes)])%len(values)])
			}
		}
		in := b.Bytes()
		var sc scrubber
		sc.reset(st)
		blank := bytes.Clone(in)
		for i, c := range blank {
			if c != '\n' {
				blank[i] = 'z'
			}
		}
		if a, b := sc.settled(in), sc.settled(blank); a != b {
			t.Fatalf("settled %d, but %d for as many bytes and the same line breaks", a, b)
		}
		whole, _ := sc.whole(bytes.Clone(in))
		for _, v := range values {
			if bytes.Contains(whole, []byte(v)) {
				t.Fatalf("a value is left in the scrubbed answer %q", whole)
			}
		}
		var chunks []int
		for _, s := range sizes {
			chunks = append(chunks, int(s)+1)
		}
		s := newPooledScanner(&chunkReader{data: in, sizes: chunks}, &sc)
		streamed, err := io.ReadAll(s)
		s.release()
		if err != nil || !bytes.Equal(streamed, whole) {
			t.Fatalf("the streamed answer differs from the whole one scrubbed (%v)", err)
		}
	})
}

// BenchmarkScrubStreamedAnswer: the streamed answer's hot path, a body
// scanned for the request's values on its way to the task, read as an
// upstream sends it: bulk (32 KiB reads of text, a value echoed every
// 1 MiB) and server-sent events (one small event per read, as an LLM
// streams tokens).
func BenchmarkScrubStreamedAnswer(b *testing.B) {
	st := &requestState{}
	st.subs = []substitution{{value: secrets.NewValue(realA), placeholder: "ph-A-Qm7vR2Qm7vR2Qm7vR2Qm7vR2Qm7vR2Qm7vR2Q"}}
	bulk := bytes.Repeat([]byte("lorem ipsum dolor sit amet, consectetur adipiscing elit\n"), 600)[:bodyChunk]
	event := []byte(`data: {"choices":[{"delta":{"content":" token"},"index":0}]}` + "\n\n")
	for _, c := range []struct {
		name  string
		read  []byte
		every int // reads between echoed values
		total int64
	}{
		{"bulk", bulk, 32, 64 << 20},
		{"sse", event, 0, 8 << 20},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(c.total)
			b.ReportAllocs()
			var sc scrubber
			for i := 0; i < b.N; i++ {
				sc.reset(st)
				s := newPooledScanner(&repeatReader{read: c.read, every: c.every, value: []byte(realA), left: c.total}, &sc)
				n, err := io.Copy(io.Discard, struct{ io.Reader }{s})
				s.release()
				if err != nil || n < c.total {
					b.Fatalf("%d bytes, %v", n, err)
				}
			}
		})
	}
}

// repeatReader returns read for every Read, with value in its place every
// every reads (never when 0), up to left bytes.
type repeatReader struct {
	read, value []byte
	every, n    int
	left        int64
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.left <= 0 {
		return 0, io.EOF
	}
	r.n++
	src := r.read
	if r.every > 0 && r.n%r.every == 0 {
		src = r.value
	}
	k := copy(p, src[:min(int64(len(src)), r.left)])
	r.left -= int64(k)
	return k, nil
}
