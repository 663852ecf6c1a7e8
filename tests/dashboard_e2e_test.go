package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/runfleet/runfleet/infra/localstack/demo"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/fleetclient"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/browser"
)

// The dashboard as a user's browser shows it: Debian's chromium, headless,
// driven by tests/kit/browser, against the local stack as `make dev` runs
// it (its real edge, its demo caller and admin tokens). One stack and one
// browser serve every step: the steps share the signed-in tab, and each
// leans on what the one before it left (a signed-in page, runs listed).

// updateScreenshotsEnv, set to 1 (`make screenshots`), makes the test
// write the README's screenshot, infra/dashboard.png, from the run page it
// captures; otherwise the committed file is checked.
const updateScreenshotsEnv = "RUNFLEET_UPDATE_SCREENSHOTS"

// readmeScreenshot is the screenshot README's Dashboard section shows,
// relative to tests/.
const readmeScreenshot = "../infra/dashboard.png"

// TestDashboardInABrowser signs in with the demo caller's token typed into
// the form, finds the local edge on the hosts page, sees runs the CLI
// dispatched appear, follows a run's output live while the run waits for
// its input, shows a run printing HTML and escapes as text with no script
// run, keeps a scoped caller to its own runs, loads within the issue's
// budget from the stack's origin alone, and screenshots every page.
func TestDashboardInABrowser(t *testing.T) {
	s := startDevStack(t, localStackBinary(t), "", devEnv(filepath.Join(t.TempDir(), "data"), ""), nil)
	admin, err := os.ReadFile(s.ready.AdminTokenFile)
	must(t, err)
	cli := newDashCLI(t, s.base())
	demoToken := s.callerToken()
	b := browser.Launch(t)
	shots := t.TempDir()
	ui := s.base() + "/ui"
	p := b.NewPage(t)

	t.Run("first load and sign in", func(t *testing.T) {
		p.Navigate(t, ui)
		p.WaitFor(t, `document.querySelector("#signin-form")`)
		firstLoad := p.WaitRequests(t)
		checkDashboardRequests(t, "the sign-in page's load", firstLoad, s.base())
		shoot(t, p, filepath.Join(shots, "signin.png"))

		p.SetValue(t, "#signin-token", demoToken)
		p.Click(t, "#signin-submit")
		// Signed in, the page shows the runs (its default view), read
		// with the token.
		p.WaitFor(t, `document.querySelector("#runs-table") && !document.querySelector("#nav").hidden`)
		all := p.WaitRequests(t)
		checkDashboardRequests(t, "the first load through signing in and the runs list", all, s.base())
		var kept struct{ Session, Local, Cookie string }
		p.Eval(t, `({Session: sessionStorage.getItem("runfleet.token") || "", Local: JSON.stringify(localStorage), Cookie: document.cookie})`, &kept)
		if kept.Session != demoToken || strings.Contains(kept.Local+kept.Cookie, demoToken) {
			t.Fatalf("the token is kept in sessionStorage %t, localStorage or a cookie %t", kept.Session == demoToken, strings.Contains(kept.Local+kept.Cookie, demoToken))
		}
	})

	t.Run("hosts", func(t *testing.T) {
		p.Click(t, "#nav-hosts")
		row := `document.querySelector('#hosts-table tr[data-host-id="local-edge"]')`
		// The probe's record comes with the stack's first probe.
		p.WaitFor(t, row+` && `+row+`.querySelector('td[data-col=agents]').textContent.includes("shell")`)
		var cells struct{ State, Probe string }
		p.Eval(t, `({State: `+row+`.querySelector('td[data-col=state]').textContent, Probe: `+row+`.querySelector('td[data-col=probe]').textContent})`, &cells)
		if cells.State != "enabled" || cells.Probe != "ok" {
			t.Errorf("local-edge's state reads %q and its probe %q, want enabled and ok", cells.State, cells.Probe)
		}
		shoot(t, p, filepath.Join(shots, "hosts.png"))
	})

	var demoRun string
	t.Run("a run the CLI dispatches appears, and its page shows it", func(t *testing.T) {
		p.Click(t, "#nav-runs")
		p.WaitFor(t, `document.querySelector("#runs-table")`)
		demoRun = cli.runDemo(t, demoToken, s)
		// The list refreshes itself every 10 s; a user's Refresh is sooner.
		p.Click(t, "#runs-refresh")
		rowSel := `#runs-table tr[data-run-id=` + jsonString(demoRun) + `]`
		p.WaitFor(t, `document.querySelector(`+jsonString(rowSel+` td[data-col=status] [data-status=succeeded]`)+`)`)
		var cells map[string]string
		p.Eval(t, `Object.fromEntries([...document.querySelectorAll(`+jsonString(rowSel+" td")+`)].map((td) => [td.dataset.col, td.textContent]))`, &cells)
		if cells["host"] != "local-edge" || cells["agent"] != demo.Agent || cells["owner"] != s.ready.Demo.Caller {
			t.Errorf("the run's row reads %v", cells)
		}
		shoot(t, p, filepath.Join(shots, "runs.png"))

		p.Click(t, rowSel+" a")
		p.WaitFor(t, `document.querySelector("#run-page").dataset.runId === `+jsonString(demoRun)+
			` && document.querySelector("#run-stream-state").dataset.state === "done"`+
			` && document.querySelector("#run-status").dataset.status === "succeeded"`+
			` && document.querySelector("#run-output").textContent.includes('the upstream answered: {"authorized": true}')`+
			` && document.querySelector('#run-events li[data-type=state]')`)
		shot := shoot(t, p, filepath.Join(shots, "run.png"))
		checkReadmeScreenshot(t, shot)
	})

	t.Run("a run's output arrives live", func(t *testing.T) {
		id := cli.dispatch(t, demoToken, demo.ShellAgent, `echo first-line; read x; echo "second: $x"; echo third-line`)
		p.Click(t, "#nav-runs")
		p.WaitFor(t, `document.querySelector("#runs-refresh")`)
		p.Click(t, "#runs-refresh")
		rowSel := `#runs-table tr[data-run-id=` + jsonString(id) + `]`
		p.WaitFor(t, `document.querySelector(`+jsonString(rowSel)+`)`)
		p.Click(t, rowSel+" a")
		output := `document.querySelector("#run-output").textContent`
		status := `document.querySelector("#run-status").dataset.status`
		// The first line, while the run waits for its input: the page
		// shows output as it comes, not once the run is over.
		p.WaitFor(t, `document.querySelector("#run-page").dataset.runId === `+jsonString(id)+` && `+output+`.includes("first-line\n") && `+status+` === "running"`)
		var shown struct{ Output, Status, Stream string }
		p.Eval(t, `({Output: `+output+`, Status: `+status+`, Stream: document.querySelector("#run-stream-state").dataset.state})`, &shown)
		if shown.Output != "first-line\n" || shown.Status != "running" || shown.Stream != "live" {
			t.Fatalf("before its input the run's page shows status %q, stream %q, output %q", shown.Status, shown.Stream, shown.Output)
		}
		cli.input(t, demoToken, id, "released")
		p.WaitFor(t, output+`.endsWith("second: released\nthird-line\n")`)
		p.WaitFor(t, status+` === "succeeded" && document.querySelector("#run-stream-state").dataset.state === "done"`)
		// All of it, as the run recorded it (the task's terminal ends its
		// lines with CRLF, and echoes its input), none lost or repeated.
		var final string
		p.Eval(t, output, &final)
		if want := strings.ReplaceAll(cli.logs(t, demoToken, id), "\r\n", "\n"); final != want {
			t.Errorf("the run's page shows the output %q; the run recorded %q", final, want)
		}
	})

	t.Run("output is text", func(t *testing.T) {
		const (
			img    = `<img src=x onerror=alert(1)>`
			script = `<script>alert(2)</script>`
		)
		id := cli.dispatch(t, demoToken, demo.ShellAgent, `printf '%s\n' '`+img+`' '`+script+`'; printf '\033[31mred-text\033[0m plain\n'`)
		// A new fragment: the same document routes to the run's page.
		p.Navigate(t, ui+"#/runs/"+url.PathEscape(id))
		p.WaitFor(t, `document.querySelector("#run-page").dataset.runId === `+jsonString(id)+` && document.querySelector("#run-stream-state").dataset.state === "done"`)
		var shown struct {
			Output   string
			Red      string
			Elements int
			Images   int
		}
		p.Eval(t, `(() => {
	const out = document.querySelector("#run-output");
	const red = out.querySelector("span.fg1");
	return {Output: out.textContent, Red: red ? red.textContent : "", Elements: out.querySelectorAll("img, script").length, Images: document.images.length};
})()`, &shown)
		if want := img + "\n" + script + "\nred-text plain\n"; shown.Output != want {
			t.Errorf("the run's output reads %q, want %q", shown.Output, want)
		}
		if shown.Red != "red-text" {
			t.Errorf("the red text is shown in a span.fg1 reading %q", shown.Red)
		}
		if shown.Elements != 0 || shown.Images != 0 {
			t.Errorf("the output made %d img or script elements; the page holds %d images", shown.Elements, shown.Images)
		}
		if d := p.Dialogs(); len(d) > 0 {
			t.Errorf("the page opened dialogs: %+v", d)
		}
		for _, r := range p.Requests() {
			if strings.HasSuffix(r.URL, "/x") {
				t.Errorf("the page requested %s: the output's img was loaded", r.URL)
			}
		}
	})

	t.Run("a scoped caller sees only its runs", func(t *testing.T) {
		adminClient, err := fleetclient.New(fleetclient.Options{BaseURL: s.base(), Token: strings.TrimSpace(string(admin))})
		must(t, err)
		minted, err := adminClient.MintCaller(context.Background(), fleetapi.MintCaller{
			OwnerID: "scoped-ui", AllowedHosts: &fleetapi.Scope{IDs: []string{"local-edge"}}, AllowedProjects: &fleetapi.Scope{IDs: []string{"acme"}},
		})
		must(t, err)
		own := cli.dispatch(t, minted.Token, demo.ShellAgent, "echo scoped")
		q := b.NewPage(t)
		q.Navigate(t, ui)
		q.SetValue(t, "#signin-token", minted.Token)
		q.Click(t, "#signin-submit")
		q.WaitFor(t, `document.querySelector('#runs-table tr[data-run-id=`+jsonString(own)+`]')`)
		var ids []string
		q.Eval(t, `[...document.querySelectorAll("#runs-table tr[data-run-id]")].map((tr) => tr.dataset.runId)`, &ids)
		if len(ids) != 1 || ids[0] != own {
			t.Errorf("the scoped caller's runs list holds %v, want its run %s alone (not the demo caller's %s)", ids, own, demoRun)
		}

		q.Navigate(t, ui+"#/runs/"+url.PathEscape(demoRun))
		q.WaitFor(t, `document.querySelector("#run-page").dataset.runId === `+jsonString(demoRun)+` && !document.querySelector("#error-banner").hidden`)
		var banner struct{ Status, Code, Text string }
		q.Eval(t, `(() => { const b = document.querySelector("#error-banner"); return {Status: b.dataset.status, Code: b.dataset.code, Text: b.textContent}; })()`, &banner)
		if banner.Status != "404" || banner.Code != fleet.CodeNotFound {
			t.Errorf("the other caller's run page shows the banner %+v, want the API's 404 %s", banner, fleet.CodeNotFound)
		}
		var leaked bool
		q.Eval(t, `document.querySelector("#run-output").textContent.includes("authorized")`, &leaked)
		if leaked {
			t.Error("the other caller's run output is on the page")
		}
		checkPageLogs(t, "the scoped caller's page", q)
	})

	checkPageLogs(t, "the demo caller's page", p)
	if d := p.Dialogs(); len(d) > 0 {
		t.Errorf("the page opened dialogs: %+v", d)
	}
	// In order, so the local edge removes what it set up (its nftables
	// table) and the stack's log ends cleanly.
	s.stop(t, syscall.SIGTERM)
}

// checkDashboardRequests holds a load to the budget: every request
// finished, to the stack's own origin, under 150 KiB transferred in all.
func checkDashboardRequests(t *testing.T, what string, reqs []browser.Request, origin string) {
	t.Helper()
	var total int64
	for _, r := range reqs {
		u, err := url.Parse(r.URL)
		if err != nil || u.Scheme+"://"+u.Host != origin {
			t.Errorf("%s: a request to another origin than %s: %s %s", what, origin, r.Method, r.URL)
		}
		if r.Failed != "" || r.Status >= 400 {
			t.Errorf("%s: %s %s answered %d, failed %q", what, r.Method, r.URL, r.Status, r.Failed)
		}
		total += r.Bytes
	}
	if total >= dashboardBudget {
		t.Errorf("%s transferred %d bytes in %d requests, over the budget of %d", what, total, len(reqs), dashboardBudget)
	}
	t.Logf("%s: %d requests, %d bytes transferred", what, len(reqs), total)
}

// checkPageLogs fails on a Content-Security-Policy violation, an uncaught
// exception or a console error the page showed.
func checkPageLogs(t *testing.T, what string, p *browser.Page) {
	t.Helper()
	for _, e := range p.Logs() {
		if e.Source == "security" || e.Source == "exception" || (e.Source == "console" && e.Level == "error") {
			t.Errorf("%s: %s %s: %s (%s)", what, e.Source, e.Level, e.Text, e.URL)
		}
	}
}

// shoot screenshots the page into path, checked to show something.
func shoot(t *testing.T, p *browser.Page, path string) []byte {
	t.Helper()
	shot := p.Screenshot(t, path)
	if err := browser.NonBlank(shot); err != nil {
		t.Fatalf("%s: %v", filepath.Base(path), err)
	}
	return shot
}

// checkReadmeScreenshot writes the run page's screenshot as the README's
// when updateScreenshotsEnv asks, and otherwise checks the committed one is
// a non-blank PNG of the page's size.
func checkReadmeScreenshot(t *testing.T, shot []byte) {
	t.Helper()
	if os.Getenv(updateScreenshotsEnv) == "1" {
		must(t, os.WriteFile(readmeScreenshot, shot, 0o644))
		t.Logf("wrote %s (%d bytes)", readmeScreenshot, len(shot))
		return
	}
	committed, err := os.ReadFile(readmeScreenshot)
	if err != nil {
		t.Fatalf("README's screenshot: %v (make screenshots writes it)", err)
	}
	if err := browser.NonBlank(committed); err != nil {
		t.Fatalf("%s: %v (make screenshots writes it again)", readmeScreenshot, err)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(committed))
	must(t, err)
	if ours, err := png.DecodeConfig(bytes.NewReader(shot)); err != nil || cfg.Width != ours.Width || cfg.Height != ours.Height {
		t.Errorf("%s is %dx%d; the page's screenshot is %dx%d (%v)", readmeScreenshot, cfg.Width, cfg.Height, ours.Width, ours.Height, err)
	}
}

// dashCLI is the runfleet binary as a user of the dashboard runs it from
// a terminal: configured by RUNFLEET_API and RUNFLEET_TOKEN alone (a home
// of its own, so no config file is read).
type dashCLI struct {
	bin, base, home string
}

func newDashCLI(t *testing.T, base string) *dashCLI {
	t.Helper()
	return &dashCLI{bin: commandBinary(t, "./shared/cli/runfleet"), base: base, home: t.TempDir()}
}

// run runs the CLI as the token's caller and returns its stdout; a
// failure (any exit but 0) fails the test with its stderr.
func (c *dashCLI) run(t *testing.T, token string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), await.Limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, args...)
	cmd.Env = append(cleanEnv(), "HOME="+c.home, "XDG_CONFIG_HOME="+filepath.Join(c.home, ".config"),
		"RUNFLEET_API="+c.base, "RUNFLEET_TOKEN="+token)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("runfleet %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return out
}

// dispatch starts a run of agent with prompt as the token's caller
// (runfleet run --detach) and returns its id.
func (c *dashCLI) dispatch(t *testing.T, token, agent, prompt string) string {
	t.Helper()
	out := c.run(t, token, "run", "--detach", "--json", "--agent", agent, "--", prompt)
	var run fleetapi.DispatchAnswer
	if err := json.Unmarshal(out, &run); err != nil || run.FleetRunID == "" {
		t.Fatalf("runfleet run --detach --json printed %s (%v)", out, err)
	}
	return run.FleetRunID
}

// runDemo runs the stack's demo (its agent, with the demo secret) with
// runfleet run, which follows it to its end, and returns the run's id.
func (c *dashCLI) runDemo(t *testing.T, token string, s *devStack) string {
	t.Helper()
	out := c.run(t, token, "run", "--json", "--agent", demo.Agent, "--secret", demo.Project+"/"+demo.Key+"="+demoDomain(t, s), "--", "hello")
	first, rest, _ := strings.Cut(string(out), "\n")
	var dispatched struct {
		Type string                  `json:"type"`
		Data fleetapi.DispatchAnswer `json:"data"`
	}
	if err := json.Unmarshal([]byte(first), &dispatched); err != nil || dispatched.Type != "dispatched" || dispatched.Data.FleetRunID == "" {
		t.Fatalf("runfleet run --json's first line is %s (%v)", first, err)
	}
	if !strings.Contains(rest, `"status":"succeeded"`) {
		t.Fatalf("runfleet run --json of the demo printed:\n%s", out)
	}
	return dispatched.Data.FleetRunID
}

// input types text and Enter to the run (runfleet runs input --newline).
func (c *dashCLI) input(t *testing.T, token, id, text string) {
	t.Helper()
	c.run(t, token, "runs", "input", "--newline", id, "--", text)
}

// logs is the run's output as runfleet runs logs prints it: as the run
// recorded it.
func (c *dashCLI) logs(t *testing.T, token, id string) string {
	t.Helper()
	return string(c.run(t, token, "runs", "logs", id))
}

// demoDomain is the demo upstream's name and port, which the demo secret
// is granted for.
func demoDomain(t *testing.T, s *devStack) string {
	t.Helper()
	u, err := url.Parse(s.ready.Demo.Upstream)
	must(t, err)
	return u.Host
}
