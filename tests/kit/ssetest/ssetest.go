// Package ssetest reads a Server-Sent Events body the way a browser's
// EventSource does, message by message, for tests of the stream.
package ssetest

import (
	"bufio"
	"io"
	"strings"
)

// Message is one SSE message: the fields of a block up to a blank line.
type Message struct {
	Event, ID, Data, Retry string
	// Comments are the block's comment lines (": keep-alive"), without the colon.
	Comments []string
}

// Read parses r into messages on a goroutine of its own; the channel
// closes when r ends. Lines up to 1 MiB are read.
func Read(r io.Reader) <-chan Message {
	out := make(chan Message, 4096)
	go func() {
		defer close(out)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var m Message
		empty := true
		for sc.Scan() {
			line := sc.Text()
			if line == "" {
				if !empty {
					out <- m
				}
				m, empty = Message{}, true
				continue
			}
			empty = false
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "":
				m.Comments = append(m.Comments, value)
			case "event":
				m.Event = value
			case "id":
				m.ID = value
			case "data":
				m.Data = value
			case "retry":
				m.Retry = value
			}
		}
	}()
	return out
}
