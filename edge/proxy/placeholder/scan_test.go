package placeholder

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/policy"
)

var (
	refA = policy.KeyRef{Project: "acme", Key: "A"}
	refB = policy.KeyRef{Project: "acme", Key: "B"}
)

// scanFixture: task t1 owns placeholders for A and B, task t2 one for A.
// Only t1's A may be substituted (value "VALUE-A!"); anything else blocks.
const (
	phT1A  = "pa-Zq3VhN0xRk8TmW2cYb7LdJ"
	phT1B  = "pb_Hs9QeK4uGf6PzXa1Co5NvE"
	phT2A  = "pa-Mw8RtY2uIo4PlK6JhG0FdS"
	valueA = "VALUE-A!"
)

func scanIndex() *Index {
	return NewIndex(map[string]Owner{phT1A: {Task: "t1", Ref: refA}, phT1B: {Task: "t1", Ref: refB}, phT2A: {Task: "t2", Ref: refA}})
}

// errRefused stands for the proxy's refusal: the error that stops a scan.
var errRefused = errors.New("refused")

func allowOnlyT1A(o Owner, loc policy.Location) (string, error) {
	if o.Task == "t1" && o.Ref == refA && loc != policy.InURL {
		return valueA, nil
	}
	return "", errRefused
}

// chunkReader returns its data in the given chunk sizes.
type chunkReader struct {
	data  []byte
	sizes []int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := len(c.data)
	if len(c.sizes) > 0 {
		n = max(1, min(n, c.sizes[0]))
		c.sizes = c.sizes[1:]
	}
	n = min(n, len(p))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

func TestScannerFindsEveryPlaceholder(t *testing.T) {
	ix := scanIndex()
	in := "x" + phT1A + phT1A + "." + phT2A + "-" + phT1B[:10] + "y"
	ms := ix.Find([]byte(in), nil)
	if len(ms) != 3 || ms[0].Owner.Task != "t1" || ms[2].Owner.Task != "t2" {
		t.Fatalf("matches %+v", ms)
	}
	out, n, err := ix.Rewrite([]byte("Bearer "+phT1A), policy.InHeader, allowOnlyT1A)
	if err != nil || n != 1 || string(out) != "Bearer "+valueA {
		t.Fatalf("%q %d %v", out, n, err)
	}
	if _, _, err := ix.Rewrite([]byte(phT1A+" "+phT2A), policy.InHeader, allowOnlyT1A); err == nil {
		t.Fatal("another task's placeholder beside an allowed one must block")
	}
}

// A body streamed one byte at a time, and in odd chunks: the same result as
// scanning it whole, and memory bounded by the window.
func TestBodyScannerSplitReads(t *testing.T) {
	ix := scanIndex()
	body := strings.Repeat("abc", 20000) + phT1A + strings.Repeat("z", 100) + phT1A
	want := strings.ReplaceAll(body, phT1A, valueA)
	for _, sizes := range [][]int{nil, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, {60001, 3, 7, 11}, {59999, 5}} {
		s := NewScanner(&chunkReader{data: []byte(body), sizes: append([]int(nil), sizes...)}, ix, allowOnlyT1A)
		got, err := io.ReadAll(s)
		if err != nil || string(got) != want {
			t.Fatalf("sizes %v: err %v, equal %v", sizes, err, string(got) == want)
		}
		if cap(s.buf) > 2*chunk {
			t.Fatalf("window grew to %d", cap(s.buf))
		}
	}
	// A blocked placeholder split across reads stops the stream before it.
	s := NewScanner(&chunkReader{data: []byte("head " + phT2A + " tail"), sizes: []int{8, 9}}, ix, allowOnlyT1A)
	got, err := io.ReadAll(s)
	if !errors.Is(err, errRefused) || bytes.Contains(got, []byte(phT2A[:12])) {
		t.Fatalf("got %q, %v", got, err)
	}
}

// FuzzScanner checks the scanner where placeholders are found: header
// values, Basic credentials and body windows. Invariants: the streamed body
// equals the whole-buffer result however it is split; a request with any
// placeholder it may not use fails; the real value appears exactly where an
// allowed placeholder was and nowhere else.
func FuzzScanner(f *testing.F) {
	f.Add([]byte("Bearer "), uint8(3), []byte{5, 200, 1})
	f.Add([]byte(`{"k":"`+phT1A[:7]+`"}`), uint8(1), []byte{1, 2, 3})
	f.Add([]byte("user:"), uint8(0), []byte{64})
	f.Add([]byte(phT2A+"x"), uint8(2), []byte{7})
	ix := scanIndex()
	f.Fuzz(func(t *testing.T, data []byte, insert uint8, sizes []byte) {
		if bytes.Contains(data, []byte(valueA)) {
			return
		}
		// Insert placeholders at positions the fuzzer picks.
		var b bytes.Buffer
		phs := []string{phT1A, phT1B, phT2A}
		allowed := 0
		blockedSeen := false
		for i, c := range data {
			b.WriteByte(c)
			if insert != 0 && i%int(insert) == 0 && len(sizes) > 0 {
				ph := phs[int(sizes[i%len(sizes)])%3]
				b.WriteString(ph)
			}
		}
		in := b.Bytes()
		for _, m := range ix.Find(in, nil) {
			if m.Owner.Task == "t1" && m.Owner.Ref == refA {
				allowed++
			} else {
				blockedSeen = true
			}
		}
		whole, _, err := ix.Rewrite(in, policy.InBody, allowOnlyT1A)
		if (err != nil) != blockedSeen {
			t.Fatalf("blocked=%v but err=%v", blockedSeen, err)
		}
		if err == nil && bytes.Count(whole, []byte(valueA)) > allowed {
			t.Fatalf("value appears %d times for %d allowed placeholders", bytes.Count(whole, []byte(valueA)), allowed)
		}
		var chunks []int
		for _, s := range sizes {
			chunks = append(chunks, int(s)+1)
		}
		streamed, serr := io.ReadAll(NewScanner(&chunkReader{data: in, sizes: chunks}, ix, allowOnlyT1A))
		if (serr != nil) != (err != nil) {
			t.Fatalf("stream err %v, whole err %v", serr, err)
		}
		if err == nil && !bytes.Equal(streamed, whole) {
			t.Fatalf("streamed result differs from the whole-buffer result")
		}
		if serr != nil {
			for _, ph := range []string{phT1B, phT2A} {
				if bytes.Contains(streamed, []byte(ph)) {
					t.Fatal("a blocked placeholder went out before the block")
				}
			}
		}
		// Basic credentials: decoded, substituted, re-encoded.
		enc, berr := ix.RewriteBasic("Basic "+base64.StdEncoding.EncodeToString(in), allowOnlyT1A)
		if (berr != nil) != blockedSeen {
			t.Fatalf("basic: blocked=%v err=%v", blockedSeen, berr)
		}
		if berr == nil && enc != "" {
			out, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(enc, "Basic "))
			if err != nil || !bytes.Equal(out, whole) {
				t.Fatalf("basic: re-encoded credentials differ from the substituted text (%v)", err)
			}
		}
		// URL: nothing may be substituted there.
		if _, _, uerr := ix.Rewrite(in, policy.InURL, allowOnlyT1A); uerr == nil && len(ix.Find(in, nil)) > 0 {
			t.Fatal("a placeholder was allowed in the URL")
		}
	})
}

// benchIndex is an index as a busy host holds it: the fixture's
// placeholders among a thousand others of a hundred tasks.
func benchIndex(b *testing.B) *Index {
	all := map[string]Owner{phT1A: {Task: "t1", Ref: refA}, phT1B: {Task: "t1", Ref: refB}, phT2A: {Task: "t2", Ref: refA}}
	r := rand.NewChaCha8([32]byte{4})
	for i := 0; len(all) < 1003; i++ {
		ph, err := Mint(r, policy.Shape{Prefix: "sk-", Length: 40})
		if err != nil {
			b.Fatal(err)
		}
		all[ph] = Owner{Task: fmt.Sprintf("task-%d", i%100), Ref: policy.KeyRef{Project: "p", Key: fmt.Sprint(i)}}
	}
	return NewIndex(all)
}

// BenchmarkFind: the scanner's per-byte loop over what a request holds:
// header values and a URL without a placeholder (the common case, which
// must cost no allocation) and with one, and a 32 KiB read of a body.
func BenchmarkFind(b *testing.B) {
	ix := benchIndex(b)
	header := "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Safari/537.36"
	body := bytes.Repeat([]byte(`{"model":"m","messages":[{"role":"user","content":"lorem ipsum dolor"}]}`+"\n"), 500)[:32<<10]
	copy(body[len(body)/2:], phT1A)
	for _, c := range []struct {
		name string
		s    string
		b    []byte
	}{
		{"header-miss", header, nil},
		{"header-hit", "Bearer " + phT1A, nil},
		{"body-32KiB", "", body},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.s) + len(c.b)))
			b.ReportAllocs()
			var ms []Match
			for b.Loop() {
				if c.b != nil {
					ms = ix.Find(c.b, ms)
				} else {
					ms = ix.FindString(c.s, ms)
				}
			}
		})
	}
	b.Run("folded-miss", func(b *testing.B) {
		b.SetBytes(int64(len(header)))
		b.ReportAllocs()
		var ms []Match
		for b.Loop() {
			ms = ix.FindFolded(header, ms)
		}
	})
}

// BenchmarkRewriteString: a header value rewritten as the pipeline does,
// with its scratch: without a placeholder it comes back as it is, with no
// allocation.
func BenchmarkRewriteString(b *testing.B) {
	ix := benchIndex(b)
	for _, c := range []struct{ name, s string }{
		{"miss", "application/json; charset=utf-8"},
		{"hit", "Bearer " + phT1A},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var scratch []Match
			for b.Loop() {
				if _, _, err := ix.RewriteString(c.s, policy.InHeader, allowOnlyT1A, &scratch); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkScanRequestBody: a streamed request body through the scanner,
// 32 KiB reads of text with a placeholder every 32 reads, substituted.
func BenchmarkScanRequestBody(b *testing.B) {
	ix := benchIndex(b)
	bulk := bytes.Repeat([]byte("lorem ipsum dolor sit amet, consectetur adipiscing elit\n"), 600)[:32<<10]
	const total = 64 << 20
	b.SetBytes(total)
	b.ReportAllocs()
	for b.Loop() {
		s := NewScanner(&repeatReader{read: bulk, every: 32, value: []byte(phT1A), left: total}, ix, allowOnlyT1A)
		n, err := io.Copy(io.Discard, struct{ io.Reader }{s})
		if err != nil || s.Replaced() == 0 {
			b.Fatalf("%d bytes, %d substituted, %v", n, s.Replaced(), err)
		}
	}
}
