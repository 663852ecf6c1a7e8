package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/runfleet/runfleet/edge/ca"
	"github.com/runfleet/runfleet/edge/ledger"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy"
	"github.com/runfleet/runfleet/edge/runner"
	"github.com/runfleet/runfleet/edge/sandbox"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
)

// The runner knows the secrets proxy and the CA only as its Broker and
// TrustSource; the host, which assembles the parts, adapts them here.

// proxyBroker is the secrets proxy as the runner's Broker. An attempt's
// start also reopens the run's egress ledger (a retry appends to the
// sealed chain), when there is one.
type proxyBroker struct {
	proxy  *proxy.Proxy
	ledger *ledger.Ledger // nil: none
}

var _ runner.Broker = proxyBroker{}

// Ready is the proxy's own readiness (up, not killed, its CA ready).
func (b proxyBroker) Ready() error { return b.proxy.Ready() }

// Ungranted asks the proxy whether the policy in force grants every
// declared key, and names the first it does not.
func (b proxyBroker) Ungranted(declared []runspec.Declared) (string, string) {
	err := b.proxy.CheckGrant(declared)
	var notGranted *policy.NotGrantedError
	switch {
	case err == nil:
		return "", ""
	case errors.As(err, &notGranted) && len(notGranted.Refused) > 0:
		return notGranted.Refused[0].Ref.String(), notGranted.Refused[0].Reason
	}
	return "the declared secrets", err.Error()
}

// CheckCredentials asks the proxy whether the policy in force takes from
// Fleet exactly the keys given values, and returns the policy's sentence
// naming the first that disagrees.
func (b proxyBroker) CheckCredentials(declared []runspec.Declared, given []runner.Credential, complete bool) string {
	refs := make([]policy.KeyRef, len(given))
	for i, c := range given {
		refs[i] = policy.KeyRef{Project: c.ProjectID, Key: c.Key}
	}
	if r := b.proxy.CheckFleetValues(declared, refs, complete); r != nil {
		return r.Reason
	}
	return ""
}

// Register registers the task, gives it the values from Fleet it came
// with, and returns its placeholders by key name and
// RUNFLEET_PROXIED_KEYS. A key the policy stopped granting since the
// admission's check is a key_not_granted refusal.
func (b proxyBroker) Register(runID string, declared []runspec.Declared, creds []runner.Credential) (runner.TaskSecrets, error) {
	if err := b.proxy.Register(runID, declared); err != nil {
		var notGranted *policy.NotGrantedError
		if errors.As(err, &notGranted) {
			return runner.TaskSecrets{}, &runner.Refusal{Reason: hostproto.ReasonKeyNotGranted, Detail: notGranted.Error()}
		}
		return runner.TaskSecrets{}, err
	}
	if len(creds) > 0 {
		if err := b.proxy.SetCredentials(runID, proxyCredentials(creds)); err != nil {
			return runner.TaskSecrets{}, err
		}
	}
	keys, err := b.proxy.TaskKeys(runID)
	if err != nil {
		return runner.TaskSecrets{}, err
	}
	proxied, err := b.proxy.ProxiedKeys(runID)
	if err != nil {
		return runner.TaskSecrets{}, err
	}
	raw, err := json.Marshal(proxied)
	if err != nil {
		return runner.TaskSecrets{}, fmt.Errorf("encoding RUNFLEET_PROXIED_KEYS: %w", err)
	}
	knownHosts, err := b.proxy.SSHKnownHosts(runID)
	if err != nil {
		return runner.TaskSecrets{}, err
	}
	ts := runner.TaskSecrets{Placeholders: make(map[string]string, len(keys)), ProxiedKeys: raw, SSHKnownHosts: knownHosts}
	for _, k := range keys {
		ts.Placeholders[k.Var] = k.Placeholder
	}
	return ts, nil
}

// PutCredentials replaces the run's values from Fleet in the proxy.
func (b proxyBroker) PutCredentials(runID string, creds []runner.Credential) error {
	return b.proxy.SetCredentials(runID, proxyCredentials(creds))
}

// MissingCredentials asks the proxy which keys the run takes from Fleet
// it holds no usable value for.
func (b proxyBroker) MissingCredentials(runID string, declared []runspec.Declared) []string {
	return b.proxy.MissingCredentials(runID, declared)
}

func proxyCredentials(creds []runner.Credential) []proxy.Credential {
	out := make([]proxy.Credential, len(creds))
	for i, c := range creds {
		out[i] = proxy.Credential{Ref: policy.KeyRef{Project: c.ProjectID, Key: c.Key}, Value: c.Value, ExpiresAt: c.ExpiresAt}
	}
	return out
}

// Registered reports whether the proxy still holds the task.
func (b proxyBroker) Registered(runID string) bool {
	_, err := b.proxy.TaskKeys(runID)
	return err == nil
}

// StartAttempt mints the attempt's credential, the run's ledger unsealed
// first: no seal stands for it while an attempt lives.
func (b proxyBroker) StartAttempt(runID string) (string, error) {
	if b.ledger != nil {
		b.ledger.Reopen(runID)
	}
	u, err := b.proxy.StartAttempt(runID)
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// ServeNetwork hands the task's network to the proxy.
func (b proxyBroker) ServeNetwork(runID string, ls sandbox.Listeners) error {
	return b.proxy.ServeNetwork(runID, proxy.TaskNetwork{
		Explicit: ls.Explicit, Transparent: ls.Transparent, OriginalDestination: sandbox.OriginalDestination,
		DNSPackets: ls.DNSPackets, DNSStreams: ls.DNSStreams,
	})
}

// EndAttempt revokes the attempt's credential and closes its connections.
func (b proxyBroker) EndAttempt(runID string) { b.proxy.EndAttempt(runID) }

// Drop forgets the task and its placeholders.
func (b proxyBroker) Drop(runID string) error { return b.proxy.Drop(runID) }

// caTrust is the proxy's CA as the runner's TrustSource.
type caTrust struct {
	ca    *ca.Authority
	clock clock.Clock
}

var _ runner.TrustSource = caTrust{}

// Bundle is the CA bundle: the signer, then its successor if any.
func (c caTrust) Bundle() []byte { return c.ca.Bundle() }

// Valid is nil while the signer is valid at the clock's now.
func (c caTrust) Valid() error {
	if !c.ca.Status().Valid(c.clock.Now()) {
		return errors.New("the CA's signer is not valid now")
	}
	return nil
}

// WatchTrust subscribes listener to the CA's bundle deliveries.
func (c caTrust) WatchTrust(listener func(ctx context.Context, bundle []byte) error) (func() error, error) {
	return c.ca.WatchTrust(listener)
}
