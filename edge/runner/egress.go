package runner

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/runfleet/runfleet/edge/sandbox"
)

// EgressConfiner is the edge-wide backstop of tasks' confinement: once
// installed, a socket opened in edge's own network namespace by a process
// whose group id lies in the range sends nothing. Tasks run with their
// run's own group id from Config.TaskGroups, which they cannot shed, and in
// networks of their own, where it does not apply. sandbox.NFTables
// implements it.
type EgressConfiner interface {
	// Install confines the groups firstGID to lastGID, replacing what an
	// earlier Install left (an edge that crashed included) atomically.
	Install(firstGID, lastGID uint32) error
	// Remove lifts the confinement; none installed is no error.
	Remove() error
}

// egressVerdict is what New does about tasks' egress.
type egressVerdict int

const (
	// egressRefuse: edge does not start; the decision says why. The zero value.
	egressRefuse egressVerdict = iota
	// egressConfine: install the confinement; failing that, refuse.
	egressConfine
	// egressOpen: tasks reach the network directly, as configured.
	egressOpen
	// egressNoTasks: edge can run no task here (it cannot switch users and
	// runner.insecureSameUser is off), so every run is refused
	// host_unavailable and there is nothing to confine: edge starts, as
	// DESIGN.md has it, and says why it is not usable.
	egressNoTasks
)

// egressFacts are what decides the handling of tasks' egress, at New.
type egressFacts struct {
	// Mode is runner.egress.
	Mode string
	// OwnGroups: tasks run as runner.user with their run's own group id
	// (edge is root), the group the confinement matches on.
	OwnGroups bool
	// SameUser: tasks run as edge itself (runner.insecureSameUser).
	SameUser bool
}

type egressDecision struct {
	Verdict egressVerdict
	Reason  string
}

// decideEgress decides how tasks' egress is handled: confined where it
// can be, open only where runner.egress says insecureOpen, and otherwise
// edge refuses to start rather than run tasks that could reach the
// network, and the metadata service, around the proxy.
func decideEgress(f egressFacts) egressDecision {
	switch {
	case f.Mode == TaskEgressInsecureOpen:
		return egressDecision{egressOpen, "runner.egress is insecureOpen: tasks reach the network directly, the cloud metadata service included"}
	case f.Mode != TaskEgressConfined:
		return egressDecision{egressRefuse, "runner.egress " + f.Mode + " is neither " + TaskEgressConfined + " nor " + TaskEgressInsecureOpen}
	case f.OwnGroups:
		return egressDecision{egressConfine, "each task runs in a network of its own whose one way out is edge"}
	case f.SameUser:
		return egressDecision{egressRefuse, "tasks run as edge's own user (runner.insecureSameUser), so their sockets cannot be told from edge's and confined; set runner.egress to " + TaskEgressInsecureOpen + " as well to run them with open network access"}
	}
	return egressDecision{egressNoTasks, "edge is not root, so it runs no task (runs are refused host_unavailable) and has no task to confine; run edge as root"}
}

// egressTable names the nftables table of the edge whose work dir is
// workDir (edgeID).
func egressTable(workDir string) string { return "runfleet_edge_" + edgeID(workDir) }

// edgeID names what the edge whose work dir is workDir holds on the host
// beside its data dir (its nftables table, its tasks' control groups):
// stable across its restarts (what a crashed edge left is found and
// replaced), and its own where several edges share a machine (tests), so
// one stopping never touches another's.
func edgeID(workDir string) string {
	sum := sha256.Sum256([]byte(workDir))
	return hex.EncodeToString(sum[:6])
}

// confineEgress decides how tasks' egress is handled and installs the
// confinement where it is due; an error refuses the start.
func (r *Runner) confineEgress() error {
	d := decideEgress(egressFacts{Mode: r.cfg.Egress, OwnGroups: r.ident.Switch, SameUser: r.sameUser})
	switch d.Verdict {
	case egressOpen:
		r.logger.Warn("tasks' egress is not confined", fieldReason, d.Reason)
		return nil
	case egressNoTasks:
		r.logger.Warn("no task can run on this edge", fieldReason, d.Reason)
		return nil
	case egressConfine:
		// A network of its own for every task is the confinement; one is
		// made here first, so a host where that fails refuses the start
		// rather than every task.
		n, err := sandbox.NewNetwork(sandbox.NetworkConfig{Serve: true, ExplicitPort: probePort, NFT: r.cfg.NFT})
		if err != nil {
			return fmt.Errorf("runner: runner.egress %s: creating a task's network: %w (set runner.egress to %s to start without confinement)", r.cfg.Egress, err, TaskEgressInsecureOpen)
		}
		n.Close()
		g := r.cfg.TaskGroups
		if err := r.cfg.Confiner.Install(g.First, g.First+g.Count-1); err != nil {
			return fmt.Errorf("runner: runner.egress %s: confining tasks' egress: %w (set runner.egress to %s to start without confinement)", r.cfg.Egress, err, TaskEgressInsecureOpen)
		}
		r.egressConfined.Store(true)
		r.logger.Info("each task runs in a network of its own", "firstGid", g.First, "lastGid", g.First+g.Count-1)
		return nil
	}
	return errors.New("runner: runner.egress: " + d.Reason)
}

// probePort is the explicit proxy's port in the network made to check that
// tasks' networks can be made.
const probePort = 7071

// openNetwork makes the attempt's network: served by the proxy (its DNS,
// its redirected connections, its explicit proxy at the port of its
// HTTPS_PROXY) for a task that declares secrets; a loopback alone for one
// that does not, which has no way off its host at all.
func (r *Runner) openNetwork(t *task) (*sandbox.Network, error) {
	cfg := sandbox.NetworkConfig{NFT: r.cfg.NFT}
	if t.needsBroker {
		t.mu.Lock()
		proxyURL := t.proxyURL
		t.mu.Unlock()
		u, err := url.Parse(proxyURL)
		if err != nil {
			return nil, errors.New("the task's proxy URL does not parse")
		}
		port, err := strconv.Atoi(u.Port())
		if err != nil {
			return nil, fmt.Errorf("the task's proxy URL has no port")
		}
		cfg.Serve, cfg.ExplicitPort = true, port
	}
	n, err := sandbox.NewNetwork(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Serve {
		if err := r.broker.ServeNetwork(t.runID, n.Listeners); err != nil {
			n.Close()
			return nil, fmt.Errorf("serving the task's network: %w", err)
		}
	}
	return n, nil
}

// liftEgress removes the confinement once no task is left to confine.
func (r *Runner) liftEgress() error {
	if !r.egressConfined.CompareAndSwap(true, false) {
		return nil
	}
	if err := r.cfg.Confiner.Remove(); err != nil {
		return fmt.Errorf("runner: lifting the egress confinement: %w", err)
	}
	return nil
}

// Precheck finds, changing nothing, the reasons New would refuse cfg (one
// Validate accepts) that do not need New's own work to find: no system
// roots file, and tasks' egress as decideEgress decides it on this host (a
// contradiction such as runner.insecureSameUser with egress confined, or
// confinement without the nft executable). Each error names its setting.
// What only making a task's network can tell (a kernel without network
// namespaces) is left to New.
func Precheck(cfg Config) []error {
	cfg.defaults()
	var errs []error
	switch {
	case cfg.SystemRootsFile == "":
		errs = append(errs, fmt.Errorf("runner: no system roots file: edge looked for %s (install ca-certificates)", strings.Join(sandbox.TrustStoreFiles, ", ")))
	default:
		if _, err := os.Stat(cfg.SystemRootsFile); err != nil {
			errs = append(errs, fmt.Errorf("runner: the system roots: %w", err))
		}
	}
	ident, sameUser, identErr := resolveIdentity(cfg)
	if identErr != nil || cfg.Egress != TaskEgressConfined && cfg.Egress != TaskEgressInsecureOpen {
		// Without an identity edge starts and refuses every run (Usable
		// says why): not a refusal of the start. Another mode is the
		// config's to name (Validate).
		return errs
	}
	d := decideEgress(egressFacts{Mode: cfg.Egress, OwnGroups: ident.Switch, SameUser: sameUser})
	switch d.Verdict {
	case egressRefuse:
		errs = append(errs, errors.New("runner.egress: "+d.Reason))
	case egressConfine:
		if _, err := exec.LookPath(cfg.NFT); err != nil {
			errs = append(errs, fmt.Errorf("runner.egress %s: the nft executable %s: %w (install nftables, or set runner.egress to %s to start without confinement)",
				cfg.Egress, cfg.NFT, err, TaskEgressInsecureOpen))
		}
	}
	return errs
}
