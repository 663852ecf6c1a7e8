package runlog

import (
	"strings"
	"unicode/utf8"
)

// Chunker turns a process's output, read in arbitrary pieces, into event
// texts: valid UTF-8 (invalid bytes become U+FFFD), each at most max bytes,
// never splitting a character, and holding back a character cut by a read
// until the next piece completes it. The zero value is not usable: use
// NewChunker. A Chunker is used by one goroutine.
type Chunker struct {
	max     int
	pending []byte
}

// NewChunker returns a Chunker whose texts are at most max bytes (at least
// utf8.UTFMax; the host protocol's MaxEventData for events).
func NewChunker(max int) *Chunker {
	if max < utf8.UTFMax {
		max = utf8.UTFMax
	}
	return &Chunker{max: max}
}

// Write takes the next piece of output and returns the texts it completes.
func (c *Chunker) Write(b []byte) []string {
	c.pending = append(c.pending, b...)
	cut := len(c.pending) - incompleteTail(c.pending)
	texts := split(strings.ToValidUTF8(string(c.pending[:cut]), "\uFFFD"), c.max)
	c.pending = append(c.pending[:0], c.pending[cut:]...)
	return texts
}

// Flush returns what is held back, at the end of the output.
func (c *Chunker) Flush() []string {
	texts := split(strings.ToValidUTF8(string(c.pending), "\uFFFD"), c.max)
	c.pending = c.pending[:0]
	return texts
}

// incompleteTail is the length of a character at the end of b that has begun
// but not ended, which more bytes may still complete.
func incompleteTail(b []byte) int {
	for i := 1; i < utf8.UTFMax && i <= len(b); i++ {
		c := b[len(b)-i]
		if utf8.RuneStart(c) {
			if c >= utf8.RuneSelf && !utf8.FullRune(b[len(b)-i:]) {
				return i
			}
			return 0
		}
	}
	return 0
}

// split cuts valid UTF-8 text into pieces of at most max bytes on character
// boundaries.
func split(s string, max int) []string {
	var out []string
	for len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		out = append(out, s[:cut])
		s = s[cut:]
	}
	if s != "" {
		out = append(out, s)
	}
	return out
}
