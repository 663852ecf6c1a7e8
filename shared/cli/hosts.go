package cli

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/fleetclient"
)

func hostsCmd() *command {
	return &command{
		name: "hosts", summary: "List and inspect hosts; probe, drain and resume them (admin)",
		examples: []string{"runfleet hosts list", "runfleet hosts drain local-edge"},
		subs: []*command{
			{
				name: "list", summary: "List the hosts this token may use",
				long: "Every host in the caller's scope (GET /fleet/hosts), with its last probe.",
				examples: []string{
					"runfleet hosts list",
					"runfleet hosts list --json | jq -r '.hosts[] | select(.probe.status == \"ok\") | .id'",
				},
				setup: func(fs *flagSet) func(*invocation) int {
					asJSON := fs.Bool("json", "print the API's answer as JSON")
					return func(inv *invocation) int { return inv.hostsList(*asJSON) }
				},
			},
			{
				name: "get", summary: "Show one host and its last probe", args: "ID", minArgs: 1, maxArgs: 1,
				examples: []string{"runfleet hosts get local-edge", "runfleet hosts get local-edge --json | jq .probe.load"},
				setup: func(fs *flagSet) func(*invocation) int {
					asJSON := fs.Bool("json", "print the host as JSON")
					return func(inv *invocation) int { return inv.hostsGet(*asJSON) }
				},
			},
			{
				name: "probe", summary: "Probe a host now (admin)", args: "ID", minArgs: 1, maxArgs: 1,
				long:     "Asks the host's health now (POST /fleet/hosts/{id}/probe) and shows what it reported.",
				examples: []string{"runfleet hosts probe local-edge"},
				setup: func(fs *flagSet) func(*invocation) int {
					asJSON := fs.Bool("json", "print the API's answer as JSON")
					return func(inv *invocation) int { return inv.hostsProbe(*asJSON) }
				},
			},
			hostDrainCmd("drain", "Stop routing new runs to a host (admin)",
				"The host takes no new run; its running runs go on (POST /fleet/hosts/{id}/drain). Fleet\n"+
					"records the drain whatever the host answers, so routing leaves the host out at once."),
			hostDrainCmd("resume", "Route new runs to a drained host again (admin)",
				"Undoes a drain once the host confirms it (POST /fleet/hosts/{id}/resume)."),
		},
	}
}

func hostDrainCmd(name, summary, long string) *command {
	return &command{
		name: name, summary: summary, long: long, args: "ID", minArgs: 1, maxArgs: 1,
		examples: []string{"runfleet hosts " + name + " local-edge"},
		setup: func(fs *flagSet) func(*invocation) int {
			asJSON := fs.Bool("json", "print the API's answer as JSON")
			return func(inv *invocation) int { return inv.hostsDrain(name, *asJSON) }
		},
	}
}

func (inv *invocation) hostsList(asJSON bool) int {
	if err := inv.connect(); err != nil {
		return inv.fail(err)
	}
	hosts, err := inv.client.Hosts(inv.ctx)
	if err != nil {
		return inv.fail(err)
	}
	if asJSON {
		if hosts == nil {
			hosts = []fleetapi.Host{}
		}
		inv.ui.document(fleetapi.HostList{Hosts: hosts})
		return ExitOK
	}
	if len(hosts) == 0 {
		inv.ui.notef("No hosts visible to this token.")
		return ExitOK
	}
	rows := make([][]cell, 0, len(hosts))
	now := inv.now()
	for _, h := range hosts {
		state := hostState(h)
		row := []cell{plain(h.ID), {text: state, color: hostColor(state)}}
		if p := h.Probe; p != nil {
			row = append(row, plain(strings.Join(p.Agents, ",")), plain(loadOf(p.Load)), plain(storageOf(p.Storage)),
				plain(p.Version), plain(ago(now, p.At)))
		} else {
			row = append(row, plain(""), plain(""), plain(""), plain(""), plain("never"))
		}
		rows = append(rows, row)
	}
	inv.ui.table([]string{"HOST", "STATE", "AGENTS", "LOAD", "FREE", "VERSION", "PROBED"}, rows)
	return ExitOK
}

// hostState is one word for a host as routing sees it.
func hostState(h fleetapi.Host) string {
	switch {
	case !h.Enabled:
		return "disabled"
	case h.Probe == nil:
		return "never probed"
	case h.Probe.Status != fleetapi.ProbeOK:
		return h.Probe.Status
	case h.Probe.Draining:
		return "draining"
	case h.Probe.Storage != nil && h.Probe.Storage.Low:
		return "storage low"
	}
	return "ok"
}

func hostColor(state string) string {
	switch state {
	case "ok":
		return green
	case "draining", "never probed", "storage low":
		return yellow
	case "disabled":
		return grey
	}
	return red
}

func loadOf(l *fleetapi.Load) string {
	if l == nil {
		return ""
	}
	return fmt.Sprintf("%d/%d", l.Active, l.MaxConcurrent)
}

func storageOf(s *fleetapi.Storage) string {
	if s == nil {
		return ""
	}
	return bytesOf(s.FreeBytes)
}

func (inv *invocation) hostsGet(asJSON bool) int {
	if err := inv.connect(); err != nil {
		return inv.fail(err)
	}
	h, err := inv.client.Host(inv.ctx, inv.args[0])
	if err != nil {
		return inv.fail(err)
	}
	if asJSON {
		inv.ui.document(h)
		return ExitOK
	}
	state := hostState(h)
	rows := [][2]cell{
		{plain("host"), plain(h.ID)},
		{plain("state"), {text: state, color: hostColor(state)}},
		{plain("url"), plain(h.BaseURL)},
		{plain("labels"), plain(labelsOf(h.Labels))},
		{plain("local paths"), plain(strings.Join(h.LocalPaths, ", "))},
		{plain("registered"), plain(stamp(inv.now(), h.CreatedAt))},
	}
	inv.ui.fields(append(rows, inv.probeRows(h.Probe)...))
	return ExitOK
}

func labelsOf(m map[string]string) string {
	keys := sortedKeys(m)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ", ")
}

// probeRows are a probe's fields for a get's view.
func (inv *invocation) probeRows(p *fleetapi.Probe) [][2]cell {
	if p == nil {
		return [][2]cell{{plain("probe"), plain("never probed: runfleet hosts probe ID (admin)")}}
	}
	rows := [][2]cell{
		{plain("probe"), {text: p.Status, color: statusColor(p.Status)}},
		{plain("probed"), plain(fmt.Sprintf("%s, in %d ms", stamp(inv.now(), p.At), p.LatencyMs))},
		{plain("probe detail"), plain(p.Detail)},
		{plain("version"), plain(p.Version)},
		{plain("agents"), plain(strings.Join(p.Agents, ", "))},
		{plain("draining"), plain(yesIf(p.Draining, "yes"))},
		{plain("load"), plain(loadOf(p.Load))},
		{plain("secrets"), plain(yesIf(p.Features.SecretsProxy, "proxied"))},
	}
	if s := p.Storage; s != nil {
		text := fmt.Sprintf("%s free (reserve %s)", bytesOf(s.FreeBytes), bytesOf(s.MinFreeBytes))
		color := ""
		if s.Low {
			text, color = text+": low, the host refuses new runs", red
		}
		rows = append(rows, [2]cell{plain("storage"), {text: text, color: color}})
	}
	if l := p.Limits; l != nil {
		rows = append(rows, [2]cell{plain("limits"), plain(l.Enforced + suffixIf(l.Detail != "", ": "+l.Detail))})
	}
	return rows
}

func suffixIf(b bool, s string) string {
	if b {
		return s
	}
	return ""
}

func (inv *invocation) hostsProbe(asJSON bool) int {
	if err := inv.connect(); err != nil {
		return inv.fail(err)
	}
	p, err := inv.client.ProbeHost(inv.ctx, inv.args[0])
	if err != nil {
		return inv.fail(err)
	}
	if asJSON {
		inv.ui.document(fleetapi.ProbeAnswer{Probe: p})
		return ExitOK
	}
	inv.ui.fields(append([][2]cell{{plain("host"), plain(inv.args[0])}}, inv.probeRows(&p)...))
	return ExitOK
}

func (inv *invocation) hostsDrain(name string, asJSON bool) int {
	if err := inv.connect(); err != nil {
		return inv.fail(err)
	}
	id := inv.args[0]
	var d fleetclient.HostDrained
	var err error
	if name == "drain" {
		d, err = inv.client.DrainHost(inv.ctx, id)
	} else {
		d, err = inv.client.ResumeHost(inv.ctx, id)
	}
	var apiErr *fleetclient.Error
	refused := errors.As(err, &apiErr) && apiErr.Status == http.StatusConflict && d.HostID != ""
	if err != nil && !refused {
		return inv.fail(err)
	}
	if asJSON {
		inv.ui.document(d.HostDrain)
	}
	idle := ""
	if d.Idle != nil && *d.Idle {
		idle = "; it runs nothing now"
	}
	switch {
	case refused && name == "drain":
		inv.ui.errorf("host %s refused the drain (%s): Fleet routes no new run to it all the same", id, apiErr.Message)
		return ExitError
	case refused:
		inv.ui.errorf("host %s refused the resume (%s): it stays drained", id, apiErr.Message)
		return ExitError
	case d.Accepted != fleetapi.Accepted:
		inv.ui.errorf("host %s may or may not have taken the %s (%s); check with runfleet hosts get %s%s", id, name, sanitize(d.Detail), id, inv.flagHint())
		return ExitError
	case !asJSON && name == "drain":
		inv.ui.notef("Host %s is draining: it takes no new run%s.", id, idle)
	case !asJSON:
		inv.ui.notef("Host %s takes new runs again.", id)
	}
	return ExitOK
}
