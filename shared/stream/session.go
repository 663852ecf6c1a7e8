package stream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/runfleet/runfleet/shared/api"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/store"
)

// sink is where a session writes. Write sends p and flushes it towards the
// client, blocking while the client does not take it. Abort may be called
// from another goroutine at any time: a blocked Write, and every later
// one, fails at once.
type sink interface {
	Write(p []byte) error
	Abort()
}

// endReason is why a stream ended.
type endReason int

const (
	endDone      endReason = iota // the run is over and every event was sent
	endPlanned                    // the maximum duration or the deadline: retry hint sent
	endCanceled                   // the context ended (client gone, shutdown)
	endCutOff                     // a write did not complete in time: the client stopped reading
	endGone                       // a write failed: the client is gone
	endFault                      // a store fault (logged): retry hint sent
	endDeleted                    // the run was deleted (its host removed with force)
	endIdle                       // no new event for IdleTimeout: resume hint sent
	endLeaseLost                  // the stream's slot lapsed and another stream took it: retry hint sent
)

func (e endReason) String() string {
	return [...]string{"done", "planned", "canceled", "client_stopped_reading", "client_gone", "fault", "run_deleted", "idle", "lease_lost"}[e]
}

// session is one client's stream.
type session struct {
	h      *Handler
	req    request
	caller store.Caller
	run    store.Run
	// after is where the client asked to resume; cursor is the sequence of
	// the last event written.
	after, cursor int64
	// egress: the stream carries the ledger too (?egress=true);
	// egressCursor is the seq of the last record written, head the
	// ledger's head as last read.
	egress       bool
	egressCursor int64
	head         store.EgressHead
	egressSent   int
	snapshotSent bool
	sink         sink
	lastWrite    time.Time
	sent         int
	fault        error
	// lastEvent is when an event was last sent (the start before any):
	// the idle end counts from it.
	lastEvent time.Time
	// lease is the caller's slot this stream holds (nil without a cap);
	// renewAt is when it is renewed next.
	lease   *store.StreamLease
	renewAt time.Time
}

// serve streams until the run is done or the stream must end, and says why.
func (s *session) serve(ctx context.Context, out sink) endReason {
	s.sink = out
	h := s.h
	defer s.release(ctx)
	begun := h.clock.Now()
	s.lastWrite, s.lastEvent = begun, begun
	s.renewAt = begun.Add(h.cfg.LeaseTTL / 3)
	end := begun.Add(h.cfg.MaxDuration)
	if deadline, ok := ctx.Deadline(); ok {
		// The context's deadline is the invocation's, on the wall clock.
		if d := begun.Add(time.Until(deadline) - h.cfg.EndMargin); d.Before(end) {
			end = d
		}
	}
	reason := s.loop(ctx, end)
	h.logEnd(ctx, s, begun, reason)
	return reason
}

func (s *session) loop(ctx context.Context, end time.Time) endReason {
	h := s.h
	for {
		if ctx.Err() != nil {
			s.goodbye("the stream is closing")
			return endCanceled
		}
		if reason, over := s.poll(ctx); over {
			return reason
		}
		now := h.clock.Now()
		if !now.Before(end) {
			if err := s.goodbye("the stream reached its maximum duration"); err != nil {
				return s.writeEnd(err)
			}
			return endPlanned
		}
		idleAt := s.lastEvent.Add(h.cfg.IdleTimeout)
		if !now.Before(idleAt) {
			if err := s.idleEnd(); err != nil {
				return s.writeEnd(err)
			}
			return endIdle
		}
		if reason, over := s.renew(ctx, now); over {
			return reason
		}
		if !now.Before(s.lastWrite.Add(h.cfg.KeepAlive)) {
			if err := s.send([]byte(": keep-alive\n\n")); err != nil {
				return s.writeEnd(err)
			}
		}
		wait := min(h.cfg.PollInterval, end.Sub(now), s.lastWrite.Add(h.cfg.KeepAlive).Sub(now), idleAt.Sub(now))
		if s.lease != nil {
			wait = min(wait, s.renewAt.Sub(now))
		}
		s.sleep(ctx, max(wait, time.Millisecond))
	}
}

// poll syncs the run from its host, sends what the mirror holds beyond the
// cursor, the snapshot once, and done at the end. over reports the end.
func (s *session) poll(ctx context.Context) (endReason, bool) {
	// A host that hangs must not hold the stream past a keep-alive: the
	// pull-through gets half of one (its writes are conditional, so
	// cutting one short is safe), then the mirror is served as it is.
	syncCtx, cancel := clock.WithTimeout(ctx, s.h.clock, s.h.cfg.KeepAlive/2)
	sync := s.h.cfg.Fleet.SyncRun
	if s.egress {
		sync = s.h.cfg.Fleet.SyncRunEgress
	}
	run, err := sync(syncCtx, s.run.FleetRunID)
	cancel()
	switch {
	case err == nil:
	case run.FleetRunID != "":
		// The host could not be asked: serve what the mirror has.
		s.h.log.DebugContext(ctx, "stream: pull-through failed", logRun, s.run.FleetRunID, logErr, err.Error())
	case ctx.Err() != nil:
		return endCanceled, true
	case errors.Is(err, store.ErrNotFound):
		// Reconnecting finds no run either (404), which ends an EventSource.
		if err := s.send([]byte(": the run no longer exists\n\n")); err != nil {
			return s.writeEnd(err), true
		}
		return endDeleted, true
	default:
		s.fault = err
		s.goodbye("the stream hit a fault; reconnect to resume")
		return endFault, true
	}
	s.run = run
	for {
		page, err := s.h.cfg.Fleet.MirroredEvents(ctx, run, s.cursor, s.h.cfg.PageSize)
		if err != nil {
			if ctx.Err() != nil {
				return endCanceled, true
			}
			s.fault = err
			s.goodbye("the stream hit a fault; reconnect to resume")
			return endFault, true
		}
		if len(page.Events) > 0 {
			var buf bytes.Buffer
			for _, e := range page.Events {
				buf.Write(frame(fleetapi.SSEEvent, s.id(e.Sequence, s.egressCursor), api.EventOf(e)))
			}
			if err := s.send(buf.Bytes()); err != nil {
				return s.writeEnd(err), true
			}
			s.cursor = page.NextCursor
			s.sent += len(page.Events)
			s.lastEvent = s.h.clock.Now()
		}
		if !page.HasMore {
			break
		}
	}
	if !run.Live() && s.cursor < run.EventCursor {
		// The loop ends short of the cursor only on a page that moved
		// nowhere: the run's remaining events are gone from the mirror
		// (expired, or a forced host delete half done). The run is over,
		// so nothing will bring them back; done still goes out.
		s.h.log.InfoContext(ctx, "stream: events gone from the mirror", logRun, run.FleetRunID,
			"from", s.cursor, "to", run.EventCursor)
		s.cursor = run.EventCursor
	}
	if s.egress {
		if reason, over := s.pollEgress(ctx); over {
			return reason, true
		}
	}
	if !s.snapshotSent {
		s.snapshotSent = true
		if err := s.send(frame(fleetapi.SSESnapshot, "", api.StreamSnapshotOf(run, s.cursor, s.egressCursorOf(), !s.isDone()))); err != nil {
			return s.writeEnd(err), true
		}
	}
	if s.isDone() {
		if err := s.send(frame(fleetapi.SSEDone, "", api.StreamDoneOf(run, s.cursor, s.egressCursorOf()))); err != nil {
			return s.writeEnd(err), true
		}
		return endDone, true
	}
	return 0, false
}

// pollEgress sends the ledger records the mirror holds beyond the egress
// cursor (up to the head's), after the poll's events. over reports the
// end.
func (s *session) pollEgress(ctx context.Context) (endReason, bool) {
	fl := s.h.cfg.Fleet
	head, err := fl.EgressHead(ctx, s.run)
	for err == nil {
		s.head = head
		var page fleet.EgressPage
		if page, err = fl.MirroredEgress(ctx, s.run, head, s.egressCursor, s.h.cfg.PageSize); err != nil {
			break
		}
		if len(page.Records) > 0 {
			var buf bytes.Buffer
			for _, r := range page.Records {
				buf.Write(frame(fleetapi.SSEEgress, s.id(s.cursor, r.Seq), api.EgressRecordOf(r)))
			}
			if err := s.send(buf.Bytes()); err != nil {
				return s.writeEnd(err), true
			}
			s.egressCursor = page.NextCursor
			s.egressSent += len(page.Records)
			s.lastEvent = s.h.clock.Now()
		}
		if !page.HasMore {
			if !s.run.Live() && s.egressCursor < head.Cursor {
				// As events gone from the mirror: a page that moved
				// nowhere on an ended run; done still goes out.
				s.h.log.InfoContext(ctx, "stream: egress records gone from the mirror", logRun, s.run.FleetRunID,
					"from", s.egressCursor, "to", head.Cursor)
				s.egressCursor = head.Cursor
			}
			return 0, false
		}
	}
	if ctx.Err() != nil {
		return endCanceled, true
	}
	s.fault = err
	s.goodbye("the stream hit a fault; reconnect to resume")
	return endFault, true
}

// id is a message's id: the event sequence, or on a stream with egress
// "<event seq>:<ledger seq>".
func (s *session) id(events, ledger int64) string {
	if !s.egress {
		return strconv.FormatInt(events, 10)
	}
	return strconv.FormatInt(events, 10) + ":" + strconv.FormatInt(ledger, 10)
}

// egressCursorOf is the ledger cursor the snapshot, done and idle data
// carry: nil on a stream without egress.
func (s *session) egressCursorOf() *int64 {
	if !s.egress {
		return nil
	}
	c := s.egressCursor
	return &c
}

// renew extends the stream's slot when due. A slot another stream took
// (this one's lapsed: renewals failed for a whole LeaseTTL) ends the
// stream with a retry hint; a failed renewal is retried at the next poll
// while the lease still runs.
func (s *session) renew(ctx context.Context, now time.Time) (endReason, bool) {
	if s.lease == nil || now.Before(s.renewAt) {
		return 0, false
	}
	next := *s.lease
	next.ExpiresAt = now.Add(s.h.cfg.LeaseTTL)
	err := s.h.cfg.Leases.RenewStreamLease(ctx, next)
	switch {
	case err == nil:
		s.lease.ExpiresAt = store.RoundExpiry(next.ExpiresAt)
		s.renewAt = now.Add(s.h.cfg.LeaseTTL / 3)
		return 0, false
	case ctx.Err() != nil:
		return endCanceled, true
	case errors.Is(err, store.ErrExists) || store.Expired(s.lease.ExpiresAt, now):
		s.h.log.WarnContext(ctx, "stream: its slot lapsed", logRun, s.run.FleetRunID, logOwner, s.caller.OwnerID, logErr, err.Error())
		if err := s.goodbye("the stream lost its slot; reconnect to resume"); err != nil {
			return s.writeEnd(err), true
		}
		return endLeaseLost, true
	}
	s.h.log.WarnContext(ctx, "stream: renewing its slot failed; retrying", logRun, s.run.FleetRunID, logErr, err.Error())
	s.renewAt = now.Add(s.h.cfg.PollInterval)
	return 0, false
}

// release frees the stream's slot, even when ctx has ended (the client
// gone): a slot left behind would hold the caller's cap for a LeaseTTL.
func (s *session) release(ctx context.Context) {
	if s.lease == nil {
		return
	}
	rctx, cancel := clock.WithTimeout(context.WithoutCancel(ctx), s.h.clock, 5*time.Second)
	defer cancel()
	if err := s.h.cfg.Leases.ReleaseStreamLease(rctx, *s.lease); err != nil {
		s.h.log.WarnContext(ctx, "stream: releasing its slot failed (it lapses by itself)", logRun, s.run.FleetRunID, logErr, err.Error())
	}
	s.lease = nil
}

// idleEnd tells the client that the run has been quiet for IdleTimeout
// and how to resume: the idle event (id: the cursor, which EventSource
// sends back as Last-Event-ID), then the retry hint.
func (s *session) idleEnd() error {
	h := s.h
	id := s.id(s.cursor, s.egressCursor)
	data := api.StreamIdleOf(s.run, s.cursor, s.egressCursorOf(), h.cfg.IdleTimeout, h.cfg.IdleRetry)
	if err := s.send(frame(fleetapi.SSEIdle, id, data)); err != nil {
		return err
	}
	why := fmt.Sprintf("no new event for %s: reconnect with Last-Event-ID: %s (or %s) to resume", h.cfg.IdleTimeout, id, data.Resume)
	return s.send([]byte(": " + why + "\nretry: " + strconv.FormatInt(h.cfg.IdleRetry.Milliseconds(), 10) + "\n\n"))
}

// sleep waits d on the clock, or until ctx ends.
func (s *session) sleep(ctx context.Context, d time.Duration) {
	t := s.h.clock.NewTimer(d)
	defer t.Stop()
	if s.h.cfg.Parked != nil {
		s.h.cfg.Parked(ctx)
	}
	select {
	case <-t.C():
	case <-ctx.Done():
	}
}

// send writes p, cutting the client off when the write does not complete
// within WriteTimeout.
func (s *session) send(p []byte) error {
	var cut atomic.Bool
	watchdog := s.h.clock.AfterFunc(s.h.cfg.WriteTimeout, func() {
		cut.Store(true)
		s.sink.Abort()
	})
	err := s.sink.Write(p)
	if fired := !watchdog.Stop(); fired || cut.Load() {
		return errCutOff // the sink is (or is about to be) aborted
	}
	if err == nil {
		s.lastWrite = s.h.clock.Now()
	}
	return err
}

// goodbye sends the retry hint before a planned end, with why as a comment.
func (s *session) goodbye(why string) error {
	ms := strconv.FormatInt(s.h.cfg.Retry.Milliseconds(), 10)
	return s.send([]byte(": " + why + "\nretry: " + ms + "\n\n"))
}

func (s *session) writeEnd(err error) endReason {
	if errors.Is(err, errCutOff) {
		return endCutOff
	}
	return endGone
}

// frame is one SSE message: its event name, its id when not empty, and
// data (a fleetapi type) as one line of JSON (JSON escapes newlines, so it
// cannot break the framing).
func frame(event, id string, data any) []byte {
	b, err := json.Marshal(data)
	if err != nil {
		// Events are JSON already (RawMessage data); the others are ours.
		b = []byte(`{"error":"unencodable"}`)
	}
	var buf bytes.Buffer
	buf.Grow(len(b) + 32)
	buf.WriteString("event: ")
	buf.WriteString(event)
	buf.WriteByte('\n')
	if id != "" {
		buf.WriteString("id: ")
		buf.WriteString(id)
		buf.WriteByte('\n')
	}
	buf.WriteString("data: ")
	buf.Write(b)
	buf.WriteString("\n\n")
	return buf.Bytes()
}
