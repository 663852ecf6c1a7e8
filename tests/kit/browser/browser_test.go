package browser

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/tests/kit/await"
)

// blobSize is the size of the page's uncompressible download, whose
// transfer the network record must count.
const blobSize = 20000

// site is a page's own server and another origin it calls.
type site struct {
	own, other *httptest.Server
}

func newSite(t *testing.T) site {
	t.Helper()
	other := http.NewServeMux()
	other.HandleFunc("/data", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Allow-Origin", "*")
		fmt.Fprint(w, "from the other origin")
	})
	other.HandleFunc("/pixel.png", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "image/png")
	})
	s := site{other: httptest.NewServer(other)}
	t.Cleanup(s.other.Close)

	blob := make([]byte, blobSize)
	rand.Read(blob)
	own := http.NewServeMux()
	own.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `<!doctype html><title>kit page</title>
<style>body { font: 16px sans-serif; } h1 { background: #246; color: #fff; padding: 8px; }</style>
<h1>The kit's page</h1>
<p id=status>waiting</p>
<input id=name> <button id=go onclick="document.querySelector('#out').textContent = 'hello ' + document.querySelector('#name').value">Go</button>
<p id=out></p>
<script>setTimeout(() => { document.querySelector("#status").textContent = "ready"; }, 300);</script>`)
	})
	own.HandleFunc("/fetches", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<!doctype html><p id=status>fetching</p><script>
(async () => {
	const other = await (await fetch(%q)).text();
	const blob = await (await fetch("/blob")).arrayBuffer();
	let outside = "reached";
	try { await fetch("http://example.com/"); } catch (e) { outside = "refused"; }
	document.querySelector("#status").textContent = other + "; " + blob.byteLength + " bytes; outside " + outside;
})();
</script>`, s.other.URL+"/data")
	})
	own.HandleFunc("/blob", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(blob)
	})
	own.HandleFunc("/csp", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'")
		fmt.Fprintf(w, `<!doctype html><p>strict</p><img src=%q><script>document.title = "inline ran";</script>`, s.other.URL+"/pixel.png")
	})
	own.HandleFunc("/blank", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `<!doctype html><body style="background: #fff"></body>`)
	})
	s.own = httptest.NewServer(own)
	t.Cleanup(s.own.Close)
	return s
}

// fatalRecorder is a testing.TB whose Fatalf records the message and ends
// its goroutine, as the real one does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// failure runs f with a recorder and returns what it failed with ("" if
// it did not).
func failure(t *testing.T, f func(tb testing.TB)) string {
	t.Helper()
	r := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	await.Recv(t, "the recorded call", done)
	return r.msg
}

func TestNavigateEvalWaitForAndForms(t *testing.T) {
	s := newSite(t)
	p := Launch(t).NewPage(t)
	p.Navigate(t, s.own.URL+"/")

	var title string
	p.Eval(t, "document.title", &title)
	if title != "kit page" {
		t.Fatalf("title = %q, want the page's", title)
	}
	var sum int
	p.Eval(t, "{ const a = 40; new Promise((resolve) => setTimeout(() => resolve(a + 2), 1)); }", &sum)
	if sum != 42 {
		t.Fatalf("awaited value = %d, want 42", sum)
	}
	if msg := failure(t, func(tb testing.TB) { p.Eval(tb, `throw new Error("boom")`, nil) }); !strings.Contains(msg, "Error: boom") {
		t.Fatalf("a thrown exception failed with %q, want its text", msg)
	}

	// The page's own timer changes the DOM 300 ms after load.
	var status string
	p.Eval(t, `document.querySelector("#status").textContent`, &status)
	if status != "waiting" {
		t.Fatalf("status before the timer = %q; the wait below would prove nothing", status)
	}
	p.WaitFor(t, `document.querySelector("#status").textContent === "ready"`)

	p.SetValue(t, "#name", "Ada")
	p.Click(t, "#go")
	p.WaitFor(t, `document.querySelector("#out").textContent === "hello Ada"`)

	msg := failure(t, func(tb testing.TB) {
		p.waitFor(tb, `document.querySelector("#missing").textContent === "x"`, 200*time.Millisecond)
	})
	for _, want := range []string{`#missing`, "not true in 200ms", "Cannot read properties of null", "The kit's page", "hello Ada"} {
		if !strings.Contains(msg, want) {
			t.Errorf("a wait that never came true failed with %q, want it to contain %q", msg, want)
		}
	}
}

func TestWaitForFollowsANavigation(t *testing.T) {
	s := newSite(t)
	p := Launch(t).NewPage(t)
	p.Navigate(t, s.own.URL+"/blank")
	p.Eval(t, fmt.Sprintf(`setTimeout(() => { location.href = %q; }, 100); true`, s.own.URL+"/"), nil)
	p.WaitFor(t, `document.querySelector("#status").textContent === "ready"`)
}

func TestDialogsAreRecordedAndDismissed(t *testing.T) {
	s := newSite(t)
	p := Launch(t).NewPage(t)
	p.Navigate(t, s.own.URL+"/")
	if d := p.Dialogs(); len(d) != 0 {
		t.Fatalf("dialogs before any = %v", d)
	}
	p.Eval(t, "alert(1)", nil)
	var confirmed bool
	p.Eval(t, `confirm("sure?")`, &confirmed)
	want := []Dialog{{Type: "alert", Message: "1", URL: s.own.URL + "/"}, {Type: "confirm", Message: "sure?", URL: s.own.URL + "/"}}
	if got := p.Dialogs(); !slices.Equal(got, want) {
		t.Fatalf("dialogs = %+v, want %+v", got, want)
	}
	if confirmed {
		t.Fatal("confirm() returned true: the dialog was accepted, not dismissed")
	}

	// A dialog the page opens on its own blocks it until it is answered.
	p.Eval(t, `setTimeout(() => { alert("from the page"); document.title = "answered"; }, 10); true`, nil)
	p.WaitFor(t, `document.title === "answered"`)
	if got := p.Dialogs(); len(got) != 3 || got[2].Message != "from the page" {
		t.Fatalf("dialogs = %+v, want the page's own third", got)
	}
}

func TestConsoleErrorsAndExceptionsAreRecorded(t *testing.T) {
	s := newSite(t)
	p := Launch(t).NewPage(t)
	p.Navigate(t, s.own.URL+"/")
	p.Eval(t, `console.error("it broke:", 42); setTimeout(() => { throw new Error("late failure"); }, 1); true`, nil)
	logged := p.WaitLog(t, "the console.error", func(e LogEntry) bool { return e.Source == "console" })
	if logged.Level != "error" || logged.Text != "it broke: 42" {
		t.Errorf("console entry = %+v, want an error reading \"it broke: 42\"", logged)
	}
	thrown := p.WaitLog(t, "the uncaught exception", func(e LogEntry) bool { return e.Source == "exception" })
	if thrown.Level != "error" || !strings.Contains(thrown.Text, "Error: late failure") {
		t.Errorf("exception entry = %+v, want the error's text", thrown)
	}
}

func TestTheNetworkRecordCountsEveryRequest(t *testing.T) {
	s := newSite(t)
	p := Launch(t).NewPage(t)
	p.Navigate(t, s.own.URL+"/fetches")
	p.WaitFor(t, `document.querySelector("#status").textContent.includes("outside")`)
	var status string
	p.Eval(t, `document.querySelector("#status").textContent`, &status)
	if want := fmt.Sprintf("from the other origin; %d bytes; outside refused", blobSize); status != want {
		t.Fatalf("the page says %q, want %q", status, want)
	}
	reqs := p.WaitRequests(t)
	byURL := map[string]Request{}
	var total int64
	for _, r := range reqs {
		byURL[r.URL] = r
		total += r.Bytes
		t.Logf("%+v", r)
	}
	doc, blob, other, outside := byURL[s.own.URL+"/fetches"], byURL[s.own.URL+"/blob"], byURL[s.other.URL+"/data"], byURL["http://example.com/"]
	if doc.Type != "Document" || doc.Status != 200 || doc.Bytes == 0 {
		t.Errorf("the document's record = %+v", doc)
	}
	// Bytes counts the headers too: a little over the body.
	if blob.Status != 200 || blob.Bytes < blobSize || blob.Bytes > blobSize+1000 || blob.Type != "Fetch" {
		t.Errorf("the blob's record = %+v, want status 200 and %d bytes and some headers", blob, blobSize)
	}
	if other.Status != 200 || other.Method != "GET" || other.Bytes == 0 {
		t.Errorf("the other origin's record = %+v, want it seen", other)
	}
	if !strings.Contains(outside.Failed, "ERR_NAME_NOT_RESOLVED") {
		t.Errorf("the request leaving the machine's record = %+v, want it refused by the resolver", outside)
	}
	if total < blobSize+doc.Bytes+other.Bytes {
		t.Errorf("total bytes %d, less than its parts", total)
	}
}

func TestACSPViolationIsRecorded(t *testing.T) {
	s := newSite(t)
	p := Launch(t).NewPage(t)
	p.Navigate(t, s.own.URL+"/csp")
	img := p.WaitLog(t, "the image's CSP violation", func(e LogEntry) bool {
		return strings.Contains(e.Text, "Content Security Policy") && strings.Contains(e.Text, s.other.URL)
	})
	script := p.WaitLog(t, "the inline script's CSP violation", func(e LogEntry) bool {
		return strings.Contains(e.Text, "Content Security Policy") && strings.Contains(e.Text, "inline script")
	})
	t.Logf("%+v\n%+v", img, script)
	reqs := p.WaitRequests(t)
	i := slices.IndexFunc(reqs, func(r Request) bool { return r.URL == s.other.URL+"/pixel.png" })
	if i < 0 || !strings.Contains(reqs[i].Failed, "csp") || reqs[i].Bytes != 0 {
		t.Fatalf("requests = %+v, want the image's failed, blocked by the policy, with nothing transferred", reqs)
	}
	var title string
	p.Eval(t, "document.title", &title)
	if title == "inline ran" {
		t.Fatal("the inline script ran despite the policy")
	}
}

func TestScreenshotsAreCheckedForContent(t *testing.T) {
	s := newSite(t)
	p := Launch(t).NewPage(t)
	dir := t.TempDir()
	p.Navigate(t, s.own.URL+"/")
	shot := p.Screenshot(t, filepath.Join(dir, "page.png"))
	if err := NonBlank(shot); err != nil {
		t.Fatalf("the kit's page: %v", err)
	}
	if onDisk, err := os.ReadFile(filepath.Join(dir, "page.png")); err != nil || !slices.Equal(onDisk, shot) {
		t.Fatalf("the file holds %d bytes (%v), want the %d returned", len(onDisk), err, len(shot))
	}
	p.Navigate(t, s.own.URL+"/blank")
	if err := NonBlank(p.Screenshot(t, filepath.Join(dir, "blank.png"))); err == nil || !strings.Contains(err.Error(), "blank") {
		t.Fatalf("NonBlank of a blank page = %v, want it refused", err)
	}
	if err := NonBlank([]byte("not a png")); err == nil {
		t.Fatal("NonBlank accepted bytes that are no PNG")
	}
}

func TestTheEndOfATestEndsChromium(t *testing.T) {
	goroutines := runtime.NumGoroutine()
	var b *Browser
	t.Run("browse", func(t *testing.T) {
		b = Launch(t)
		b.NewPage(t).Eval(t, "1", nil)
		// The fingerprint the check below relies on finds them all: the
		// browser, its zygotes, renderer and crash handler.
		if n := len(b.processes()); n < 6 {
			t.Fatalf("%d of chromium's processes found, want the browser and its helpers", n)
		}
	})
	if b.cmd.ProcessState == nil {
		t.Fatal("chromium was not waited on")
	}
	if _, err := os.Stat(b.dir); !os.IsNotExist(err) {
		t.Fatalf("the profile's dir is still there (%v)", err)
	}
	await.Cond(t, await.Limit, "every process chromium started to end", func() bool {
		return len(b.processes()) == 0
	})
	await.Cond(t, await.Limit, "the kit's goroutines to end", func() bool {
		return runtime.NumGoroutine() <= goroutines
	})
}
