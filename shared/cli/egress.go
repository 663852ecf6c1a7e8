package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/fleetclient"
)

func egressCmd() *command {
	return &command{
		name: "egress", summary: "Show a run's egress ledger: every request it made, and where each key went",
		args: "RUN", minArgs: 1, maxArgs: 1,
		long: "The run's egress ledger as Fleet mirrored it (GET /fleet/runs/{id}/egress, every page): each\n" +
			"request, tunnel and refusal its host's proxy decided, with the keys used, then the ledger's\n" +
			"summary. --verify checks the chain and the host's seal; a ledger that fails exits 1.\n" +
			"--json prints one egress page holding every record read.",
		examples: []string{
			"runfleet egress fr-01jd3k2m4n5p6q7r8s9t0v1w2x",
			"runfleet egress fr-01jd3k2m4n5p6q7r8s9t0v1w2x --verify",
			"runfleet egress fr-01jd3k2m4n5p6q7r8s9t0v1w2x --json | jq -r '.records[] | select(.keys) | .authority'",
		},
		setup: func(fs *flagSet) func(*invocation) int {
			verify := fs.Bool("verify", "check the ledger's hash chain and its host's seal")
			limit := fs.Int("limit", "N", "at most N records (default: all)")
			asJSON := fs.Bool("json", "print the ledger as one egress page in JSON")
			return func(inv *invocation) int {
				if *limit < 0 {
					return inv.usage(inv.path, usagef("--limit %d: want a positive number", *limit))
				}
				return inv.egress(*verify, *limit, *asJSON)
			}
		},
	}
}

// egressPage is the largest page asked for.
const egressPage = 1000

func (inv *invocation) egress(verify bool, limit int, asJSON bool) int {
	if err := inv.connect(); err != nil {
		return inv.fail(err)
	}
	id := inv.args[0]
	var all fleetapi.EgressPage
	all.Records = []fleetapi.EgressRecord{}
	q := fleetclient.EgressQuery{Verify: verify, Limit: egressPage}
	for first := true; ; first = false {
		if limit > 0 {
			q.Limit = min(egressPage, limit-len(all.Records))
		}
		page, err := inv.client.Egress(inv.ctx, id, q)
		if err != nil {
			return inv.fail(err)
		}
		if first {
			// Verification reads the whole ledger: asked once.
			all.Summary, all.Seal, all.Verification = page.Summary, page.Seal, page.Verification
			q.Verify = false
		}
		all.Records = append(all.Records, page.Records...)
		all.HasMore, all.Live, all.NextCursor = page.HasMore, page.Live, page.NextCursor
		if !page.HasMore || page.NextCursor == nil || *page.NextCursor <= q.Cursor || (limit > 0 && len(all.Records) >= limit) {
			break
		}
		q.Cursor = *page.NextCursor
	}
	if asJSON {
		inv.ui.document(all)
	} else {
		inv.egressTable(all)
	}
	if v := all.Verification; v != nil && !v.OK {
		at := ""
		if v.FailedSeq != 0 {
			at = fmt.Sprintf(" at record %d", v.FailedSeq)
		}
		inv.ui.errorf("the ledger of run %s failed verification%s: %s", id, at, sanitize(v.Problem))
		return ExitError
	}
	return ExitOK
}

func (inv *invocation) egressTable(p fleetapi.EgressPage) {
	if len(p.Records) == 0 {
		inv.ui.notef("No egress records mirrored for this run yet.")
	} else {
		rows := make([][]cell, 0, len(p.Records))
		for _, r := range p.Records {
			target := r.Authority
			if r.Method != "" || r.Path != "" {
				target = strings.TrimSpace(r.Method + " " + r.Authority + r.Path)
			}
			if r.Command != "" {
				target = r.Authority + " " + r.Command
			}
			status := ""
			if r.Status != 0 {
				status = strconv.Itoa(r.Status)
			}
			why := r.Reason
			if r.Alert != "" {
				why = strings.TrimSpace("ALERT " + r.Alert + " " + why)
			}
			rows = append(rows, []cell{plain(strconv.FormatInt(r.Seq, 10)), plain(r.TS.Local().Format("15:04:05")),
				{text: r.Action, color: actionColor(r.Action)}, plain(r.Via), plain(target), plain(status),
				plain(strings.Join(r.Keys, ",")), {text: why, color: alertColor(btoi(r.Alert != ""))}})
		}
		inv.ui.table([]string{"SEQ", "TIME", "ACTION", "VIA", "REQUEST", "STATUS", "KEYS", "WHY"}, rows)
	}
	if p.HasMore {
		inv.ui.notef("More records follow (showing %d); raise --limit to see them.", len(p.Records))
	}
	if s := p.Summary; s != nil {
		inv.ui.notef("Summary: %s", egressLine(*s))
	}
	switch {
	case p.Seal != nil:
		inv.ui.notef("Sealed by the host at %d records, %s.", p.Seal.Count, stamp(inv.now(), p.Seal.SealedAt))
	case p.Live:
		inv.ui.notef("Not sealed yet: the run is live, and its ledger may grow.")
	}
	if v := p.Verification; v != nil && v.OK {
		how := "the mirror alone (the host no longer holds the run)"
		if v.HostChecked {
			how = "and the host's current seal matches"
		}
		inv.ui.notef("Verified: %d records chain from the run's start, sealed with host %s's key, %s.", v.Records, v.HostID, how)
	}
}

// egressLine is a ledger summary on one line.
func egressLine(s fleetapi.EgressSummary) string {
	line := fmt.Sprintf("%d requests, %d blocked, %d warned, %s up, %s down", s.Requests, s.Blocked, s.Warned,
		bytesOf(s.BytesUp), bytesOf(s.BytesDown))
	if s.Alerts > 0 {
		line += fmt.Sprintf(", %d ALERTS", s.Alerts)
	}
	if s.Dropped > 0 {
		line += fmt.Sprintf(", %d records dropped", s.Dropped)
	}
	return line
}

func actionColor(action string) string {
	switch action {
	case fleetapi.EgressBlocked, fleetapi.EgressDenied, fleetapi.EgressWithheld:
		return red
	case fleetapi.EgressWarned, fleetapi.EgressDropped:
		return yellow
	case fleetapi.EgressSubstituted:
		return green
	}
	return ""
}

func alertColor[N int | int64](alerts N) string {
	if alerts > 0 {
		return red
	}
	return ""
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
