package fleet

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
)

// Exclusion reasons, in the order a refusal lists them.
const (
	ExcludedDisabled              = "disabled"
	ExcludedNeverProbed           = "never_probed"
	ExcludedStaleProbe            = "stale_probe"
	ExcludedUnhealthy             = "unhealthy"
	ExcludedDraining              = "draining"
	ExcludedStorageLow            = "storage_low"
	ExcludedAgentUnsupported      = "agent_unsupported"
	ExcludedLabelMissing          = "label_missing"
	ExcludedRepositoryUnavailable = "repository_unavailable"
	ExcludedSecretsUnsupported    = "secrets_unsupported"
	// ExcludedHostBusy leaves out, for a dispatch that may wait
	// (RouteInput.QueueWhenFull), a host whose last probe showed it full;
	// also the reason of a host that refused a start for want of room.
	ExcludedHostBusy = hostproto.ReasonHostBusy
)

// RouteInput is everything routing decides from. Routing is a pure function
// of it: no I/O, no clock.
type RouteInput struct {
	// Hosts are the candidates: every host the caller may see, or only the
	// one it named.
	Hosts []store.Host
	Agent string
	// Labels must all be present, with equal values, on the host.
	Labels map[string]string
	// Repository and LocalPath are the request's; a LocalPath the host
	// lacks is served by cloning Repository when RepoURLs maps it.
	Repository string
	LocalPath  string
	// NeedsSecrets: the run declares secrets, so the host must report
	// secretsProxy and execRequire.
	NeedsSecrets bool
	// RepoURLs is the repository map (repository -> clone URL).
	RepoURLs map[string]string
	// Now and MaxProbeAge judge staleness.
	Now         time.Time
	MaxProbeAge time.Duration
	// Refused are the hosts that refused this very dispatch already, each
	// with the reason it gave: they are excluded for it.
	Refused map[string]string
	// QueueWhenFull: the dispatch waits in the queue when no host takes it
	// now, so a host whose last probe showed it full is excluded
	// (ExcludedHostBusy) rather than tried last: the run is queued at once
	// and that host's run ends wake it, where an offer would most likely
	// cost a refused start and a trip back to the queue. Hosts with free
	// or unknown load are tried as for any dispatch.
	QueueWhenFull bool
}

// Exclusion is one host routing left out, with every reason that applied.
type Exclusion struct {
	HostID  string   `json:"hostId"`
	Reasons []string `json:"reasons"`
	// Agents are the agents the host offers, when it was excluded for
	// agent_unsupported: what the caller could ask for instead.
	Agents []string `json:"agents,omitempty"`
	// Detail is what the host said, when it refused the dispatch itself
	// (a transient refusal the dispatch went past).
	Detail string `json:"detail,omitempty"`
}

// Unrouted is the Details of a CodeNoEligibleHost refusal: every host
// routing excluded, and, when routing read only part of the routing view
// of a larger fleet, how many hosts it considered (Considered) of how many
// (Hosts, only for a caller that may use every host: others learn nothing
// of hosts outside their scope). The api shows it as
// fleetapi.NoEligibleHost.
type Unrouted struct {
	Considered *int        `json:"considered,omitempty"`
	Excluded   []Exclusion `json:"excluded"`
	Hosts      *int        `json:"hosts,omitempty"`
}

// Decision is routing's answer. Host is nil when every candidate was
// excluded; Excluded lists each excluded host either way.
type Decision struct {
	Host *store.Host
	// LocalPath is what to send the host: the request's, or "" when it was
	// replaced by CloneURL.
	LocalPath string
	// CloneURL is the repository map's URL for the request's repository, if any.
	CloneURL string
	// RewroteLocalPath: the host lacks LocalPath and clones instead.
	RewroteLocalPath bool
	Excluded         []Exclusion
	// Reason explains the choice or the refusal, for logs and the 409.
	Reason string
}

// Route picks a host for a run. A host is eligible when no exclusion reason
// applies; among eligible hosts it prefers one that has the local path (no
// rewrite), then as preferLoad orders them (free slots, load, latency, id),
// so the choice is deterministic. Deny by default: no candidates, no host.
func Route(in RouteInput) Decision {
	type candidate struct {
		host    store.Host
		rewrite bool
	}
	var eligible []candidate
	d := Decision{Excluded: []Exclusion{}}
	cloneURL := in.RepoURLs[in.Repository]
	if in.Repository == "" {
		cloneURL = ""
	}
	for _, h := range in.Hosts {
		reasons, rewrite := exclusions(in, h, cloneURL)
		if len(reasons) > 0 {
			e := Exclusion{HostID: h.ID, Reasons: reasons}
			if slices.Contains(reasons, ExcludedAgentUnsupported) {
				e.Agents = slices.Clone(h.Probe.Agents)
			}
			if _, refused := in.Refused[h.ID]; !refused && slices.Contains(reasons, ExcludedHostBusy) {
				l := h.Probe.Load
				e.Detail = fmt.Sprintf("its last probe (%s) showed it full: %d of %d slots in use; the run waits for one to free",
					h.Probe.At.UTC().Format(time.RFC3339), l.Active, l.MaxConcurrent)
			}
			d.Excluded = append(d.Excluded, e)
			continue
		}
		eligible = append(eligible, candidate{host: h, rewrite: rewrite})
	}
	sort.Slice(d.Excluded, func(i, j int) bool { return d.Excluded[i].HostID < d.Excluded[j].HostID })
	if len(eligible) == 0 {
		d.Reason = refusalReason(in.Agent, d.Excluded)
		return d
	}
	sort.Slice(eligible, func(i, j int) bool {
		a, b := eligible[i], eligible[j]
		if a.rewrite != b.rewrite {
			return !a.rewrite
		}
		return preferLoad(a.host, b.host)
	})
	best := eligible[0]
	d.Host = &best.host
	d.CloneURL = cloneURL
	d.LocalPath = in.LocalPath
	if best.rewrite {
		d.LocalPath = ""
		d.RewroteLocalPath = true
	}
	d.Reason = fmt.Sprintf("host %s chosen from %d eligible", best.host.ID, len(eligible))
	return d
}

// preferLoad reports whether routing should try a before b, both with an ok
// probe: first the hosts whose last probe showed a free slot, then those
// that did not say (older than the field), then those it showed full (a
// probe is up to a minute old: a full host may have room by now, so it is
// tried last, not left out, unless the dispatch may wait: QueueWhenFull); within each, the lower share of slots in use,
// then more free slots, then the lower probe latency, then the smaller id.
func preferLoad(a, b store.Host) bool {
	ta, tb := loadTier(a.Probe.Load), loadTier(b.Probe.Load)
	if ta != tb {
		return ta < tb
	}
	if la, lb := a.Probe.Load, b.Probe.Load; la != nil && lb != nil && la.MaxConcurrent > 0 && lb.MaxConcurrent > 0 {
		// active/max compared without division.
		if x, y := la.Active*lb.MaxConcurrent, lb.Active*la.MaxConcurrent; x != y {
			return x < y
		}
		if fa, fb := la.MaxConcurrent-la.Active, lb.MaxConcurrent-lb.Active; fa != fb {
			return fa > fb
		}
	}
	if a.Probe.LatencyMs != b.Probe.LatencyMs {
		return a.Probe.LatencyMs < b.Probe.LatencyMs
	}
	return a.ID < b.ID
}

// loadTier: 0 a free slot, 1 load unknown, 2 full.
func loadTier(l *store.Load) int {
	switch {
	case l == nil:
		return 1
	case l.Active < l.MaxConcurrent:
		return 0
	}
	return 2
}

// exclusions lists every reason h cannot take the run, and whether it can
// only take it by cloning instead of using the local path.
func exclusions(in RouteInput, h store.Host, cloneURL string) (reasons []string, rewrite bool) {
	if reason, ok := in.Refused[h.ID]; ok {
		reasons = append(reasons, reason)
	}
	if !h.Enabled {
		reasons = append(reasons, ExcludedDisabled)
	}
	// What the host offers (draining, storage, agents, features) is known
	// only from an ok probe; without one, never_probed or unhealthy says why.
	p := h.Probe
	var offer *store.Probe
	switch {
	case p == nil:
		reasons = append(reasons, ExcludedNeverProbed)
	default:
		if in.Now.Sub(p.At) > in.MaxProbeAge {
			reasons = append(reasons, ExcludedStaleProbe)
		}
		if p.Status != store.ProbeOK {
			reasons = append(reasons, ExcludedUnhealthy)
		} else {
			offer = p
		}
	}
	if offer != nil && offer.Draining {
		reasons = append(reasons, ExcludedDraining)
	}
	// A host older than the storage field (nil) is not low.
	if offer != nil && offer.Storage != nil && offer.Storage.Low {
		reasons = append(reasons, ExcludedStorageLow)
	}
	if offer != nil && in.Agent != "" && !slices.Contains(offer.Agents, in.Agent) {
		reasons = append(reasons, ExcludedAgentUnsupported)
	}
	for k, v := range in.Labels {
		if hv, ok := h.Labels[k]; !ok || hv != v {
			reasons = append(reasons, ExcludedLabelMissing)
			break
		}
	}
	if in.LocalPath != "" && !hasLocalPath(h.LocalPaths, in.LocalPath) {
		if cloneURL == "" {
			reasons = append(reasons, ExcludedRepositoryUnavailable)
		} else {
			rewrite = true
		}
	}
	if in.NeedsSecrets && offer != nil && (!offer.Features.SecretsProxy || !offer.Features.ExecRequire) {
		reasons = append(reasons, ExcludedSecretsUnsupported)
	}
	if in.QueueWhenFull && offer != nil && loadTier(offer.Load) == 2 && !slices.Contains(reasons, ExcludedHostBusy) {
		reasons = append(reasons, ExcludedHostBusy)
	}
	return reasons, rewrite
}

// hasLocalPath reports whether want is one of roots or lies under one.
func hasLocalPath(roots []string, want string) bool {
	want = path.Clean(want)
	for _, r := range roots {
		r = path.Clean(r)
		if want == r || strings.HasPrefix(want, strings.TrimSuffix(r, "/")+"/") {
			return true
		}
	}
	return false
}

// refusalReason is the 409's message: every host with its reasons, and,
// when the agent is what some lack, the agents they do offer.
func refusalReason(agent string, excluded []Exclusion) string {
	if len(excluded) == 0 {
		return "no eligible host: no host is registered that this caller may use"
	}
	parts := make([]string, len(excluded))
	var offered []string
	unsupported := false
	for i, e := range excluded {
		parts[i] = fmt.Sprintf("%s (%s)", e.HostID, strings.Join(e.Reasons, ", "))
		if slices.Contains(e.Reasons, ExcludedAgentUnsupported) {
			unsupported = true
			offered = append(offered, e.Agents...)
		}
	}
	msg := "no eligible host: " + strings.Join(parts, "; ")
	if unsupported {
		slices.Sort(offered)
		offered = slices.Compact(offered)
		if len(offered) == 0 {
			msg += fmt.Sprintf("; agent %q is not offered, and those hosts offer no agent", agent)
		} else {
			msg += fmt.Sprintf("; agent %q is not offered: those hosts offer %s", agent, strings.Join(offered, ", "))
		}
	}
	return msg
}

// LoadRepoURLs reads the repository map file (RUNFLEET_REPO_URLS=file:<path>):
// a JSON object mapping repository -> clone URL. "" is an empty map. A
// malformed map fails loudly: quietly having no map would look like routing
// refusing work it should accept.
func LoadRepoURLs(path string) (map[string]string, error) {
	if path == "" {
		return map[string]string{}, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fleet: reading the repository map: %w", err)
	}
	var m map[string]string
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("fleet: repository map %s is not a JSON object of strings: %w", path, err)
	}
	for repo, u := range m {
		parsed, err := url.Parse(u)
		if repo == "" || err != nil || parsed.Scheme == "" || (parsed.Host == "" && parsed.Scheme != "file") {
			// The URL is not quoted: it may carry a credential.
			return nil, fmt.Errorf("fleet: repository map %s: the entry for %q is not an absolute clone URL", path, repo)
		}
	}
	if m == nil {
		m = map[string]string{}
	}
	return m, nil
}

// The routing view's lists: one per agent the fleet offers, and one for
// any agent, used when the requested agent has no list of its own.
//
// The view is written by the probe pass (and by the admin verbs on one
// host) and read by dispatch (routeByView): shard 0 of a list, more only
// while no host read can take the run (at most store.RouteShardsMax), then
// the chosen host strongly consistent. A list keeps the hosts most likely
// to take a run first, so truncating it past its shards loses the least
// likely; a request only such hosts could take is refused with how many
// hosts were considered of how many. A view is at most one probe interval
// old; what changed on the chosen host since is caught by its re-read.
const (
	RouteListAny = "any"
	// MaxRouteLists bounds the agent lists a view writes (the probe's
	// write cost is per list); agents beyond it, those fewest hosts can
	// take, route over the "any" list.
	MaxRouteLists = 32
)

// RouteList is the view's list for agent.
func RouteList(agent string) string { return "a:" + agent }

// BuildRouteView orders every host for each list: first the hosts routable
// for the list's agent (enabled, an ok probe no older than maxProbeAge at
// now, not draining, storage not low, offering the agent; for "any", any
// agent), as Route prefers them (preferLoad); then all the others by id. Routing reads a list's leading shards only, so the hosts
// most likely to take a run come first. Pure: the probe pass calls it with
// the hosts it holds.
func BuildRouteView(hosts []store.Host, now time.Time, maxProbeAge time.Duration) store.RouteView {
	offered := map[string]int{}
	for _, h := range hosts {
		if h.Probe != nil && h.Probe.Status == store.ProbeOK {
			for _, a := range slices.Compact(slices.Sorted(slices.Values(h.Probe.Agents))) {
				offered[a]++
			}
		}
	}
	agents := make([]string, 0, len(offered))
	for a := range offered {
		agents = append(agents, a)
	}
	sort.Slice(agents, func(i, j int) bool {
		if offered[agents[i]] != offered[agents[j]] {
			return offered[agents[i]] > offered[agents[j]]
		}
		return agents[i] < agents[j]
	})
	if len(agents) > MaxRouteLists {
		agents = agents[:MaxRouteLists]
	}
	v := store.RouteView{Lists: map[string][]store.Host{RouteListAny: orderFor(hosts, "", now, maxProbeAge)}, Total: len(hosts), At: now.UTC()}
	for _, a := range agents {
		v.Lists[RouteList(a)] = orderFor(hosts, a, now, maxProbeAge)
	}
	return v
}

// orderFor is one list of BuildRouteView.
func orderFor(hosts []store.Host, agent string, now time.Time, maxProbeAge time.Duration) []store.Host {
	in := RouteInput{Agent: agent, Now: now, MaxProbeAge: maxProbeAge}
	routable := make(map[string]bool, len(hosts))
	for _, h := range hosts {
		reasons, _ := exclusions(in, h, "")
		routable[h.ID] = len(reasons) == 0
	}
	out := slices.Clone(hosts)
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if routable[a.ID] != routable[b.ID] {
			return routable[a.ID]
		}
		if routable[a.ID] {
			return preferLoad(a, b)
		}
		return a.ID < b.ID
	})
	return out
}
