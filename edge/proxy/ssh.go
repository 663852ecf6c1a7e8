package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy/placeholder"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/edge/sshfront"
)

// errNoSSHFront refuses the runs of an ssh key on an edge built without
// its SSH front.
var errNoSSHFront = errors.New("this edge serves no SSH front")

// serveSSH hands a connection decided policy.TerminateSSH to the SSH
// front, which decides each command against the task's keys as they are
// then.
func (p *Proxy) serveSSH(a *attempt, c net.Conn, target policy.Authority, ix *placeholder.Index, entry audit.Entry) {
	if p.cfg.SSH == nil {
		entry.Action, entry.Status, entry.Reason = audit.Denied, http.StatusServiceUnavailable, errNoSSHFront.Error()
		entry.Duration = p.cfg.Clock.Now().Sub(entry.TS)
		p.cfg.Audit.Record(entry)
		return
	}
	p.cfg.SSH.Serve(c, sshfront.Session{
		Task:      a.task.runID,
		Authority: target,
		Via:       entry.Via,
		Granted:   func() []policy.Granted { return a.task.grantsUnder(p.cfg.Policy.Current()).granted },
		Redact:    ix.Redacted,
	})
}

// checkSSHKeys reads each granted ssh key's private key at registration:
// a run whose key is missing, encrypted or not a key is refused with the
// reason, never started to fail at its first git command.
func (p *Proxy) checkSSHKeys(granted []policy.Granted) error {
	for _, g := range granted {
		if g.SSH == nil {
			continue
		}
		if p.cfg.SSH == nil {
			return fmt.Errorf("ssh key %s: %w", g.Ref, errNoSSHFront)
		}
		ctx, cancel := context.WithTimeout(context.Background(), awsStartTimeout)
		v, err := p.cfg.Secrets.Value(ctx, g.Ref.Project, g.Ref.Key)
		cancel()
		if errors.Is(err, secrets.ErrNotFound) {
			return fmt.Errorf("ssh key %s: the secrets source holds no value for it", g.Ref)
		}
		if err != nil {
			return fmt.Errorf("ssh key %s: %w", g.Ref, err)
		}
		if _, err := sshfront.ParsePrivateKey(g.Ref, v); err != nil {
			return err
		}
	}
	return nil
}

// SSHKnownHosts is the known_hosts text of the run's task: edge's host
// key under each domain its ssh keys reach now, nil when it has none.
func (p *Proxy) SSHKnownHosts(runID string) ([]byte, error) {
	t, err := p.task(runID)
	if err != nil {
		return nil, err
	}
	if p.cfg.SSH == nil {
		return nil, nil
	}
	var domains []policy.Domain
	for _, g := range t.grantsUnder(p.cfg.Policy.Current()).granted {
		if g.SSH == nil {
			continue
		}
		for _, d := range g.Domains {
			if !slices.Contains(domains, d) {
				domains = append(domains, d)
			}
		}
	}
	if len(domains) == 0 {
		return nil, nil
	}
	return sshfront.KnownHosts(p.cfg.SSH.HostKey(), domains), nil
}
