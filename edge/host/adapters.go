package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/runfleet/runfleet/edge/ca"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// ProxyBroker is the secrets proxy (package proxy) as the runner's Broker.
type ProxyBroker struct {
	Proxy *proxy.Proxy
}

var _ Broker = ProxyBroker{}

// Ready is the proxy's own readiness (up, not killed, its CA ready).
func (b ProxyBroker) Ready() error { return b.Proxy.Ready() }

// Ungranted asks the proxy whether the policy in force grants every
// declared key, and names the first it does not.
func (b ProxyBroker) Ungranted(secrets []hostproto.Secret) (string, string) {
	err := b.Proxy.CheckGrant(secrets)
	var notGranted *policy.NotGrantedError
	switch {
	case err == nil:
		return "", ""
	case errors.As(err, &notGranted) && len(notGranted.Refused) > 0:
		return notGranted.Refused[0].Ref.String(), notGranted.Refused[0].Reason
	}
	return "the declared secrets", err.Error()
}

// Register registers the task and returns its placeholders by key name and
// RUNFLEET_PROXIED_KEYS. A key the policy stopped granting since the
// admission's check is a key_not_granted refusal.
func (b ProxyBroker) Register(runID string, secrets []hostproto.Secret) (TaskSecrets, error) {
	if err := b.Proxy.Register(runID, secrets); err != nil {
		var notGranted *policy.NotGrantedError
		if errors.As(err, &notGranted) {
			return TaskSecrets{}, &Refusal{Reason: hostproto.ReasonKeyNotGranted, Detail: notGranted.Error()}
		}
		return TaskSecrets{}, err
	}
	keys, err := b.Proxy.TaskKeys(runID)
	if err != nil {
		return TaskSecrets{}, err
	}
	proxied, err := b.Proxy.ProxiedKeys(runID)
	if err != nil {
		return TaskSecrets{}, err
	}
	raw, err := json.Marshal(proxied)
	if err != nil {
		return TaskSecrets{}, fmt.Errorf("encoding RUNFLEET_PROXIED_KEYS: %w", err)
	}
	ts := TaskSecrets{Placeholders: make(map[string]string, len(keys)), ProxiedKeys: raw}
	for _, k := range keys {
		ts.Placeholders[k.Key] = k.Placeholder
	}
	return ts, nil
}

// Registered reports whether the proxy still holds the task.
func (b ProxyBroker) Registered(runID string) bool {
	_, err := b.Proxy.TaskKeys(runID)
	return err == nil
}

// StartAttempt mints the attempt's credential.
func (b ProxyBroker) StartAttempt(runID string) (string, error) {
	u, err := b.Proxy.StartAttempt(runID)
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// EndAttempt revokes the attempt's credential and closes its connections.
func (b ProxyBroker) EndAttempt(runID string) { b.Proxy.EndAttempt(runID) }

// Drop forgets the task and its placeholders.
func (b ProxyBroker) Drop(runID string) error { return b.Proxy.Drop(runID) }

// CATrust is the proxy's CA (package ca) as the runner's TrustSource.
type CATrust struct {
	CA    *ca.Authority
	Clock clock.Clock
}

var _ TrustSource = CATrust{}

// Bundle is the CA bundle: the signer, then its successor if any.
func (c CATrust) Bundle() []byte { return c.CA.Bundle() }

// Valid is nil while the signer is valid at the clock's now.
func (c CATrust) Valid() error {
	if !c.CA.Status().Valid(c.Clock.Now()) {
		return errors.New("the CA's signer is not valid now")
	}
	return nil
}

// WatchTrust subscribes listener to the CA's bundle deliveries.
func (c CATrust) WatchTrust(listener func(ctx context.Context, bundle []byte) error) (func() error, error) {
	return c.CA.WatchTrust(listener)
}
