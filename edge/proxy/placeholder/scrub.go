package placeholder

import (
	"bytes"
	"io"
	"net/http"
	"sort"
	"strings"

	"github.com/runfleet/runfleet/edge/secrets"
)

// Pair is one value substituted into a request and the placeholder the
// task sees in its place.
type Pair struct {
	Value       secrets.Value
	Placeholder string
}

// Source is where a Scrubber takes the values to scrub: those substituted
// into one request so far. Its values may grow while the answer streams (an
// upstream answering before a streamed request body has been read whole,
// its substitutions made on another goroutine), so AppendValues is called
// on the Scrubber's goroutine concurrently with them, and must be safe for
// that.
//
// The contract that keeps an echo from slipping through: a value is
// recorded, and visible to AppendValues, before it is sent upstream.
type Source interface {
	// AppendValues appends every value recorded so far, in the order they
	// were first recorded, to dst and returns it and their number, unless
	// that number is still seen: then it returns dst as it is and seen.
	AppendValues(dst []Pair, seen int) ([]Pair, int)
}

// Scrubber takes the real values out of what an upstream answers to a
// request they were put into: many APIs echo a credential (an error message
// quoting the key, a debug endpoint returning the request), and the task
// must never see one. Each value substituted into the request is replaced
// by its placeholder wherever its bytes appear in the answer's header
// fields (Header), its body (Whole, Stream), its WebSocket frames (Pass)
// and its trailers.
//
// Only the value's literal bytes are found: an answer that encodes it
// (base64, percent- or JSON-escaping, a compressed body) is not recognised;
// the proxy asks for an uncoded body and refuses a coded one. A value is
// replaced wherever its bytes appear, so a very short value garbles
// answers: values are expected to be real credentials.
//
// The Scrubber takes the request's values again (Source) whenever their
// number changed, before each header, body or read it scrubs. A zero
// Scrubber is ready once Reset; it is for one goroutine at a time.
type Scrubber struct {
	src      Source
	pairs    []Pair
	pairsBuf [2]Pair
	// needles are the pairs' values as bytes, by pair, revealed when a
	// body is first searched (nil until then).
	needles    [][]byte
	needlesBuf [2][]byte
	seen       int  // the Source's count when pairs was taken
	window     int  // answerWindow of the longest value
	lines      bool // no value holds a '\n'

	ms     []Match  // Pass's scratch
	values []string // Pass's scratch
}

var _ rewriter = (*Scrubber)(nil)

// Reset readies sc for the answer to the request whose values src holds.
// sc is not copied after: it keeps up to two values in itself.
func (sc *Scrubber) Reset(src Source) {
	*sc = Scrubber{src: src}
	sc.pairs = sc.pairsBuf[:0]
	sc.refresh()
}

// refresh takes the request's values again when more were substituted.
func (sc *Scrubber) refresh() {
	got, n := sc.src.AppendValues(sc.pairs[:0], sc.seen)
	if n == sc.seen {
		return
	}
	sc.seen = n
	sc.pairs, sc.lines = got[:0], true
	longest := 0
	for _, p := range got {
		if p.Value.IsZero() {
			continue
		}
		sc.pairs = append(sc.pairs, p)
		longest = max(longest, p.Value.Len())
		sc.lines = sc.lines && strings.IndexByte(p.Value.Reveal(), '\n') < 0
	}
	if sc.needles == nil {
		sc.needles = sc.needlesBuf[:0]
	}
	if cap(sc.needles) < len(sc.pairs) {
		sc.needles = make([][]byte, len(sc.pairs))
	}
	sc.needles = sc.needles[:len(sc.pairs)]
	clear(sc.needles)
	sc.window = answerWindow(longest)
}

// minAnswerWindow is the least a streamed answer holds back.
const minAnswerWindow = 256

// answerWindow is how many trailing bytes a streamed answer holds back when
// the longest value is longest bytes long: at least longest-1, so that an
// occurrence starting before the window lies whole in what was read,
// rounded up to a power of two no less than minAnswerWindow. A task can
// measure the window (how many echoed bytes stay behind), so it tells
// nothing of a value up to minAnswerWindow+1 bytes long and of a longer
// one only the power of two its length lies under.
func answerWindow(longest int) int {
	if longest == 0 {
		return 0
	}
	w := minAnswerWindow
	for w < longest-1 {
		w *= 2
	}
	return w
}

// Header replaces values in h's field names and values, in place, and
// returns how many it replaced.
func (sc *Scrubber) Header(h http.Header) int {
	sc.refresh()
	if len(sc.pairs) == 0 {
		return 0
	}
	n := 0
	for name, vs := range h {
		for i, v := range vs {
			if out, k := sc.text(v); k > 0 {
				vs[i] = out
				n += k
			}
		}
		if out, k := sc.text(name); k > 0 {
			delete(h, name)
			h[out] = vs
			n += k
		}
	}
	return n
}

// text replaces values in s; s itself when there is none.
func (sc *Scrubber) text(s string) (string, int) {
	n := 0
	for _, p := range sc.pairs {
		if k := strings.Count(s, p.Value.Reveal()); k > 0 {
			s = strings.ReplaceAll(s, p.Value.Reveal(), p.Placeholder)
			n += k
		}
	}
	return s, n
}

// Whole replaces values in a body read whole and returns it and how many it
// replaced: b itself when there is none, a new slice otherwise (b is never
// written).
func (sc *Scrubber) Whole(b []byte) ([]byte, int) {
	sc.refresh()
	ms := sc.find(b, nil)
	if len(ms) == 0 {
		return b, 0
	}
	values, _ := sc.replace(ms, nil)
	return splice(make([]byte, 0, len(b)+len(ms)*64), b, ms, values)
}

// Stream is src scrubbed as it is read, through the bounded window (see
// settled): a streamed answer body. The Scanner's buffers are pooled: its
// owner calls Release once done with it, and reads it on sc's goroutine.
func (sc *Scrubber) Stream(src io.Reader) *Scanner { return newPooledScanner(src, sc) }

// Pass is one step of a stream the caller frames itself (a WebSocket
// message, piece by piece): it appends to out the bytes of held that may
// reach the task now, scrubbed (all of them when final: the message ends
// with held), and returns out, how many of held's leading bytes it took
// and how many values it replaced. The rest of held waits for the next
// piece, appended to it. out must not overlap held.
func (sc *Scrubber) Pass(out, held []byte, final bool) (_ []byte, pos, n int) {
	limit := len(held)
	if !final {
		limit = sc.settled(held)
	}
	sc.ms = sc.find(held, sc.ms)
	sc.values, _ = sc.replace(sc.ms, sc.values)
	return release(out, held, limit, sc.ms, sc.values)
}

// find reports every occurrence of a value in b, by start; of two that
// start together the longer comes first (splice keeps it).
func (sc *Scrubber) find(b []byte, out []Match) []Match {
	sc.refresh()
	out = out[:0]
	for k := range sc.pairs {
		p := &sc.pairs[k]
		needle := sc.needles[k]
		if needle == nil {
			needle = []byte(p.Value.Reveal())
			sc.needles[k] = needle
		}
		for pos := 0; ; {
			i := bytes.Index(b[pos:], needle)
			if i < 0 {
				break
			}
			start := pos + i
			out = append(out, Match{Start: start, End: start + len(needle), Owner: Owner{Placeholder: p.Placeholder}})
			pos = start + len(needle)
		}
	}
	if len(sc.pairs) > 1 && len(out) > 1 {
		sort.SliceStable(out, func(i, j int) bool {
			if out[i].Start != out[j].Start {
				return out[i].Start < out[j].Start
			}
			return out[i].End > out[j].End
		})
	}
	return out
}

// settled is how much of b, the answer's bytes not yet passed on, may
// reach the task now: all but the window, and, when no value holds a line
// break (none can span one then), every line b completes, so that
// server-sent events, NDJSON and other line-framed streams stay
// interactive: an event goes on as soon as its blank line comes. It
// depends on b's length and its line breaks alone, never on whether b's
// tail could begin a value: with an upstream that echoes what the task
// sends, holding back only a possible start of a value told the task, by
// when its echo came back, whether what it sent was a prefix of the value,
// and so the value a character at a time. What it does reveal:
// the window's size (see answerWindow) and whether some value in this
// request holds a line break.
//
// Values are taken again first: bytes an upstream echoed are read only
// after the value in them was recorded, so the window covers every value b
// can hold part of.
func (sc *Scrubber) settled(b []byte) int {
	sc.refresh()
	n := max(len(b)-sc.window, 0)
	if sc.lines {
		if i := bytes.LastIndexByte(b[n:], '\n'); i >= 0 {
			n += i + 1
		}
	}
	return n
}

func (sc *Scrubber) replace(ms []Match, values []string) ([]string, error) {
	values = values[:0]
	for _, m := range ms {
		values = append(values, m.Owner.Placeholder)
	}
	return values, nil
}
