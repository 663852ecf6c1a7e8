package fleetclient

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runfleet/runfleet/shared/fleetapi"
)

// StreamEvent is one message of a run's stream, decoded by its type.
type StreamEvent struct {
	// Type is the SSE event: fleetapi.SSEEvent, SSESnapshot, SSEEgress or
	// SSEIdle (SSEDone ends Follow and is its result).
	Type string
	// ID is the message's id (what Last-Event-ID resumes from), or "".
	ID       string
	Event    *fleetapi.Event          // Type SSEEvent
	Snapshot *fleetapi.StreamSnapshot // Type SSESnapshot
	Egress   *fleetapi.EgressRecord   // Type SSEEgress
	Idle     *fleetapi.StreamIdle     // Type SSEIdle
}

// FollowOptions say where a Follow starts and what it reports.
type FollowOptions struct {
	// After starts after this event sequence (0: the run's first event).
	After int64
	// LastEventID resumes an earlier Follow (its Resumed): it wins over
	// After.
	LastEventID string
	// Egress asks for the run's egress ledger too (event: egress).
	Egress bool
	// OnReconnect, if set, is told before each reconnection: why the last
	// connection ended (nil for a planned end) and how long until the next.
	OnReconnect func(cause error, after time.Duration)
	// MaxFailures bounds the connections in a row that fail before any
	// message arrives; zero is 8. A planned end is not a failure.
	MaxFailures int
	// StallTimeout ends a connection that sends nothing for this long
	// (Fleet sends a keep-alive every 15 s, so silence means a connection
	// lost without a reset, which would otherwise hang for ever) and
	// reconnects as after a dropped one; zero is 45 s.
	StallTimeout time.Duration
}

// Followed is how a Follow ended.
type Followed struct {
	// Done is the stream's done message: the run is over and every event
	// was handed on.
	Done fleetapi.StreamDone
	// Resume is the Last-Event-ID to resume from (FollowOptions.LastEventID)
	// when the Follow ended early (ctx, fn's error, failures).
	Resume string
}

// ErrStopFollowing, returned by Follow's fn, ends the Follow with no error.
var ErrStopFollowing = errors.New("fleetclient: stop following")

// StreamOriginError is Follow's refusal of a stream URL the token may not
// go to: an origin that is neither the API's nor Options.StreamURL's,
// unless both the API and the stream are https. An https API's answer
// comes from the holder of the token over an authenticated channel, and in
// AWS the stream is on the stream function's own https URL, so that case
// works unconfigured; what is refused is a link that would carry the token
// in plain text, or off a plain-http API (a local stack, a test) to
// another host.
type StreamOriginError struct {
	// Origin is the stream URL's scheme://host:port.
	Origin string
}

func (e *StreamOriginError) Error() string {
	return fmt.Sprintf("fleetclient: the run's stream is on %s, neither the API's origin nor the configured stream's, and not https from an https API, so the token is not sent there: if it is your Fleet's stream function, set Options.StreamURL to it", e.Origin)
}

// Follow reads the run's stream (streamURL: its links.stream) until the
// run is done, handing each message to fn once and in order. It reconnects
// with Last-Event-ID after a planned end (the stream's retry delay), an
// idle end (the idle message's delay) and a dropped connection (backing
// off, at most MaxFailures in a row), so fn sees neither a gap nor a
// repeat; an event whose sequence fn has already seen is dropped, whatever
// a server sends. A refusal other than 429 (too_many_streams, waited out)
// is returned as an *Error; a streamURL the token may not go to (see
// StreamOriginError) is refused before any request.
func (c *Client) Follow(ctx context.Context, streamURL string, o FollowOptions, fn func(StreamEvent) error) (Followed, error) {
	u, err := url.Parse(streamURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Followed{}, fmt.Errorf("fleetclient: the stream URL %q is not an absolute http(s) URL: use the run's links.stream", streamURL)
	}
	if !c.mayFollow(u) {
		return Followed{}, &StreamOriginError{Origin: originOf(u)}
	}
	f := &follower{c: c, url: u, o: o, fn: fn, last: o.LastEventID, seen: o.After, retry: time.Second}
	if f.o.MaxFailures <= 0 {
		f.o.MaxFailures = 8
	}
	if f.o.StallTimeout <= 0 {
		f.o.StallTimeout = 45 * time.Second
	}
	if f.last != "" {
		f.seen = eventSeqOf(f.last)
	}
	return f.run(ctx)
}

// mayFollow says whether the token may go to the stream at u: see
// StreamOriginError.
func (c *Client) mayFollow(u *url.URL) bool {
	if slices.Contains(c.origins, originOf(u)) {
		return true
	}
	return strings.EqualFold(u.Scheme, "https") && strings.HasPrefix(c.origins[0], "https://")
}

type follower struct {
	c     *Client
	url   *url.URL
	o     FollowOptions
	fn    func(StreamEvent) error
	last  string        // the last message's id: the resume point
	seen  int64         // the highest event sequence handed on
	retry time.Duration // the stream's reconnection delay
	done  *fleetapi.StreamDone
}

func (f *follower) run(ctx context.Context) (Followed, error) {
	failures := 0
	for {
		progressed, err := f.connect(ctx)
		if f.done != nil {
			return Followed{Done: *f.done}, nil
		}
		if errors.Is(err, ErrStopFollowing) {
			return Followed{Resume: f.last}, nil
		}
		if ctx.Err() != nil {
			return Followed{Resume: f.last}, ctx.Err()
		}
		var apiErr *Error
		wait := f.retry
		switch {
		case errors.As(err, &apiErr) && apiErr.Status == http.StatusTooManyRequests:
			wait = max(apiErr.RetryAfter, time.Second)
		case errors.As(err, &apiErr) && !retriedStatus(apiErr.Status), errors.Is(err, errHandler):
			// A gateway's 502/503/504 (wrapped by connect) is retried
			// below, as a dropped connection is.
			return Followed{Resume: f.last}, err
		}
		if err != nil && !progressed {
			failures++
			if failures >= f.o.MaxFailures {
				return Followed{Resume: f.last}, fmt.Errorf("fleetclient: following the stream: %d connections in a row failed: %w", failures, err)
			}
			wait = max(wait, backoff(failures, 0))
		} else {
			failures = 0
		}
		if f.o.OnReconnect != nil {
			f.o.OnReconnect(err, wait)
		}
		if werr := f.c.wait(ctx, wait); werr != nil {
			return Followed{Resume: f.last}, werr
		}
	}
}

// errHandler marks an error fn returned, which ends the Follow as it is.
var errHandler = errors.New("fleetclient: the stream's handler failed")

// connect reads one connection of the stream: nil when it ended as planned
// (or with done), else why it failed; progressed when a message arrived.
func (f *follower) connect(ctx context.Context) (progressed bool, err error) {
	u := *f.url
	q := u.Query()
	if f.o.Egress {
		q.Set("egress", "true")
	}
	if f.last == "" && f.seen > 0 {
		q.Set("after", strconv.FormatInt(f.seen, 10))
	}
	u.RawQuery = q.Encode()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return false, err
	}
	f.c.authorize(req)
	req.Header.Set("Accept", "text/event-stream")
	if f.last != "" {
		req.Header.Set("Last-Event-ID", f.last)
	}
	resp, err := f.c.http.Do(req)
	if err != nil {
		return false, transportError(http.MethodGet, u.Path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		apiErr := toError(answer{status: resp.StatusCode, header: resp.Header, body: b})
		if retriedStatus(resp.StatusCode) && resp.StatusCode != http.StatusTooManyRequests {
			// A gateway's hiccup: reconnect as after a dropped connection.
			return false, fmt.Errorf("fleetclient: the stream answered %w", apiErr)
		}
		return false, apiErr
	}
	// The watchdog cancels the request when the body stays silent; a
	// read then fails and the connection counts as dropped.
	stalled := time.AfterFunc(f.o.StallTimeout, cancel)
	defer stalled.Stop()
	r := newSSEReader(&watchedBody{r: resp.Body, watchdog: stalled, after: f.o.StallTimeout})
	for {
		m, err := r.next()
		if err == io.EOF {
			// A planned end (retry: then the end), an idle end, or a
			// connection cut between messages: all resume from f.last.
			// Every connection starts with a snapshot, so one that
			// ends with no message at all failed.
			if !progressed {
				return false, errors.New("fleetclient: the stream ended before its first message")
			}
			return true, nil
		}
		if err != nil {
			return progressed, transportError(http.MethodGet, u.Path, err)
		}
		if m.retry > 0 {
			f.retry = m.retry
		}
		if m.event == "" && m.data == "" {
			continue // a comment or a retry alone
		}
		progressed = true
		if err := f.handle(m); err != nil {
			return progressed, err
		}
		if f.done != nil {
			return progressed, nil
		}
	}
}

// handle decodes one message, hands it on and moves the resume point past
// it (only then: a message fn failed on is not skipped by a resume).
func (f *follower) handle(m sseMessage) error {
	ev := StreamEvent{Type: m.event, ID: m.id}
	var target any
	switch m.event {
	case fleetapi.SSEEvent:
		ev.Event = &fleetapi.Event{}
		target = ev.Event
	case fleetapi.SSESnapshot:
		ev.Snapshot = &fleetapi.StreamSnapshot{}
		target = ev.Snapshot
	case fleetapi.SSEEgress:
		ev.Egress = &fleetapi.EgressRecord{}
		target = ev.Egress
	case fleetapi.SSEIdle:
		ev.Idle = &fleetapi.StreamIdle{}
		target = ev.Idle
	case fleetapi.SSEDone:
		var d fleetapi.StreamDone
		if err := json.Unmarshal([]byte(m.data), &d); err != nil {
			return fmt.Errorf("fleetclient: the stream's done message is not JSON: %w", err)
		}
		f.done = &d
		return nil
	default:
		// A message type this client does not know: skipped, but its id
		// still moves the resume point.
		f.advance(m.id)
		return nil
	}
	if err := json.Unmarshal([]byte(m.data), target); err != nil {
		return fmt.Errorf("fleetclient: the stream's %s message is not JSON: %w", m.event, err)
	}
	if ev.Event != nil && ev.Event.Sequence <= f.seen {
		f.advance(m.id)
		return nil // seen before: never handed on twice
	}
	if ev.Idle != nil && ev.Idle.RetryMs > 0 {
		f.retry = time.Duration(ev.Idle.RetryMs) * time.Millisecond
	}
	if err := f.fn(ev); err != nil {
		if errors.Is(err, ErrStopFollowing) {
			return err
		}
		return fmt.Errorf("%w: %w", errHandler, err)
	}
	if ev.Event != nil {
		f.seen = ev.Event.Sequence
	}
	f.advance(m.id)
	return nil
}

func (f *follower) advance(id string) {
	if id != "" {
		f.last = id
	}
}

// watchedBody re-arms its watchdog on every read that brought bytes.
type watchedBody struct {
	r        io.Reader
	watchdog *time.Timer
	after    time.Duration
}

func (w *watchedBody) Read(p []byte) (int, error) {
	n, err := w.r.Read(p)
	if n > 0 {
		w.watchdog.Reset(w.after)
	}
	return n, err
}

// eventSeqOf is the event sequence of a stream id: "<seq>" or
// "<seq>:<ledger seq>".
func eventSeqOf(id string) int64 {
	head, _, _ := strings.Cut(id, ":")
	n, err := strconv.ParseInt(head, 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// sseMessage is one SSE message as the HTML standard's parser reads it.
type sseMessage struct {
	event, id, data string
	retry           time.Duration
}

type sseReader struct {
	r *bufio.Reader
}

// maxSSELine bounds one line of the stream: an event's data is at most
// 32 KiB of text (escaped, up to six times that), an egress record a few.
const maxSSELine = 4 << 20

func newSSEReader(r io.Reader) *sseReader { return &sseReader{r: bufio.NewReaderSize(r, 64<<10)} }

// next reads up to the blank line ending a message. A stream that ends in
// the middle of a message returns io.EOF and drops that message, as
// EventSource does: it is sent again on the resume.
func (s *sseReader) next() (sseMessage, error) {
	var m sseMessage
	var data []string
	started := false
	for {
		line, err := s.line()
		if err != nil {
			return sseMessage{}, err
		}
		if line == "" {
			if !started {
				continue
			}
			m.data = strings.Join(data, "\n")
			return m, nil
		}
		started = true
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "event":
			m.event = value
		case "data":
			data = append(data, value)
		case "id":
			if !strings.ContainsRune(value, 0) {
				m.id = value
			}
		case "retry":
			if n, err := strconv.ParseInt(value, 10, 64); err == nil && n > 0 {
				m.retry = time.Duration(n) * time.Millisecond
			}
		}
	}
}

// line reads one line without its ending (LF, CRLF or CR-LF pairs).
func (s *sseReader) line() (string, error) {
	var b []byte
	for {
		chunk, err := s.r.ReadSlice('\n')
		b = append(b, chunk...)
		if len(b) > maxSSELine {
			return "", fmt.Errorf("a stream line is over %d MiB", maxSSELine>>20)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			if err == io.EOF {
				return "", io.EOF // a line without its end is not a line
			}
			return "", err
		}
		return strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r"), nil
	}
}
