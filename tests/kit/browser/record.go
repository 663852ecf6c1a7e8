package browser

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/tests/kit/await"
)

// Request is one request a page made, as its network record shows it. A
// redirect is two: the redirect's answer and the request that follows it.
type Request struct {
	URL    string
	Method string
	Type   string // the protocol's resource type: Document, Script, Stylesheet, Fetch, Image, ...
	Status int    // the answer's HTTP status; 0 before an answer or when there was none
	// Bytes is what the request transferred from the network, headers
	// and encoded (compressed) body, once it finished (encodedDataLength
	// of Network.loadingFinished; 0 when served from the cache).
	Bytes int64
	// Failed is why the request failed: chromium's error text (such as
	// net::ERR_NAME_NOT_RESOLVED) and, for a request the browser refused to
	// make, "blocked: " and why ("blocked: csp"); "" if it did not fail.
	Failed string
	Done   bool // it finished or failed
}

// Dialog is a JavaScript dialog a page opened (alert, confirm, prompt,
// beforeunload). The page dismisses each one (accepts a beforeunload, so
// a navigation goes on).
type Dialog struct {
	Type    string
	Message string
	URL     string
}

// LogEntry is a message a page's console showed.
type LogEntry struct {
	// Source is "console" for a console.* call, "exception" for an
	// uncaught exception, else the browser's own source: "security"
	// (a Content-Security-Policy violation), "network", "javascript",
	// "violation", ...
	Source string
	Level  string // "error", "warning", "info", "verbose"; a console call's own (log, error, warning, ...)
	Text   string
	URL    string
}

// event records one event of the page's session; it runs on the reader.
func (p *Page) event(method string, params json.RawMessage) {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.checkWatches()
	switch method {
	case "Page.lifecycleEvent":
		var e struct {
			LoaderID string `json:"loaderId"`
			Name     string `json:"name"`
		}
		if json.Unmarshal(params, &e) == nil && e.Name == "load" {
			p.loaded[e.LoaderID] = true
		}
	case "Page.javascriptDialogOpening":
		var e struct {
			Type    string `json:"type"`
			Message string `json:"message"`
			URL     string `json:"url"`
		}
		json.Unmarshal(params, &e)
		p.dialogs = append(p.dialogs, Dialog{Type: e.Type, Message: e.Message, URL: e.URL})
		p.b.sendAsync(p.session, "Page.handleJavaScriptDialog", map[string]any{"accept": e.Type == "beforeunload"})
	case "Network.requestWillBeSent":
		var e struct {
			RequestID string `json:"requestId"`
			Type      string `json:"type"`
			Request   struct {
				URL    string `json:"url"`
				Method string `json:"method"`
			} `json:"request"`
			RedirectResponse *struct {
				Status int `json:"status"`
			} `json:"redirectResponse"`
		}
		if json.Unmarshal(params, &e) != nil {
			return
		}
		if prev := p.inFlight[e.RequestID]; prev != nil && e.RedirectResponse != nil {
			prev.Status = e.RedirectResponse.Status
			prev.Done = true
		}
		r := &Request{URL: e.Request.URL, Method: e.Request.Method, Type: e.Type}
		p.requests = append(p.requests, r)
		p.inFlight[e.RequestID] = r
	case "Network.responseReceived":
		var e struct {
			RequestID string `json:"requestId"`
			Response  struct {
				Status int `json:"status"`
			} `json:"response"`
		}
		if json.Unmarshal(params, &e) == nil && p.inFlight[e.RequestID] != nil {
			p.inFlight[e.RequestID].Status = e.Response.Status
		}
	case "Network.loadingFinished":
		var e struct {
			RequestID         string  `json:"requestId"`
			EncodedDataLength float64 `json:"encodedDataLength"`
		}
		if json.Unmarshal(params, &e) == nil && p.inFlight[e.RequestID] != nil {
			r := p.inFlight[e.RequestID]
			r.Bytes = int64(e.EncodedDataLength)
			r.Done = true
			delete(p.inFlight, e.RequestID)
		}
	case "Network.loadingFailed":
		var e struct {
			RequestID     string `json:"requestId"`
			ErrorText     string `json:"errorText"`
			BlockedReason string `json:"blockedReason"`
		}
		if json.Unmarshal(params, &e) == nil && p.inFlight[e.RequestID] != nil {
			r := p.inFlight[e.RequestID]
			r.Failed = e.ErrorText
			if e.BlockedReason != "" {
				r.Failed = strings.TrimSpace(r.Failed + " blocked: " + e.BlockedReason)
			}
			r.Done = true
			delete(p.inFlight, e.RequestID)
		}
	case "Log.entryAdded":
		var e struct {
			Entry struct {
				Source string `json:"source"`
				Level  string `json:"level"`
				Text   string `json:"text"`
				URL    string `json:"url"`
			} `json:"entry"`
		}
		if json.Unmarshal(params, &e) == nil {
			p.logs = append(p.logs, LogEntry(e.Entry))
		}
	case "Runtime.consoleAPICalled":
		var e struct {
			Type string `json:"type"`
			Args []struct {
				Value       json.RawMessage `json:"value"`
				Description string          `json:"description"`
			} `json:"args"`
		}
		if json.Unmarshal(params, &e) != nil {
			return
		}
		var parts []string
		for _, a := range e.Args {
			var s string
			switch {
			case json.Unmarshal(a.Value, &s) == nil:
			case a.Description != "":
				s = a.Description
			default:
				s = string(a.Value)
			}
			parts = append(parts, s)
		}
		p.logs = append(p.logs, LogEntry{Source: "console", Level: e.Type, Text: strings.Join(parts, " ")})
	case "Runtime.exceptionThrown":
		var e struct {
			Details struct {
				Text      string `json:"text"`
				URL       string `json:"url"`
				Exception *struct {
					Description string `json:"description"`
				} `json:"exception"`
			} `json:"exceptionDetails"`
		}
		if json.Unmarshal(params, &e) != nil {
			return
		}
		text := e.Details.Text
		if e.Details.Exception != nil && e.Details.Exception.Description != "" {
			text += " " + e.Details.Exception.Description
		}
		p.logs = append(p.logs, LogEntry{Source: "exception", Level: "error", Text: text, URL: e.Details.URL})
	}
}

// Requests is every request the page has made so far, in the order it
// made them; one still under way has Done false.
func (p *Page) Requests() []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Request, len(p.requests))
	for i, r := range p.requests {
		out[i] = *r
	}
	return out
}

// WaitRequests waits until every request the page has made so far has
// finished or failed, then returns them as Requests does. A request that
// never ends (a stream the page follows) makes it fail the test: read
// Requests instead.
func (p *Page) WaitRequests(t testing.TB) []Request {
	t.Helper()
	done := p.wait(func() bool { return len(p.inFlight) == 0 })
	timer := time.NewTimer(await.Limit)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		var open []string
		p.mu.Lock()
		for _, r := range p.inFlight {
			open = append(open, r.Method+" "+r.URL)
		}
		p.mu.Unlock()
		t.Fatalf("browser: waiting for the page's requests to end: still under way after %s: %s", await.Limit, strings.Join(open, ", "))
	}
	return p.Requests()
}

// WaitLog waits until the page's console shows an entry match accepts
// and returns the first such entry; what names it in a failure. match
// runs on the protocol's reader with the page's record locked: it must not
// call the Page's methods.
func (p *Page) WaitLog(t testing.TB, what string, match func(LogEntry) bool) LogEntry {
	t.Helper()
	var found LogEntry
	await.Recv(t, what+" in the page's console", p.wait(func() bool {
		for _, e := range p.logs {
			if match(e) {
				found = e
				return true
			}
		}
		return false
	}))
	return found
}

// Dialogs is every dialog the page has opened so far.
func (p *Page) Dialogs() []Dialog {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Dialog(nil), p.dialogs...)
}

// Logs is every console message and uncaught exception so far, in order.
func (p *Page) Logs() []LogEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]LogEntry(nil), p.logs...)
}
