package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/fleetclient"
	"github.com/runfleet/runfleet/shared/runspec"
)

func runCmd() *command {
	return &command{
		name: "run", summary: "Dispatch a run and follow its output to the end",
		args: "-- PROMPT...", maxArgs: -1,
		long: "Dispatches a run (POST /fleet/runs), then follows its stream at once: the task's output goes to\n" +
			"stdout as the task printed it, and runfleet exits with the task's exit code (1 when it failed\n" +
			"without one, 2 when the dispatch was refused, with the reason on stderr). The PROMPT words are\n" +
			"joined with one space. Ctrl-C detaches and says how to follow again; with\n" +
			"--cancel-on-interrupt it cancels the run instead. A --secret names a key of a project and the\n" +
			"domains it may reach: project/KEY=domain[,domain...].\n" +
			"With --queue, a run no eligible host has room for now waits up to that long for one (first in,\n" +
			"first out among runs for the same agent and labels; --priority goes ahead): runfleet says its\n" +
			"place and follows it until it starts and ends; one that never starts exits 2 (queue_timeout).\n" +
			"--queue 0s never waits, whatever Fleet's default (RUNFLEET_QUEUE_TIMEOUT).",
		examples: []string{
			"runfleet run --agent shell -- echo hello",
			"# the local stack's demo: a task using a secret it never sees",
			"runfleet run --agent demo --secret demo/DEMO_API_KEY=api.demo.test:7443 -- hello",
			"# on a host labelled gpu=true, working on a repository, without following",
			"runfleet run --agent claude --label gpu=true --repo acme/app --detach -- 'fix the flaky test'",
			"# wait up to 30 minutes for a host with room, ahead of runs of a lower priority",
			"runfleet run --agent claude --label gpu=true --queue 30m --priority 10 -- 'review the release'",
			"# JSON lines for a script: dispatched, then each stream message",
			"runfleet run --agent shell --json -- 'exit 3' | jq -c 'select(.type == \"done\")'",
		},
		setup: func(fs *flagSet) func(*invocation) int {
			var o runOptions
			o.agent = fs.String("agent", "NAME", "the agent to run (an entry of the host's agent table)")
			o.repo = fs.String("repo", "REPO", "the repository the run works on")
			o.labels = fs.List("label", "KEY=VALUE", "a label the host must carry")
			o.host = fs.String("host", "ID", "run on this host only")
			o.secrets = fs.List("secret", "PROJECT/KEY=DOMAIN,...", "a key the run may use, toward these domains")
			o.env = fs.List("env", "NAME=VALUE", "a variable added to the task's environment")
			o.key = fs.String("idempotency-key", "KEY", "dispatch at most once per key (default: a fresh key, reused on retries)")
			o.queue = fs.String("queue", "DURATION", "wait up to DURATION (30m, 1h) for an eligible host with room; 0s never waits (default: Fleet's)")
			o.priority = fs.String("priority", "N", "with --queue: go ahead of waiting runs of a lower priority (-100 to 100; default 0)")
			o.detach = fs.Bool("detach", "print the dispatched run and exit, without following it")
			o.cancel = fs.Bool("cancel-on-interrupt", "on Ctrl-C cancel the run instead of detaching from it")
			o.json = fs.Bool("json", "print JSON lines: the dispatch answer, then each stream message")
			return func(inv *invocation) int { return inv.run(o) }
		},
	}
}

type runOptions struct {
	agent, repo, host, key *string
	queue, priority        *string
	labels, secrets, env   *[]string
	detach, cancel, json   *bool
}

// dispatchRequest checks the flags locally (before any call) and builds
// the dispatch; its errors are usage errors naming the flag and the fix.
func (o runOptions) dispatchRequest(prompt []string) (fleetapi.DispatchRequest, error) {
	r := fleetapi.DispatchRequest{Agent: *o.agent, Repository: *o.repo, Host: *o.host, Idempotency: *o.key,
		Prompt: strings.Join(prompt, " ")}
	if r.Agent == "" {
		return r, usagef("--agent is required: name the agent to run, e.g. --agent shell")
	}
	var err error
	if r.Labels, err = pairs("--label", "KEY=VALUE", "gpu=true", *o.labels, false); err != nil {
		return r, err
	}
	if r.Env, err = pairs("--env", "NAME=VALUE", "DEBUG=1", *o.env, true); err != nil {
		return r, err
	}
	for _, s := range *o.secrets {
		sec, err := parseSecret(s)
		if err != nil {
			return r, err
		}
		r.Secrets = append(r.Secrets, sec)
	}
	r.Queue, err = o.queueRequest()
	return r, err
}

// The range of a queued run's priority, as fleetapi.QueueRequest states it.
const minPriority, maxPriority = -100, 100

// queueRequest is the dispatch's queue, nil when neither flag is given
// (Fleet's default applies). It refuses here what Fleet would: a duration
// that is not one, a priority out of range, a wait for a named host.
func (o runOptions) queueRequest() (*fleetapi.QueueRequest, error) {
	if *o.queue == "" {
		if *o.priority != "" {
			return nil, usagef("--priority orders the runs that wait for a host: give --queue too, e.g. --queue 30m --priority %s", quoteKey(*o.priority))
		}
		return nil, nil
	}
	if d, err := time.ParseDuration(*o.queue); err != nil || d < 0 {
		return nil, usagef("--queue %s: want how long to wait, e.g. --queue 30m or --queue 1h30m (0s never waits)", quoteKey(*o.queue))
	}
	if *o.host != "" {
		return nil, usagef("--queue with --host: a run that names its host does not wait; route by --label instead, or drop --queue")
	}
	q := &fleetapi.QueueRequest{Timeout: *o.queue}
	if *o.priority != "" {
		n, err := strconv.Atoi(*o.priority)
		if err != nil || n < minPriority || n > maxPriority {
			return nil, usagef("--priority %s: want a whole number from %d to %d (higher goes first)", quoteKey(*o.priority), minPriority, maxPriority)
		}
		q.Priority = n
	}
	return q, nil
}

// pairs reads repeated KEY=VALUE flags into a map; a pair without "=" or
// a key given twice is refused, and an empty value unless allowed (an
// env variable may be empty, a label not). Only the key is quoted: an env
// value may be a secret.
func pairs(flag, shape, example string, list []string, emptyOK bool) (map[string]string, error) {
	if len(list) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, p := range list {
		k, v, ok := strings.Cut(p, "=")
		switch {
		case !ok:
			return nil, usagef("%s %s: want %s, e.g. %s %s", flag, quoteKey(k), shape, flag, example)
		case k == "":
			return nil, usagef("%s: a pair with no name before =: want %s, e.g. %s %s", flag, shape, flag, example)
		case v == "" && !emptyOK:
			return nil, usagef("%s %s=: an empty value: give one, or omit the flag", flag, quoteKey(k))
		}
		if _, dup := m[k]; dup {
			return nil, usagef("%s %s is given twice", flag, quoteKey(k))
		}
		m[k] = v
	}
	return m, nil
}

// quoteKey quotes a flag's key part when it is short enough to be a name;
// a long one (a value pasted without its name) is not repeated.
func quoteKey(k string) string {
	if len(k) > 64 {
		return "(a value of " + fmt.Sprint(len(k)) + " characters)"
	}
	return fmt.Sprintf("%q", k)
}

// parseSecret reads --secret project/KEY=domain[,domain...] into the
// run's secret. Fleet refuses a secret with no domain, so it is refused
// here first, with the flag's shape.
func parseSecret(s string) (runspec.Secret, error) {
	const shape = "want PROJECT/KEY=DOMAIN[,DOMAIN...], e.g. --secret demo/DEMO_API_KEY=api.demo.test:7443"
	name, domains, hasDomains := strings.Cut(s, "=")
	project, key, ok := strings.Cut(name, "/")
	switch {
	case !ok || project == "" || key == "" || strings.Contains(key, "/"):
		return runspec.Secret{}, usagef("--secret %s: %s", quoteKey(name), shape)
	case !hasDomains || strings.TrimSpace(domains) == "":
		return runspec.Secret{}, usagef("--secret %s: name the domains the key may reach: %s", quoteKey(name), shape)
	}
	sec := runspec.Secret{ProjectID: project, Key: key}
	for _, d := range strings.Split(domains, ",") {
		if d = strings.TrimSpace(d); d == "" {
			return runspec.Secret{}, usagef("--secret %s: an empty domain in the list: %s", quoteKey(name), shape)
		}
		sec.Domains = append(sec.Domains, d)
	}
	return sec, nil
}

func (inv *invocation) run(o runOptions) int {
	req, err := o.dispatchRequest(inv.args)
	if err != nil {
		return inv.usage(inv.path, err)
	}
	if err := inv.connect(); err != nil {
		return inv.fail(err)
	}
	d, err := inv.client.Dispatch(inv.ctx, req)
	if err != nil {
		var apiErr *fleetclient.Error
		if errors.As(err, &apiErr) && apiErr.Status == http.StatusConflict {
			inv.refused(apiErr, d)
			return ExitRefused
		}
		if inv.intr.interrupted() {
			inv.ui.errorf("interrupted before Fleet answered the dispatch: it may have started; see runfleet runs list%s (the same command with --idempotency-key %s dispatches it at most once)",
				inv.flagHint(), d.IdempotencyKey)
			return ExitInterrupted
		}
		return inv.fail(err)
	}
	a := d.DispatchAnswer
	if *o.detach {
		if *o.json {
			inv.ui.document(a)
			return ExitOK
		}
		inv.ui.fields([][2]cell{
			{plain("run"), plain(a.FleetRunID)},
			{plain("status"), {text: a.Status, color: statusColor(a.Status)}},
			{plain("host"), plain(a.HostID)},
			{plain("queue"), plain(queueLine(inv.now(), a.Status, a.Queue))},
			{plain("reused"), plain(yesIf(a.Reused, "yes: an earlier dispatch of this idempotency key"))},
			{plain("note"), plain(a.Note)},
			{plain("follow"), plain("runfleet runs follow " + a.FleetRunID + inv.flagHint())},
		})
		return ExitOK
	}
	if *o.json {
		inv.ui.line(jsonLine{Type: "dispatched", Data: a})
	}
	how := "dispatched"
	if a.Reused {
		how = "found this idempotency key's earlier dispatch:"
	}
	if d.Queued() {
		inv.ui.progressf("%s run %s (%s)", how, a.FleetRunID, a.Status)
		// Said off a terminal too: a CI log shows why nothing happens yet.
		inv.ui.notef("%s", queuedLine(a.Queue))
	} else {
		inv.ui.progressf("%s run %s to host %s (%s)", how, a.FleetRunID, a.HostID, a.Status)
	}
	if a.Details != nil {
		for _, x := range a.Details.Excluded {
			inv.ui.progressf("  went past host %s: %s", x.HostID, strings.Join(append(x.Reasons, x.Detail), ": "))
		}
	}
	if a.Note != "" {
		inv.ui.progressf("note: %s", a.Note)
	}
	f := &follower{inv: inv, runID: a.FleetRunID, json: *o.json, cancelOnInterrupt: *o.cancel, status: a.Status}
	return f.follow(a.Links.Stream)
}

func yesIf(b bool, s string) string {
	if b {
		return s
	}
	return ""
}

// refused reports a 409 dispatch on stderr: the code, the message, the
// run's reason and detail when a host refused it, and each host left out
// or tried with why.
func (inv *invocation) refused(e *fleetclient.Error, d fleetclient.Dispatched) {
	inv.ui.errorf("the dispatch was refused (%s): %s", e.Code, e.Message)
	w := inv.ui.err
	if d.FleetRunID != "" {
		fmt.Fprintf(w, "  run:     %s (%s, nothing started)\n", sanitize(d.FleetRunID), sanitize(d.Status))
		if d.Reason != "" {
			fmt.Fprintf(w, "  reason:  %s\n", sanitize(d.Reason))
		}
		if d.Detail != "" {
			fmt.Fprintf(w, "  detail:  %s\n", sanitize(d.Detail))
		}
	}
	var excluded []fleetapi.Exclusion
	if n, ok := e.NoEligibleHost(); ok {
		excluded = n.Excluded
		if n.Considered != nil && n.Hosts != nil {
			fmt.Fprintf(w, "  routing considered %d of %d hosts\n", *n.Considered, *n.Hosts)
		}
	} else if d.Details != nil {
		excluded = d.Details.Excluded
	}
	if len(excluded) > 0 {
		fmt.Fprintf(w, "  hosts:\n")
		for _, x := range excluded {
			line := strings.Join(x.Reasons, ", ")
			if len(x.Agents) > 0 {
				line += " (it offers " + strings.Join(x.Agents, ", ") + ")"
			}
			if x.Detail != "" {
				line += ": " + sanitize(x.Detail)
			}
			fmt.Fprintf(w, "    %s: %s\n", sanitize(x.HostID), sanitize(line))
		}
	}
	if len(e.Details) > 0 && e.Code != fleetapi.CodeNoEligibleHost {
		var other struct {
			FleetRunID string `json:"fleetRunId"`
		}
		if json.Unmarshal(e.Details, &other) == nil && other.FleetRunID != "" {
			fmt.Fprintf(w, "  run:     %s (see runfleet runs get %s%s)\n", sanitize(other.FleetRunID), sanitize(other.FleetRunID), inv.flagHint())
		}
	}
}

// follower follows one run's stream: its output to stdout, progress and
// the end to stderr, or every message as a JSON line.
type follower struct {
	inv               *invocation
	runID             string
	json              bool
	cancelOnInterrupt bool
	status            string
}

// follow reads the stream to the run's end and returns the exit code.
func (f *follower) follow(streamURL string) int {
	inv := f.inv
	opts := fleetclient.FollowOptions{OnReconnect: func(cause error, after time.Duration) {
		if cause != nil {
			inv.ui.progressf("the stream dropped (%s); reconnecting in %s", strings.TrimPrefix(cause.Error(), "fleetclient: "), after.Round(time.Millisecond))
		}
	}}
	res, err := inv.client.Follow(inv.ctx, streamURL, opts, f.handle)
	if err != nil {
		if inv.intr.interrupted() {
			return f.interrupted()
		}
		inv.ui.errorf("%s", inv.describe(err))
		inv.ui.notef("The run goes on; follow it again with: runfleet runs follow %s%s", f.runID, inv.flagHint())
		return ExitError
	}
	return f.done(res.Done)
}

// handle is one stream message.
func (f *follower) handle(ev fleetclient.StreamEvent) error {
	if f.json {
		var data any
		switch {
		case ev.Event != nil:
			data = ev.Event
		case ev.Snapshot != nil:
			data = ev.Snapshot
		case ev.Egress != nil:
			data = ev.Egress
		case ev.Idle != nil:
			data = ev.Idle
		}
		return f.inv.ui.line(jsonLine{Type: ev.Type, ID: ev.ID, Data: data})
	}
	switch {
	case ev.Event != nil && ev.Event.Type == fleetapi.EventOutput:
		var text string
		if err := json.Unmarshal(ev.Event.Data, &text); err != nil {
			return fmt.Errorf("event %d: output that is not a JSON string: %w", ev.Event.Sequence, err)
		}
		return f.inv.ui.output(text)
	case ev.Event != nil && ev.Event.Type == fleetapi.EventState:
		var st struct {
			Status  string `json:"status"`
			Attempt int    `json:"attempt"`
		}
		if json.Unmarshal(ev.Event.Data, &st) == nil {
			f.statusChanged(st.Status, st.Attempt)
		}
	case ev.Event != nil && ev.Event.Type == fleetapi.EventQueued:
		f.leftTheQueue(ev.Event.Data)
	case ev.Snapshot != nil:
		f.statusChanged(ev.Snapshot.Status, ev.Snapshot.Attempt)
	case ev.Idle != nil && ev.Idle.Status == fleetapi.StatusQueued:
		f.inv.ui.progressf("run %s is still queued after %ds without news; the stream resumes in %s", f.runID, ev.Idle.IdleSeconds,
			(time.Duration(ev.Idle.RetryMs) * time.Millisecond).String())
	case ev.Idle != nil:
		f.inv.ui.progressf("the run has been quiet for %ds; the stream resumes in %s", ev.Idle.IdleSeconds,
			(time.Duration(ev.Idle.RetryMs) * time.Millisecond).String())
	}
	return nil
}

func (f *follower) statusChanged(status string, attempt int) {
	if status == "" || status == f.status {
		return
	}
	f.status = status
	if attempt == 0 {
		// Queued or dispatching: no attempt has begun.
		f.inv.ui.progressf("run %s: %s", f.runID, status)
		return
	}
	f.inv.ui.progressf("run %s: %s (attempt %d)", f.runID, status, attempt)
}

// done is the exit code of a run's end: 0 succeeded; a failure's exit
// code (1 without one); 1 canceled or lost. Its reason goes to stderr.
func (f *follower) done(d fleetapi.StreamDone) int {
	inv := f.inv
	if f.json {
		inv.ui.line(jsonLine{Type: fleetapi.SSEDone, Data: d})
	}
	if d.Status == fleetapi.StatusSucceeded {
		inv.ui.progressf("run %s succeeded", f.runID)
		return ExitOK
	}
	if d.Reason == fleetapi.ReasonQueueTimeout {
		// Like a dispatch no host could take, after the wait it asked for.
		what := "run " + f.runID + " never started: no eligible host had room before its queue timeout (" + d.Reason + ")"
		if d.Detail != "" {
			what += ": " + sanitize(d.Detail)
		}
		inv.ui.errorf("%s", what)
		return ExitRefused
	}
	code := ExitError
	what := "run " + f.runID + " " + d.Status
	if d.Status == fleetapi.StatusCanceled || d.Status == fleetapi.StatusLost {
		what = "run " + f.runID + " was " + d.Status
	}
	if d.ExitCode != nil {
		what += fmt.Sprintf(" with exit code %d", *d.ExitCode)
		if *d.ExitCode > 0 && *d.ExitCode < 256 {
			code = *d.ExitCode
		}
	}
	if d.Reason != "" && d.Reason != d.Status {
		what += " (" + d.Reason + ")"
	}
	if d.Detail != "" {
		what += ": " + sanitize(d.Detail)
	}
	inv.ui.errorf("%s", what)
	return code
}

// interrupted ends a follow the first signal stopped: it detaches, or
// with --cancel-on-interrupt cancels the run (a second signal gives up
// waiting for the cancel's answer). Exit 130 either way.
func (f *follower) interrupted() int {
	inv := f.inv
	if !f.cancelOnInterrupt {
		inv.ui.notef("Detached from run %s; it goes on. Follow it again with: runfleet runs follow %s%s", f.runID, f.runID, inv.flagHint())
		return ExitInterrupted
	}
	inv.ui.progressf("canceling run %s (Ctrl-C again to stop waiting)", f.runID)
	ctx, stop := context.WithTimeout(inv.afterFirst, 30*time.Second)
	defer stop()
	in, err := inv.client.Cancel(ctx, f.runID)
	var apiErr *fleetclient.Error
	switch {
	case err == nil && in.Accepted == fleetapi.Accepted && in.Run.HostID == "":
		inv.ui.notef("Canceled run %s while it waited in the queue: it never started.", f.runID)
	case err == nil && in.Accepted == fleetapi.Accepted:
		inv.ui.notef("Canceled run %s (its host took the cancel).", f.runID)
	case err == nil:
		inv.ui.notef("The cancel of run %s may or may not have reached its host (%s); see runfleet runs get %s%s", f.runID, sanitize(in.Detail), f.runID, inv.flagHint())
	case errors.As(err, &apiErr) && apiErr.Status == http.StatusConflict:
		inv.ui.errorf("the cancel of run %s was refused: %s", f.runID, apiErr.Message)
	case ctx.Err() != nil:
		inv.ui.errorf("stopped waiting for the cancel of run %s; see runfleet runs get %s%s", f.runID, f.runID, inv.flagHint())
	default:
		inv.ui.errorf("the cancel of run %s failed: %s", f.runID, inv.describe(err))
	}
	return ExitInterrupted
}

// sortedKeys is m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
