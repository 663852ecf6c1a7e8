package proxy

import (
	"context"
	"testing"
)

func TestAnswerPassage(t *testing.T) {
	for _, c := range []struct {
		name             string
		scrubbing, flush bool
		length           int64
		want             passage
	}{
		{"nothing to scrub", false, false, 10, passAsIs},
		{"nothing to scrub, streamed", false, true, -1, passAsIs},
		{"sized, fits one buffer", true, false, bodyChunk, scrubWhole},
		{"sized, empty", true, false, 0, scrubWhole},
		{"sized, past one buffer", true, false, bodyChunk + 1, scrubStreamed},
		{"no length", true, true, -1, scrubStreamed},
		{"server-sent events with a length", true, true, 10, scrubStreamed},
	} {
		if got := answerPassage(c.scrubbing, c.flush, c.length); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestRetryOnNewConn(t *testing.T) {
	for _, c := range []struct {
		name            string
		reused, hasBody bool
		try             int
		cancelled       error
		want            bool
	}{
		{"reused, no body, first try", true, false, 0, nil, true},
		{"a new connection failed", false, false, 0, nil, false},
		{"a body may have been read", true, true, 0, nil, false},
		{"tried once already", true, false, 1, nil, false},
		{"cancelled", true, false, 0, context.Canceled, false},
	} {
		if got := retryOnNewConn(c.reused, c.hasBody, c.try, c.cancelled); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
