package browser

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/tests/kit/await"
)

// The viewport of every page, in CSS pixels at scale 1.
const (
	viewportWidth  = 1280
	viewportHeight = 800
)

// bodyQuote bounds how much of a page's text a failed wait quotes.
const bodyQuote = 2000

// Page is one tab, attached over its own flat session. It records, from
// the moment NewPage returns, every request it makes, every dialog it
// opens and every console message and uncaught exception (Requests,
// Dialogs, Logs). Its methods are safe for concurrent use; the ones that
// take a testing.TB fail the test and belong on its goroutine.
type Page struct {
	b       *Browser
	session string

	mu       sync.Mutex
	loaded   map[string]bool     // loader ids whose load event has fired
	requests []*Request          // in the order they were sent
	inFlight map[string]*Request // by the protocol's request id
	dialogs  []Dialog
	logs     []LogEntry
	watches  map[*watch]struct{} // conditions waited on, checked on every event
}

// watch is a condition a caller waits on: cond runs under Page.mu after
// every event, and done is closed once it holds.
type watch struct {
	cond func() bool
	done chan struct{}
}

// NewPage opens a tab on about:blank, closed when the test ends.
func (b *Browser) NewPage(t testing.TB) *Page {
	t.Helper()
	var target struct {
		TargetID string `json:"targetId"`
	}
	if err := b.call("", "Target.createTarget", map[string]any{"url": "about:blank"}, &target); err != nil {
		t.Fatalf("browser: opening a page: %v", err)
	}
	var attached struct {
		SessionID string `json:"sessionId"`
	}
	if err := b.call("", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &attached); err != nil {
		t.Fatalf("browser: attaching to the page: %v", err)
	}
	p := &Page{
		b:        b,
		session:  attached.SessionID,
		loaded:   map[string]bool{},
		inFlight: map[string]*Request{},
		watches:  map[*watch]struct{}{},
	}
	b.mu.Lock()
	b.pages[p.session] = p
	b.mu.Unlock()
	t.Cleanup(func() {
		// Best effort: the browser's own cleanup may have run already.
		b.callWithin(closeGrace, "", "Target.closeTarget", map[string]any{"targetId": target.TargetID}, nil)
		b.mu.Lock()
		delete(b.pages, p.session)
		b.mu.Unlock()
	})
	for _, c := range []struct {
		method string
		params any
	}{
		// A known viewport, the same on every machine, for screenshots.
		{"Emulation.setDeviceMetricsOverride", map[string]any{"width": viewportWidth, "height": viewportHeight, "deviceScaleFactor": 1, "mobile": false}},
		{"Page.enable", nil},
		{"Page.setLifecycleEventsEnabled", map[string]any{"enabled": true}},
		{"Runtime.enable", nil},
		{"Log.enable", nil},
		{"Network.enable", nil},
	} {
		if err := p.call(c.method, c.params, nil); err != nil {
			t.Fatalf("browser: %v", err)
		}
	}
	return p
}

func (p *Page) call(method string, params, result any) error {
	return p.b.call(p.session, method, params, result)
}

// wait registers cond and returns a channel closed once it holds (at
// once if it holds already).
func (p *Page) wait(cond func() bool) <-chan struct{} {
	w := &watch{cond: cond, done: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	if cond() {
		close(w.done)
	} else {
		p.watches[w] = struct{}{}
	}
	return w.done
}

// checkWatches closes the channels of the conditions that now hold; the
// caller holds p.mu.
func (p *Page) checkWatches() {
	for w := range p.watches {
		if w.cond() {
			close(w.done)
			delete(p.watches, w)
		}
	}
}

// Navigate loads url in the page and returns once its load event has
// fired (its subresources loaded). A navigation chromium refuses (a
// connection refused, a name it does not resolve) fails the test.
func (p *Page) Navigate(t testing.TB, url string) {
	t.Helper()
	var nav struct {
		LoaderID  string `json:"loaderId"`
		ErrorText string `json:"errorText"`
	}
	if err := p.call("Page.navigate", map[string]any{"url": url}, &nav); err != nil {
		t.Fatalf("browser: navigating to %s: %v", url, err)
	}
	if nav.ErrorText != "" {
		t.Fatalf("browser: navigating to %s: %s", url, nav.ErrorText)
	}
	if nav.LoaderID == "" {
		return // a same-document navigation (a fragment): no load event
	}
	await.Recv(t, "the load event of "+url, p.wait(func() bool { return p.loaded[nav.LoaderID] }))
}

// evalResult is Runtime.evaluate's answer.
type evalResult struct {
	Result struct {
		Type  string          `json:"type"`
		Value json.RawMessage `json:"value"`
	} `json:"result"`
	ExceptionDetails *struct {
		Text      string `json:"text"`
		Exception *struct {
			Description string `json:"description"`
		} `json:"exception"`
	} `json:"exceptionDetails"`
}

func (r *evalResult) exception() string {
	d := r.ExceptionDetails
	if d.Exception != nil && d.Exception.Description != "" {
		return d.Exception.Description
	}
	return d.Text
}

// evaluate runs js in the page as a script, awaits the promise it
// evaluates to, if any, and returns the result by value.
func (p *Page) evaluate(limit time.Duration, js string) (*evalResult, error) {
	var r evalResult
	err := p.b.callWithin(limit, p.session, "Runtime.evaluate", map[string]any{
		"expression":    js,
		"awaitPromise":  true,
		"returnByValue": true,
		"userGesture":   true,
	}, &r)
	return &r, err
}

// Eval runs js in the page as a script (its value is the last
// statement's; a top-level let or const stays declared for later calls,
// so declare inside a block or function), awaits the promise it evaluates
// to, if any, and decodes its value (JSON-encodable) into out (nil:
// discard it). An exception, or an undefined value when out is not nil,
// fails the test.
func (p *Page) Eval(t testing.TB, js string, out any) {
	t.Helper()
	r, err := p.evaluate(await.Limit, js)
	if err != nil {
		t.Fatalf("browser: evaluating %s: %v", quoteJS(js), err)
	}
	if r.ExceptionDetails != nil {
		t.Fatalf("browser: evaluating %s: %s", quoteJS(js), r.exception())
	}
	if out == nil {
		return
	}
	if r.Result.Type == "undefined" {
		t.Fatalf("browser: evaluating %s: undefined, want a value", quoteJS(js))
	}
	if err := json.Unmarshal(r.Result.Value, out); err != nil {
		t.Fatalf("browser: evaluating %s: decoding %s: %v", quoteJS(js), r.Result.Value, err)
	}
}

// quoteJS is js as an error message quotes it: bounded.
func quoteJS(js string) string {
	const most = 200
	if len(js) > most {
		js = js[:most] + "…"
	}
	return fmt.Sprintf("%q", js)
}

// waitJS evaluates to a promise that resolves once the expression %[1]s
// is truthy, re-checking it on every DOM mutation and every few
// milliseconds (a condition on state the DOM does not show), or with
// ok false after %[2]d ms. An expression that throws counts as false (an
// element not there yet); the last exception is reported.
const waitJS = `new Promise((resolve) => {
	const cond = () => (%[1]s);
	let last = "";
	const holds = () => {
		try { return !!cond(); } catch (e) { last = String(e); return false; }
	};
	if (holds()) { resolve({ok: true}); return; }
	const finish = (ok) => {
		obs.disconnect(); clearInterval(poll); clearTimeout(timer);
		resolve({ok, last});
	};
	const obs = new MutationObserver(() => { if (holds()) finish(true); });
	obs.observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
	const poll = setInterval(() => { if (holds()) finish(true); }, 10);
	const timer = setTimeout(() => finish(false), %[2]d);
})`

// WaitFor waits, without polling from Go, until the JavaScript expression
// cond is truthy in the page (an expression that throws counts as false),
// for at most tests/kit/await's Limit. On timeout it fails naming cond
// and quoting the page's text. A navigation during the wait restarts it in
// the new document.
func (p *Page) WaitFor(t testing.TB, cond string) {
	t.Helper()
	p.waitFor(t, cond, await.Limit)
}

func (p *Page) waitFor(t testing.TB, cond string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		left := time.Until(deadline)
		if left < 0 {
			left = 0
		}
		// The page's own timer ends the wait; the call's bound is a
		// backstop for a page that no longer runs timers.
		r, err := p.evaluate(left+10*time.Second, fmt.Sprintf(waitJS, cond, left.Milliseconds()))
		if err != nil && navigatedAway(err) && time.Now().Before(deadline) {
			continue
		}
		if err != nil {
			t.Fatalf("browser: waiting for %s: %v", cond, err)
		}
		if r.ExceptionDetails != nil {
			t.Fatalf("browser: waiting for %s: %s", cond, r.exception())
		}
		var v struct {
			OK   bool   `json:"ok"`
			Last string `json:"last"`
		}
		if err := json.Unmarshal(r.Result.Value, &v); err != nil {
			t.Fatalf("browser: waiting for %s: decoding %s: %v", cond, r.Result.Value, err)
		}
		if v.OK {
			return
		}
		why := ""
		if v.Last != "" {
			why = " (it last threw " + v.Last + ")"
		}
		t.Fatalf("browser: waiting for %s: not true in %s%s; the page reads:\n%s", cond, limit, why, p.bodyText())
	}
}

// navigatedAway reports whether an evaluation ended because its document
// went away.
func navigatedAway(err error) bool {
	s := err.Error()
	return strings.Contains(s, "Execution context was destroyed") || strings.Contains(s, "Inspected target navigated or closed")
}

// bodyText is the page's visible text, bounded, for a failure message.
func (p *Page) bodyText() string {
	r, err := p.evaluate(10*time.Second, `document.body ? document.body.innerText : "(no body)"`)
	if err != nil {
		return "(unreadable: " + err.Error() + ")"
	}
	var s string
	if json.Unmarshal(r.Result.Value, &s) != nil {
		return "(unreadable: " + string(r.Result.Value) + ")"
	}
	if rs := []rune(s); len(rs) > bodyQuote {
		s = string(rs[:bodyQuote]) + "…"
	}
	return s
}

// SetValue sets the value of the form field selector finds (a CSS
// selector) as typing would, firing its input and change events.
func (p *Page) SetValue(t testing.TB, selector, value string) {
	t.Helper()
	p.Eval(t, fmt.Sprintf(`(() => {
	const el = document.querySelector(%[1]s);
	if (!el) throw new Error("nothing matches " + %[1]s);
	el.focus();
	el.value = %[2]s;
	el.dispatchEvent(new Event("input", {bubbles: true}));
	el.dispatchEvent(new Event("change", {bubbles: true}));
})()`, jsString(selector), jsString(value)), nil)
}

// Click clicks the element selector finds, as element.click() does (a
// button submits its form).
func (p *Page) Click(t testing.TB, selector string) {
	t.Helper()
	p.Eval(t, fmt.Sprintf(`(() => {
	const el = document.querySelector(%[1]s);
	if (!el) throw new Error("nothing matches " + %[1]s);
	el.click();
})()`, jsString(selector)), nil)
}

// jsString is s as a JavaScript string literal (JSON's, which Go's encoder
// also makes safe from U+2028 and U+2029).
func jsString(s string) string {
	data, _ := json.Marshal(s) // a string always encodes
	return string(data)
}

// Screenshot captures the page's viewport as a PNG, writes it to path and
// returns it (check it with NonBlank).
func (p *Page) Screenshot(t testing.TB, path string) []byte {
	t.Helper()
	var shot struct {
		Data string `json:"data"`
	}
	if err := p.call("Page.captureScreenshot", map[string]any{"format": "png"}, &shot); err != nil {
		t.Fatalf("browser: screenshot: %v", err)
	}
	png, err := base64.StdEncoding.DecodeString(shot.Data)
	if err != nil {
		t.Fatalf("browser: screenshot: decoding: %v", err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatalf("browser: screenshot: %v", err)
	}
	return png
}
