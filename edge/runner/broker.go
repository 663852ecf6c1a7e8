package runner

import (
	"context"
	"encoding/json"

	"github.com/runfleet/runfleet/edge/sandbox"
	"github.com/runfleet/runfleet/shared/runspec"
)

// Broker is the secrets proxy as the runner needs it: its readiness, the
// host policy's grants, and its registry of tasks. A task's proxy user is its
// run id. Implementations are safe for concurrent use.
type Broker interface {
	// Ready returns nil when the proxy is up and not killed
	// (EDGE_SECRETS_PROXY=off keeps it down), else why not.
	Ready() error
	// Ungranted returns the first declared secret the host policy does not
	// grant right now, as "project/KEY", with the policy's reason; "" when it
	// grants them all. A reload of the policy applies to the next call.
	Ungranted(declared []runspec.Declared) (key, reason string)
	// CheckCredentials returns "" when the host policy in force takes
	// from Fleet ("source": "fleet") each key given a value and, when
	// complete (the run's start), every declared key it takes from Fleet
	// has one; else why not, naming the first key that disagrees and never
	// a value (admission refuses key_not_granted with it; a PUT of values
	// answers 400). It reads the keys of given only.
	CheckCredentials(declared []runspec.Declared, given []Credential, complete bool) string
	// Register declares the run's secrets to the proxy (again, for a retry)
	// and returns the task's view of them. Registering a known run keeps its
	// placeholders, and the values from Fleet it holds but for those of
	// creds, which it takes (none for a retry).
	Register(runID string, declared []runspec.Declared, creds []Credential) (TaskSecrets, error)
	// PutCredentials replaces a registered run's values from Fleet for the
	// keys of creds (checked by CheckCredentials), in memory only; its
	// placeholders never change. A run not registered is an error.
	PutCredentials(runID string, creds []Credential) error
	// MissingCredentials names ("project/KEY") the declared keys the host
	// policy in force takes from Fleet that the run holds no value it may
	// use for; nil when none.
	MissingCredentials(runID string, declared []runspec.Declared) []string
	// Registered reports whether the run is registered and none of its keys
	// has been revoked since.
	Registered(runID string) bool
	// StartAttempt mints a fresh proxy password for the run's new attempt,
	// revoking any earlier one, and returns the proxy URL with credentials
	// (http://runID:password@host:port).
	StartAttempt(runID string) (proxyURL string, err error)
	// ServeNetwork serves the current attempt's network (its DNS, its
	// redirected connections, its explicit proxy) until the attempt ends,
	// when it closes the network's listeners; an error leaves them closed.
	ServeNetwork(runID string, ls sandbox.Listeners) error
	// EndAttempt revokes the attempt's password and closes the task's proxy
	// connections at once. Ending an ended attempt does nothing.
	EndAttempt(runID string)
	// Drop forgets the run and its placeholders (purge).
	Drop(runID string) error
}

// TaskSecrets is what a registered task gets in its env.
type TaskSecrets struct {
	// Placeholders maps each granted key name to its placeholder.
	Placeholders map[string]string
	// ProxiedKeys is RUNFLEET_PROXIED_KEYS: JSON, each key with the domains
	// it may reach.
	ProxiedKeys json.RawMessage
	// SSHKnownHosts is the task's /etc/ssh/ssh_known_hosts (edge's SSH
	// host key under its ssh keys' domains); nil when it has none.
	SSHKnownHosts []byte
}

// TrustSource is the proxy's CA as tasks need it.
type TrustSource interface {
	// Bundle is the current CA bundle (PEM).
	Bundle() []byte
	// Valid returns nil when the CA can sign leaves now, else why not.
	Valid() error
	// WatchTrust calls listener, on a goroutine of its own, with the current
	// bundle and then each new one until unsubscribe is called; unsubscribe
	// waits for a delivery under way. A listener's error is the delivery's
	// failure.
	WatchTrust(listener func(ctx context.Context, bundle []byte) error) (unsubscribe func() error, err error)
}
