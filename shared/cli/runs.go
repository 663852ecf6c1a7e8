package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/fleetclient"
)

// runStatuses are the statuses --status takes.
var runStatuses = []string{
	fleetapi.StatusQueued, fleetapi.StatusDispatching, fleetapi.StatusPending, fleetapi.StatusAdmitted, fleetapi.StatusRunning,
	fleetapi.StatusSucceeded, fleetapi.StatusFailed, fleetapi.StatusCanceled, fleetapi.StatusLost,
}

func runsCmd() *command {
	return &command{
		name: "runs", summary: "List, inspect, follow and steer runs",
		examples: []string{
			"runfleet runs list",
			"runfleet runs logs fr-01jd3k2m4n5p6q7r8s9t0v1w2x",
		},
		subs: []*command{runsListCmd(), runsGetCmd(), runsLogsCmd(), runsFollowCmd(), runsInputCmd(),
			runVerbCmd("cancel", "Cancel a run", "Asks the run's host to end the run (POST /fleet/runs/{id}/cancel)."),
			runVerbCmd("retry", "Start a run's next attempt", "Asks the run's host to run it again, on the same event sequence\n(POST /fleet/runs/{id}/retry); follow it with runfleet runs follow.")},
	}
}

func runsListCmd() *command {
	return &command{
		name: "list", summary: "List the runs this token may see, newest first",
		long: "One page of runs (GET /fleet/runs). --status, --agent and --host filter on Fleet's side;\n" +
			"--cursor takes the next page's cursor, which runfleet prints on stderr when there is one.",
		examples: []string{
			"runfleet runs list",
			"runfleet runs list --status failed --agent shell --limit 20",
			"runfleet runs list --host local-edge --json | jq -r '.runs[].fleetRunId'",
		},
		setup: func(fs *flagSet) func(*invocation) int {
			status := fs.String("status", "STATUS", "only runs with this status", runStatuses...)
			agent := fs.String("agent", "NAME", "only runs of this agent")
			host := fs.String("host", "ID", "only runs on this host")
			limit := fs.Int("limit", "N", "at most N runs (1-1000; default: the API's 100)")
			cursor := fs.String("cursor", "CURSOR", "the page after this cursor (a page's nextCursor)")
			asJSON := fs.Bool("json", "print the API's answer as JSON")
			return func(inv *invocation) int {
				f := fleetclient.RunFilter{Status: *status, Agent: *agent, Host: *host, Limit: *limit, Cursor: *cursor}
				if err := checkRunFilter(f); err != nil {
					return inv.usage(inv.path, err)
				}
				return inv.runsList(f, *asJSON)
			}
		},
	}
}

// checkRunFilter refuses, before any call, what the API would.
func checkRunFilter(f fleetclient.RunFilter) error {
	if f.Status != "" && !contains(runStatuses, f.Status) {
		return usagef("--status %q: want one of %s", f.Status, strings.Join(runStatuses, ", "))
	}
	if f.Limit < 0 || f.Limit > 1000 {
		return usagef("--limit %d: want 1 to 1000", f.Limit)
	}
	return nil
}

func (inv *invocation) runsList(f fleetclient.RunFilter, asJSON bool) int {
	if err := inv.connect(); err != nil {
		return inv.fail(err)
	}
	page, err := inv.client.Runs(inv.ctx, f)
	if err != nil {
		return inv.fail(err)
	}
	if asJSON {
		inv.ui.document(page)
		return ExitOK
	}
	if len(page.Runs) == 0 {
		inv.ui.notef("No runs.")
	} else {
		rows := make([][]cell, 0, len(page.Runs))
		now := inv.now()
		for _, r := range page.Runs {
			rows = append(rows, []cell{plain(r.FleetRunID), {text: r.Status, color: statusColor(r.Status)},
				plain(r.Agent), plain(r.HostID), plain(r.Repository), plain(exitOf(r.ExitCode)), plain(ago(now, r.CreatedAt)), plain(r.Reason)})
		}
		inv.ui.table([]string{"RUN", "STATUS", "AGENT", "HOST", "REPOSITORY", "EXIT", "CREATED", "REASON"}, rows)
	}
	if page.HasMore && page.NextCursor != "" {
		inv.ui.notef("More: runfleet runs list --cursor %s%s", page.NextCursor, inv.flagHint())
	}
	return ExitOK
}

// attemptOf is a run's attempt; none while it waits for a host.
func attemptOf(n int) string {
	if n == 0 {
		return ""
	}
	return strconv.Itoa(n)
}

func exitOf(code *int) string {
	if code == nil {
		return ""
	}
	return strconv.Itoa(*code)
}

func runsGetCmd() *command {
	return &command{
		name: "get", summary: "Show one run", args: "RUN", minArgs: 1, maxArgs: 1,
		long: "The run as Fleet has it (GET /fleet/runs/{id}), refreshed from its host while it is live.",
		examples: []string{
			"runfleet runs get fr-01jd3k2m4n5p6q7r8s9t0v1w2x",
			"runfleet runs get fr-01jd3k2m4n5p6q7r8s9t0v1w2x --json | jq .run.status",
		},
		setup: func(fs *flagSet) func(*invocation) int {
			asJSON := fs.Bool("json", "print the API's answer as JSON")
			return func(inv *invocation) int { return inv.runsGet(*asJSON) }
		},
	}
}

func (inv *invocation) runsGet(asJSON bool) int {
	if err := inv.connect(); err != nil {
		return inv.fail(err)
	}
	a, err := inv.client.Run(inv.ctx, inv.args[0])
	if err != nil {
		return inv.fail(err)
	}
	if asJSON {
		inv.ui.document(a)
		return ExitOK
	}
	r, now := a.Run, inv.now()
	host := r.HostID
	if r.ChildRunID != "" {
		host += " (its run " + r.ChildRunID + ")"
	}
	rows := [][2]cell{
		{plain("run"), plain(r.FleetRunID)},
		{plain("status"), {text: r.Status, color: statusColor(r.Status)}},
		{plain("exit code"), plain(exitOf(r.ExitCode))},
		{plain("reason"), plain(r.Reason)},
		{plain("detail"), plain(r.Detail)},
		{plain("agent"), plain(r.Agent)},
		{plain("repository"), plain(r.Repository)},
		{plain("host"), plain(host)},
		{plain("queue"), plain(queueLine(now, r.Status, r.Queue))},
		{plain("attempt"), plain(attemptOf(r.Attempt))},
		{plain("owner"), plain(r.OwnerID)},
		{plain("created"), plain(stamp(now, r.CreatedAt))},
		{plain("updated"), plain(stamp(now, r.UpdatedAt))},
	}
	if r.EndedAt != nil {
		rows = append(rows, [2]cell{plain("ended"), plain(stamp(now, *r.EndedAt))})
	}
	if e := r.Egress; e != nil {
		rows = append(rows, [2]cell{plain("egress"), {text: egressLine(*e), color: alertColor(e.Alerts)}})
	}
	for _, c := range r.Credentials {
		rows = append(rows, [2]cell{plain("credential"), plain(credentialLine(now, c))})
	}
	rows = append(rows, [2]cell{plain("stream"), plain(r.Links.Stream)})
	inv.ui.fields(rows)
	if a.Note != "" {
		inv.ui.notef("Note: %s", sanitize(a.Note))
	}
	return ExitOK
}

func runsLogsCmd() *command {
	return &command{
		name: "logs", summary: "Print a run's output so far, then exit", args: "RUN", minArgs: 1, maxArgs: 1,
		long: "The output Fleet has mirrored (GET /fleet/runs/{id}/events, every page), as the task printed\n" +
			"it. To wait for more, use runfleet runs follow.",
		examples: []string{
			"runfleet runs logs fr-01jd3k2m4n5p6q7r8s9t0v1w2x",
			"# every event, one JSON line each",
			"runfleet runs logs fr-01jd3k2m4n5p6q7r8s9t0v1w2x --json",
		},
		setup: func(fs *flagSet) func(*invocation) int {
			asJSON := fs.Bool("json", "print every event as a JSON line, as runs follow --json does")
			return func(inv *invocation) int { return inv.runsLogs(*asJSON) }
		},
	}
}

func (inv *invocation) runsLogs(asJSON bool) int {
	if err := inv.connect(); err != nil {
		return inv.fail(err)
	}
	id := inv.args[0]
	var after int64
	for {
		page, err := inv.client.Events(inv.ctx, id, fleetclient.EventsQuery{After: after, Limit: 1000})
		if err != nil {
			return inv.fail(err)
		}
		for _, e := range page.Events {
			if asJSON {
				inv.ui.line(jsonLine{Type: fleetapi.SSEEvent, ID: strconv.FormatInt(e.Sequence, 10), Data: &e})
				continue
			}
			if e.Type != fleetapi.EventOutput {
				continue
			}
			var text string
			if err := json.Unmarshal(e.Data, &text); err != nil {
				return inv.fail(fmt.Errorf("event %d of run %s: output that is not a JSON string: %w", e.Sequence, id, err))
			}
			inv.ui.output(text)
		}
		if !page.HasMore || page.NextCursor == nil || *page.NextCursor <= after {
			return ExitOK
		}
		after = *page.NextCursor
	}
}

func runsFollowCmd() *command {
	return &command{
		name: "follow", summary: "Follow a run's output to its end", args: "RUN", minArgs: 1, maxArgs: 1,
		long: "Follows the run's stream from its first event, as runfleet run does after dispatching: the output\n" +
			"on stdout, and the run's exit code as runfleet's (1 when it failed without one). Ctrl-C stops\n" +
			"following; the run goes on.",
		examples: []string{
			"runfleet runs follow fr-01jd3k2m4n5p6q7r8s9t0v1w2x",
			"runfleet runs follow fr-01jd3k2m4n5p6q7r8s9t0v1w2x --json | jq -c 'select(.type == \"event\") | .data'",
		},
		setup: func(fs *flagSet) func(*invocation) int {
			asJSON := fs.Bool("json", "print each stream message as a JSON line")
			return func(inv *invocation) int {
				if err := inv.connect(); err != nil {
					return inv.fail(err)
				}
				// The stream's URL is the run's own link (in AWS it is on
				// the stream function's address, not the API's).
				a, err := inv.client.Run(inv.ctx, inv.args[0])
				if err != nil {
					return inv.fail(err)
				}
				f := &follower{inv: inv, runID: a.Run.FleetRunID, json: *asJSON, status: a.Run.Status}
				return f.follow(a.Run.Links.Stream)
			}
		},
	}
}

func runsInputCmd() *command {
	return &command{
		name: "input", summary: "Type text to a run's standard input", args: "RUN TEXT...", minArgs: 2, maxArgs: -1,
		long: "Sends the TEXT words, joined with one space, to the run's standard input as one JSON string\n" +
			"(POST /fleet/runs/{id}/input), exactly: add --newline to end it with a line break, as Enter would.\n" +
			"It is sent once, never retried (a repeat would type it twice).",
		examples: []string{
			"runfleet runs input fr-01jd3k2m4n5p6q7r8s9t0v1w2x --newline yes",
			"runfleet runs input fr-01jd3k2m4n5p6q7r8s9t0v1w2x -- '--flag-like text'",
		},
		setup: func(fs *flagSet) func(*invocation) int {
			newline := fs.Bool("newline", "end the text with a line break")
			asJSON := fs.Bool("json", "print the API's answer as JSON")
			return func(inv *invocation) int {
				text := strings.Join(inv.args[1:], " ")
				if *newline {
					text += "\n"
				}
				return inv.runVerb("input", *asJSON, func(id string) (fleetclient.Interacted, error) {
					return inv.client.Input(inv.ctx, id, text)
				})
			}
		},
	}
}

func runVerbCmd(name, summary, long string) *command {
	return &command{
		name: name, summary: summary, args: "RUN", minArgs: 1, maxArgs: 1, long: long,
		examples: []string{"runfleet runs " + name + " fr-01jd3k2m4n5p6q7r8s9t0v1w2x"},
		setup: func(fs *flagSet) func(*invocation) int {
			asJSON := fs.Bool("json", "print the API's answer as JSON")
			return func(inv *invocation) int {
				return inv.runVerb(name, *asJSON, func(id string) (fleetclient.Interacted, error) {
					if name == "cancel" {
						return inv.client.Cancel(inv.ctx, id)
					}
					return inv.client.Retry(inv.ctx, id)
				})
			}
		},
	}
}

// runVerb sends a run's verb and reports the host's outcome: 0 when the
// host took it; 1 when it refused it or its outcome is unknown (the
// answer says which, and what to check).
func (inv *invocation) runVerb(name string, asJSON bool, send func(id string) (fleetclient.Interacted, error)) int {
	if err := inv.connect(); err != nil {
		return inv.fail(err)
	}
	id := inv.args[0]
	in, err := send(id)
	var apiErr *fleetclient.Error
	refused := errors.As(err, &apiErr) && apiErr.Status == http.StatusConflict && in.FleetRunID != ""
	if err != nil && !refused {
		return inv.fail(err)
	}
	if asJSON {
		inv.ui.document(in.Interaction)
	}
	switch {
	case refused:
		inv.ui.errorf("the %s was refused: %s", name, apiErr.Message)
		return ExitError
	case in.Accepted == fleetapi.Accepted:
		switch {
		case asJSON:
		case in.Run.HostID == "":
			// A queued run: Fleet itself took the verb (a cancel ends it).
			inv.ui.notef("%s of run %s: done while it waited in the queue; the run is %s", verbNoun(name), id, in.Run.Status)
		default:
			inv.ui.notef("%s of run %s: taken by host %s; the run is %s", verbNoun(name), id, in.Run.HostID, in.Run.Status)
		}
		return ExitOK
	}
	inv.ui.errorf("the %s's outcome is unknown (%s): the host may or may not have acted; check with runfleet runs get %s%s",
		name, sanitize(in.Detail), id, inv.flagHint())
	return ExitError
}

func verbNoun(name string) string {
	switch name {
	case "input":
		return "Input"
	case "cancel":
		return "Cancel"
	}
	return "Retry"
}

// credentialLine is one brokered key of a run: what minted it and the life
// of the value its host holds (never a value: the API has none).
func credentialLine(now time.Time, c fleetapi.BrokeredCredential) string {
	left := "in " + c.ExpiresAt.Sub(now).Round(time.Minute).String()
	if !c.ExpiresAt.After(now) {
		left = "expired " + ago(now, c.ExpiresAt)
	}
	line := fmt.Sprintf("%s/%s (%s), expires %s (%s)", c.ProjectID, c.Key, c.Kind, c.ExpiresAt.Local().Format(time.RFC3339), left)
	if c.RevokedAt != nil {
		line += ", revoked " + stamp(now, *c.RevokedAt)
	}
	return line
}
