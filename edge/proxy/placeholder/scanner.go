package placeholder

import (
	"io"
	"sync"

	"github.com/runfleet/runfleet/edge/policy"
)

// chunk is how much of a body a Scanner reads at a time.
const chunk = 32 << 10

// bufferPool lends answer scanners their window and output buffers.
var bufferPool = sync.Pool{New: func() any { b := make([]byte, chunk); return &b }}

// rewriter is what a Scanner looks for in a stream and what it puts in
// its place: placeholders in a request body (placeholderRewriter), real
// values in an answer (Scrubber).
type rewriter interface {
	// find appends every occurrence in b to out, by start.
	find(b []byte, out []Match) []Match
	// settled is how many of b's leading bytes the scanner may pass on
	// now, b being all it has read and not yet passed on: every occurrence
	// that starts before that point must lie whole in b. The scanner
	// replaces each, passing on one that reaches past the point whole, and
	// holds the rest of b back until more bytes come or the stream ends
	// (then everything goes, scanned). For an answer the point is what the
	// task observes, by when bytes reach it: it must not depend on whether
	// b partially matches a value (Scrubber.settled).
	settled(b []byte) int
	// replace decides every occurrence in ms, filling values by match, or
	// returns the error that stops the stream.
	replace(ms []Match, values []string) ([]string, error)
}

// placeholderRewriter finds known placeholders in a request body and
// replaces each as the request's Substituter decides.
type placeholderRewriter struct {
	ix  *Index
	sub Substituter
}

func (r placeholderRewriter) find(b []byte, out []Match) []Match { return findIn(r.ix, b, out) }

// settled: all but the trailing run of bytes a placeholder may hold, up to
// the longest placeholder less one. What this reveals is the task's own:
// its placeholders are no secret to it.
func (r placeholderRewriter) settled(b []byte) int {
	hold := 0
	for hold < len(b) && hold < r.ix.maxLen-1 && placeholderByte(b[len(b)-1-hold]) {
		hold++
	}
	return len(b) - hold
}

func (r placeholderRewriter) replace(ms []Match, values []string) ([]string, error) {
	return decide(ms, policy.InBody, r.sub, values)
}

// Scanner streams a body through a rewriter with a bounded window: it
// holds back only the trailing bytes its rewriter has not settled (for
// placeholders a run that could begin one, at most the longest less one;
// for an answer a fixed window, lines excepted: Scrubber.settled), so an
// occurrence split across reads is still found, memory stays bounded and
// a stream is not delayed more than that.
//
// A Scanner is an io.Reader for one goroutine. Once its source or its
// rewriter has failed, every Read returns that error; a decision's error
// comes before any byte of the text it was met in goes on.
type Scanner struct {
	src io.Reader
	rw  rewriter
	buf []byte // unscanned bytes, the held-back tail first
	out []byte // scanned bytes ready for Read, the rest of outBuf
	// outBuf is where scan writes out, reused once out is drained.
	outBuf []byte
	err    error // from src, reported once buf and out are drained
	fail   error // a decision that stops the stream
	n      int   // occurrences replaced
	read   int64 // bytes read from src

	ms     []Match  // scratch for find
	values []string // scratch for replace
	// pooled holds buffers lent by bufferPool (Release returns them).
	pooled [2]*[]byte
}

// NewScanner is src with every placeholder ix knows replaced as sub decides
// for policy.InBody: a request body as it streams. sub is called on the
// goroutine that reads the Scanner.
func NewScanner(src io.Reader, ix *Index, sub Substituter) *Scanner {
	return &Scanner{src: src, rw: placeholderRewriter{ix: ix, sub: sub}}
}

// newPooledScanner is a Scanner whose window and output lie in buffers
// from bufferPool; its owner calls Release once done reading it.
func newPooledScanner(src io.Reader, rw rewriter) *Scanner {
	s := &Scanner{src: src, rw: rw}
	s.pooled[0], s.pooled[1] = bufferPool.Get().(*[]byte), bufferPool.Get().(*[]byte)
	s.buf, s.outBuf = (*s.pooled[0])[:0], (*s.pooled[1])[:0]
	return s
}

// Replaced is how many occurrences the Scanner has replaced so far.
func (s *Scanner) Replaced() int { return s.n }

// Release returns the buffers a pooled Scanner (Scrubber.Stream) borrowed;
// the Scanner is not read again. It does nothing for one from NewScanner.
func (s *Scanner) Release() {
	for i, b := range s.pooled {
		if b != nil {
			bufferPool.Put(b)
			s.pooled[i] = nil
		}
	}
	s.buf, s.out, s.outBuf = nil, nil, nil
}

func (s *Scanner) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.fail != nil {
			return 0, s.fail
		}
		if s.err != nil && len(s.buf) == 0 {
			return 0, s.err
		}
		if s.err == nil {
			s.fill()
		}
		s.scan()
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

func (s *Scanner) fill() {
	if cap(s.buf)-len(s.buf) < chunk/2 {
		grown := make([]byte, len(s.buf), len(s.buf)+chunk)
		copy(grown, s.buf)
		s.buf = grown
	}
	n, err := s.src.Read(s.buf[len(s.buf):cap(s.buf)])
	s.buf = s.buf[:len(s.buf)+n]
	s.read += int64(n)
	if err != nil {
		s.err = err
	}
}

// scan moves every byte of buf that cannot be part of an unfinished
// occurrence to out, replaced as decided.
func (s *Scanner) scan() {
	limit := len(s.buf)
	if s.err == nil {
		limit = s.rw.settled(s.buf)
	}
	ms := s.rw.find(s.buf, s.ms)
	s.ms = ms
	// Decide every complete occurrence, even one in the held-back tail: a
	// block must stop the body before any of it goes on.
	values, err := s.rw.replace(ms, s.values)
	if err != nil {
		s.fail = err
		s.out = nil
		return
	}
	s.values = values
	out, pos, n := release(s.outBuf[:0], s.buf, limit, s.err == nil, ms, values)
	s.n += n
	s.out, s.outBuf = out, out
	rest := copy(s.buf, s.buf[pos:])
	s.buf = s.buf[:rest]
}

// release appends to out the bytes of buf before limit with the decided
// occurrences that start there replaced (values by match; one reaching past
// limit goes whole, one overlapping a replaced one is skipped), and returns
// where in buf it stopped and how many it replaced. The rest of buf, from
// pos, waits for more bytes. While more may come (open), an occurrence
// that reaches past limit may still grow (a run of a value continuing in
// the next read, or one it overlaps not yet read whole): it stops the
// release before it, and goes whole once settled. An occurrence longer
// than what limit holds back (only overlapping runs of a value that
// repeats itself make one) goes whole at once: it cannot pin a stream's
// memory, nor make each read scan more than twice the window.
func release(out, buf []byte, limit int, open bool, ms []Match, values []string) (_ []byte, pos, n int) {
	for i, m := range ms {
		if m.Start >= limit {
			break // decided; replaced when its turn comes
		}
		if open && m.End > limit && m.End-m.Start <= len(buf)-limit+1 {
			limit = m.Start
			break
		}
		if m.Start < pos {
			continue
		}
		out = append(out, buf[pos:m.Start]...)
		out = append(out, values[i]...)
		pos = m.End
		n++
	}
	if pos < limit {
		out = append(out, buf[pos:limit]...)
		pos = limit
	}
	return out, pos, n
}
