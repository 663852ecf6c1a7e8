package placeholder

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/runfleet/runfleet/edge/secrets"
)

// ledger is a run's values as the proxy keeps them: a Source, to which
// another goroutine may add while the answer streams.
type ledger struct {
	mu      sync.Mutex
	secrets []Secret
	set     *Set
}

func (v *ledger) add(value, placeholder string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.secrets = append(v.secrets, Secret{Value: secrets.NewValue(value), Placeholder: placeholder})
	v.set = NewSet(v.secrets)
}

func (v *ledger) Set() *Set {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.set
}

// realA is a value as long as a real credential.
const realA = "real-A-value-do-not-leak-1111"

// The scrubber on a stream, cut at every place: the same bytes as
// replacing the values in the whole body. What it holds back is a fixed
// window, lines excepted, whatever the bytes are: a tail that begins a value
// is held back no more and no less than one that does not.
func TestScrubberSplitReads(t *testing.T) {
	st := &ledger{}
	st.add("VALUE-one-1234", "ph-one-Qm7vR2Qm7vR2Qm7v")
	st.add("V2", "ph-two-Hw4sLpHw4sLpHw4sLpHw4")
	var sc Scrubber
	sc.Reset(st)
	body := "head VALUE-one-1234 V2 VALUE-one-123 VVALUE-one-1234V2 tail VALUE-one-1234"
	// "VALUE-one-123" is 13 of the value's bytes: a fragment, scrubbed too.
	want := strings.NewReplacer("VALUE-one-1234", "ph-one-Qm7vR2Qm7vR2Qm7v", "VALUE-one-123", "ph-one-Qm7vR2Qm7vR2Qm7v", "V2", "ph-two-Hw4sLpHw4sLpHw4sLpHw4").Replace(body)
	for cut := 1; cut < len(body); cut++ {
		for _, sizes := range [][]int{{cut}, {cut, 1, 1, 1, 2}, {1, cut}} {
			src := &chunkReader{data: []byte(body), sizes: append([]int(nil), sizes...)}
			s := sc.Stream(src)
			got, err := io.ReadAll(s)
			s.Release()
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
	st.add("multi\nline", "ph-three-ZZZZZZZZZZZZZZZZZZZZZZZZ")
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
	st := &ledger{}
	var sc Scrubber
	sc.Reset(st)
	const value, placeholder = "VALUE-added-later-0123456789", "ph-later-Qm7vR2Qm7vR2Qm7vR2Qm7vR2Qm"
	src := &hookReader{reads: []string{"before ", "echo " + value[:9], value[9:] + " after"}, hook: func(i int) {
		if i == 1 { // the value is recorded before the upstream can echo it
			st.add(value, placeholder)
		}
	}}
	s := sc.Stream(src)
	defer s.Release()
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
	st := &ledger{}
	for i, v := range values {
		st.add(v, fmt.Sprintf("ph-%d-Qm7vR2Qm7vR2Qm7vR2Qm7vR2", i))
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
		var sc Scrubber
		sc.Reset(st)
		blank := bytes.Clone(in)
		for i, c := range blank {
			if c != '\n' {
				blank[i] = 'z'
			}
		}
		if a, b := sc.settled(in), sc.settled(blank); a != b {
			t.Fatalf("settled %d, but %d for as many bytes and the same line breaks", a, b)
		}
		whole, _ := sc.Whole(bytes.Clone(in))
		for _, v := range values {
			if bytes.Contains(whole, []byte(v)) {
				t.Fatalf("a value is left in the scrubbed answer %q", whole)
			}
		}
		var chunks []int
		for _, s := range sizes {
			chunks = append(chunks, int(s)+1)
		}
		s := sc.Stream(&chunkReader{data: in, sizes: chunks})
		streamed, err := io.ReadAll(s)
		s.Release()
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
	st := &ledger{}
	st.add(realA, "ph-A-Qm7vR2Qm7vR2Qm7vR2Qm7vR2Qm7vR2Qm7vR2Q")
	bulk := bytes.Repeat([]byte("lorem ipsum dolor sit amet, consectetur adipiscing elit\n"), 600)[:chunk]
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
			var sc Scrubber
			for i := 0; i < b.N; i++ {
				sc.Reset(st)
				s := sc.Stream(&repeatReader{read: c.read, every: c.every, value: []byte(realA), left: c.total})
				n, err := io.Copy(io.Discard, struct{ io.Reader }{s})
				s.Release()
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
