package dashboard_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/dashboard"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/tests/kit/browser"
)

// A run that waits, as a browser shows it: the dashboard's own page,
// assets and headers (its Content-Security-Policy included) on one
// origin with the API routes the page calls, whose answers are built
// from fleetapi's types: a run queued in its class, whose stream says
// queued until the test lets the run start, then brings its host's
// events to its end.

const runID = "fr-01jd3k2m4n5p6q7r8s9t0v1w2q"

type site struct {
	srv     *httptest.Server
	release chan struct{} // closed: the run has left the queue

	mu  sync.Mutex
	run fleetapi.Run
}

var (
	since   = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	started = since.Add(9 * time.Minute)
)

func newSite(t *testing.T) *site {
	t.Helper()
	dash, err := dashboard.New(dashboard.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := &site{release: make(chan struct{})}
	mux := http.NewServeMux()
	write := func(w http.ResponseWriter, a dashboard.Answer) {
		for k, v := range a.Headers {
			w.Header().Set(k, v)
		}
		if a.ContentType != "" {
			w.Header().Set("Content-Type", a.ContentType)
		}
		w.WriteHeader(a.Status)
		w.Write(a.Body)
	}
	mux.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) { write(w, dash.Page(r.Header.Get("If-None-Match"))) })
	mux.HandleFunc("GET /ui/{file}", func(w http.ResponseWriter, r *http.Request) {
		a, ok := dash.Asset(r.PathValue("file"), r.Header.Get("If-None-Match"))
		if !ok {
			http.NotFound(w, r)
			return
		}
		write(w, a)
	})
	mux.HandleFunc("GET /fleet/hosts", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, fleetapi.HostList{Hosts: []fleetapi.Host{}})
	})
	mux.HandleFunc("GET /fleet/runs", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, fleetapi.RunPage{Runs: []fleetapi.Run{s.current()}})
	})
	mux.HandleFunc("GET /fleet/runs/{id}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, fleetapi.RunAnswer{Run: s.current()})
	})
	mux.HandleFunc("GET /fleet/runs/{id}/egress", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, fleetapi.EgressPage{Records: []fleetapi.EgressRecord{}})
	})
	mux.HandleFunc("GET /fleet/runs/{id}/stream", s.stream)
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.srv.Close)
	base := s.srv.URL + "/fleet/runs/" + runID
	s.run = fleetapi.Run{FleetRunID: runID, OwnerID: "alice", Status: fleetapi.StatusQueued, Agent: "shell", CreatedAt: since, UpdatedAt: since,
		Links: fleetapi.RunLinks{Self: base, Events: base + "/events", Stream: base + "/stream", Egress: base + "/egress"},
		Queue: &fleetapi.RunQueue{Class: "shell?pool=a", Position: 2, Priority: 5, Since: since, Timeout: "30m", Until: since.Add(30 * time.Minute), WaitedSeconds: 60}}
	return s
}

func (s *site) current() fleetapi.Run {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.run
	q := *r.Queue
	r.Queue = &q
	return r
}

// stream is the run's stream: queued (a snapshot, then keep-alives) until
// release, then its host's events and the end. A connection that opens
// after release (the page's after a reconnection) resumes the same way.
func (s *site) stream(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	frame := func(event, id string, v any) {
		b, _ := json.Marshal(v)
		if id != "" {
			fmt.Fprintf(w, "id: %s\n", id)
		}
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
		w.(http.Flusher).Flush()
	}
	select {
	case <-s.release:
	default:
		frame(fleetapi.SSESnapshot, "", fleetapi.StreamSnapshot{Status: fleetapi.StatusQueued, Live: true})
		select {
		case <-s.release:
		case <-r.Context().Done():
			return
		}
	}
	ev := func(seq int64, typ string, data any) {
		b, _ := json.Marshal(data)
		frame(fleetapi.SSEEvent, fmt.Sprint(seq), fleetapi.Event{Sequence: seq, Type: typ, Data: b, TS: started})
	}
	ev(1, fleetapi.EventQueued, map[string]any{"since": since, "startedAt": started, "waitedMs": 540000, "hostId": "h1"})
	ev(2, fleetapi.EventState, map[string]any{"status": "admitted", "attempt": 1})
	ev(3, fleetapi.EventOutput, "hello from h1\n")
	ev(4, fleetapi.EventState, map[string]any{"status": "succeeded", "attempt": 1, "exitCode": 0})
	frame(fleetapi.SSEDone, "", fleetapi.StreamDone{Cursor: 4, Status: fleetapi.StatusSucceeded, Attempt: 1, ExitCode: new(int)})
}

// start lets the run leave the queue: a host took it and ran it.
func (s *site) start() {
	s.mu.Lock()
	zero := 0
	s.run.Status, s.run.HostID, s.run.ChildRunID, s.run.Attempt, s.run.ExitCode = fleetapi.StatusSucceeded, "h1", "run-1", 1, &zero
	s.run.Queue.Position, s.run.Queue.StartedAt, s.run.Queue.StartedOn, s.run.Queue.WaitedSeconds = 0, &started, "h1", 540
	s.mu.Unlock()
	close(s.release)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func js(s string) string { b, _ := json.Marshal(s); return string(b) }

// TestAQueuedRunInTheBrowser: the runs list shows a waiting run queued
// with its place; its page shows its place, since and until, follows its
// stream while it waits, and once a host took it shows its wait, its host
// and its output, with no policy violation or error on the page.
func TestAQueuedRunInTheBrowser(t *testing.T) {
	s := newSite(t)
	b := browser.Launch(t)
	p := b.NewPage(t)
	p.Navigate(t, s.srv.URL+"/ui")
	p.WaitFor(t, `document.querySelector("#signin-form")`)
	p.SetValue(t, "#signin-token", "rft_caller")
	p.Click(t, "#signin-submit")

	row := `#runs-table tr[data-run-id="` + runID + `"]`
	p.WaitFor(t, `document.querySelector(`+js(row+` td[data-col=status] [data-status=queued]`)+`)`)
	var place struct{ Position, Text, Host string }
	p.Eval(t, `(() => { const q = document.querySelector(`+js(row+` .queue-place`)+`);
	return {Position: q.dataset.queuePosition, Text: q.textContent, Host: document.querySelector(`+js(row+` td[data-col=host]`)+`).textContent}; })()`, &place)
	if place.Position != "2" || !strings.HasPrefix(place.Text, "#2 in shell?pool=a, since ") || !strings.Contains(place.Text, ", until ") || place.Host != "" {
		t.Errorf("the queued run's row reads %+v", place)
	}

	p.Click(t, row+" a")
	queue := `document.querySelector('#run-state dd[data-field=queue]')`
	p.WaitFor(t, `document.querySelector("#run-status") && document.querySelector("#run-status").dataset.status === "queued"`+
		` && document.querySelector("#run-stream-state").dataset.state === "live" && `+queue+` && !`+queue+`.hidden`)
	var waitingView struct{ Text, Since, Until, Position, Cancel string }
	p.Eval(t, `(() => { const q = `+queue+`;
	return {Text: q.textContent, Since: q.querySelector("[data-queue=since] time").getAttribute("datetime"),
		Until: q.querySelector("[data-queue=until] time").getAttribute("datetime"), Position: q.querySelector("[data-queue=position]").textContent,
		Cancel: String(document.querySelector("#run-cancel").disabled)}; })()`, &waitingView)
	if waitingView.Position != "position 2" || waitingView.Since != "2026-12-06T10:00:00Z" || waitingView.Until != "2026-12-06T10:30:00Z" ||
		!strings.Contains(waitingView.Text, "in shell?pool=a (priority 5), waiting since ") || !strings.HasSuffix(waitingView.Text, "(timeout 30m)") ||
		waitingView.Cancel != "false" {
		t.Errorf("the queued run's page reads %+v", waitingView)
	}

	s.start()
	p.WaitFor(t, `document.querySelector("#run-status").dataset.status === "succeeded" && document.querySelector("#run-stream-state").dataset.state === "done"`+
		` && `+queue+`.querySelector("[data-queue=started-on]")`)
	var startedView struct{ Text, Host, Output, Events string }
	p.Eval(t, `({Text: `+queue+`.textContent, Host: document.querySelector('#run-state dd[data-field=hostId]').textContent,
		Output: document.querySelector("#run-output").textContent,
		Events: [...document.querySelectorAll("#run-events li")].map((li) => li.dataset.type).join(",")})`, &startedView)
	if !strings.HasPrefix(startedView.Text, "waited 9m 0s in shell?pool=a (priority 5); started ") || !strings.HasSuffix(startedView.Text, " on h1") ||
		startedView.Host != "h1" || startedView.Output != "hello from h1\n" || startedView.Events != "queued,state,state" {
		t.Errorf("the run's page once it started reads %+v", startedView)
	}
	for _, e := range p.Logs() {
		if e.Source == "security" || e.Source == "exception" || (e.Source == "console" && e.Level == "error") {
			t.Errorf("the page logged %s %s: %s (%s)", e.Source, e.Level, e.Text, e.URL)
		}
	}
}
