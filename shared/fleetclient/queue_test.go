package fleetclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/fleetclient"
)

// These tests speak the API over a real HTTP server with answers built
// from fleetapi's types: what a run that waits looks like on the wire.

func newClient(t *testing.T, srv *httptest.Server) *fleetclient.Client {
	t.Helper()
	c, err := fleetclient.New(fleetclient.Options{BaseURL: srv.URL, Token: "tok", HTTPClient: srv.Client(),
		Wait: func(ctx context.Context, _ time.Duration) error { return ctx.Err() }})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// A dispatch that waits is answered 202 with the run queued: the client
// returns that answer, with no error, and sent the wait as asked.
func TestDispatchOfARunThatWaitsIsItsAnswer(t *testing.T) {
	since := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	answer := fleetapi.DispatchAnswer{FleetRunID: "fr-1", Status: fleetapi.StatusQueued,
		Links: fleetapi.RunLinks{Self: "/fleet/runs/fr-1", Stream: "/fleet/runs/fr-1/stream"},
		Queue: &fleetapi.RunQueue{Class: "claude?pool=gpu", Position: 3, Priority: 10, Since: since, Timeout: "30m", Until: since.Add(30 * time.Minute)}}
	var got fleetapi.DispatchRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/fleet/runs" {
			http.NotFound(w, r)
			return
		}
		json.NewDecoder(r.Body).Decode(&got)
		writeJSON(w, http.StatusAccepted, answer)
	}))
	defer srv.Close()
	d, err := newClient(t, srv).Dispatch(context.Background(), fleetapi.DispatchRequest{Agent: "claude",
		Labels: map[string]string{"pool": "gpu"}, Queue: &fleetapi.QueueRequest{Timeout: "30m", Priority: 10}})
	if err != nil {
		t.Fatalf("a queued dispatch returned %v", err)
	}
	if d.HTTPStatus != http.StatusAccepted || !d.Queued() || !reflect.DeepEqual(d.DispatchAnswer, answer) {
		t.Fatalf("the dispatch answered %d %+v (queued %v), want 202 %+v", d.HTTPStatus, d.DispatchAnswer, d.Queued(), answer)
	}
	if got.Queue == nil || *got.Queue != (fleetapi.QueueRequest{Timeout: "30m", Priority: 10}) || got.Idempotency == "" {
		t.Fatalf("the API got %+v, want the wait as asked and a key", got)
	}
}

// Capacity reads GET /fleet/capacity as the API answers it.
func TestCapacity(t *testing.T) {
	want := fleetapi.Capacity{At: time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC), Classes: []fleetapi.ClassCapacity{
		{Class: "claude?pool=gpu", Agent: "claude", Labels: map[string]string{"pool": "gpu"}, Queued: 4, OldestWaitSeconds: 95, BusySlots: 8, Hosts: 2, DrainingHosts: 1},
		{Class: "shell", Agent: "shell", FreeSlots: 3, Hosts: 1},
	}}
	var auth string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/fleet/capacity" {
			http.NotFound(w, r)
			return
		}
		auth = r.Header.Get("Authorization")
		writeJSON(w, http.StatusOK, want)
	}))
	defer srv.Close()
	got, err := newClient(t, srv).Capacity(context.Background())
	if err != nil || !reflect.DeepEqual(got, want) || auth != "Bearer tok" {
		t.Fatalf("Capacity = %+v, %v (auth %q); want %+v", got, err, auth, want)
	}
}

// A queued run's stream says queued and may stay silent past its idle
// end: Follow goes on, reconnecting where it left, until the run has
// started and ended, and hands every message on once.
func TestFollowGoesOnWhileTheRunIsQueued(t *testing.T) {
	var mu sync.Mutex
	var resumes []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		resumes = append(resumes, r.Header.Get("Last-Event-ID"))
		n := len(resumes)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		frame := func(event, id string, v any) {
			b, _ := json.Marshal(v)
			if id != "" {
				fmt.Fprintf(w, "id: %s\n", id)
			}
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
		}
		switch n {
		case 1, 2:
			// Queued: nothing happens until the idle end.
			frame(fleetapi.SSESnapshot, "", fleetapi.StreamSnapshot{Status: fleetapi.StatusQueued, Live: true})
			frame(fleetapi.SSEIdle, "0", fleetapi.StreamIdle{Status: fleetapi.StatusQueued, IdleSeconds: 300, RetryMs: 30000})
		default:
			queued, _ := json.Marshal(map[string]any{"since": "2026-12-06T10:00:00Z", "startedAt": "2026-12-06T10:09:00Z", "waitedMs": 540000, "hostId": "h1"})
			frame(fleetapi.SSEEvent, "1", fleetapi.Event{Sequence: 1, Type: fleetapi.EventQueued, Data: queued})
			frame(fleetapi.SSEEvent, "2", fleetapi.Event{Sequence: 2, Type: fleetapi.EventOutput, Data: json.RawMessage(`"hi\n"`)})
			frame(fleetapi.SSESnapshot, "", fleetapi.StreamSnapshot{Cursor: 2, Status: fleetapi.StatusRunning, Attempt: 1, Live: true})
			frame(fleetapi.SSEDone, "", fleetapi.StreamDone{Cursor: 2, Status: fleetapi.StatusSucceeded, Attempt: 1, ExitCode: new(int)})
		}
	}))
	defer srv.Close()
	var seen []string
	res, err := newClient(t, srv).Follow(context.Background(), srv.URL+"/fleet/runs/fr-1/stream", fleetclient.FollowOptions{},
		func(ev fleetclient.StreamEvent) error {
			what := ev.Type
			switch {
			case ev.Event != nil:
				what += ":" + ev.Event.Type
			case ev.Snapshot != nil:
				what += ":" + ev.Snapshot.Status
			case ev.Idle != nil:
				what += ":" + ev.Idle.Status
			}
			seen = append(seen, what)
			return nil
		})
	if err != nil || res.Done.Status != fleetapi.StatusSucceeded {
		t.Fatalf("Follow = %+v, %v; want the run's end", res, err)
	}
	want := "snapshot:queued idle:queued snapshot:queued idle:queued event:queued event:output snapshot:running"
	if got := strings.Join(seen, " "); got != want {
		t.Fatalf("handed on %q, want %q", got, want)
	}
	if got := strings.Join(resumes, ","); got != ",0,0" {
		t.Fatalf("connections resumed from %q, want the idle message's id each time", got)
	}
}

// A refusal of the capacity route (a caller's token: admin only) is the
// API's error.
func TestCapacityRefusedIsTheAPIsError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		writeJSON(w, http.StatusForbidden, fleetapi.Error{Code: "admin_required", Error: "this route is for the admin token"})
	}))
	defer srv.Close()
	_, err := newClient(t, srv).Capacity(context.Background())
	var apiErr *fleetclient.Error
	if !fleetclient.IsCode(err, "admin_required") || !errors.As(err, &apiErr) || apiErr.Status != http.StatusForbidden {
		t.Fatalf("Capacity = %v, want the 403 admin_required", err)
	}
}
