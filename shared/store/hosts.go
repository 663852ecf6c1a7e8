package store

import (
	"context"
	"time"
)

// Hosts is the registry of runner hosts, each with its last probe. A write
// to one part of a host (its probe, its drain, Enabled) leaves the rest as
// it is, and never creates a host that is absent. GetHost may read
// eventually consistent under EventualRead.
type Hosts interface {
	// CreateHost adds h; ErrExists if the id is taken.
	CreateHost(ctx context.Context, h Host) error
	// GetHost returns the host with its last probe; ErrNotFound.
	GetHost(ctx context.Context, id string) (Host, error)
	// ListHosts returns every host, ordered by id.
	ListHosts(ctx context.Context) ([]Host, error)
	// ListHostsPage reads the registry in bounded pages, for callers that
	// must not read every host at once (the metrics rollup). It returns up
	// to limit hosts (PageLimit applies) that follow the host id after in
	// the store's own order (dynamostore: the table's, which is not sorted;
	// boltstore: by id), and in Next the id to continue after, empty when
	// no host follows. after "" starts at the first. A page may hold fewer
	// than limit hosts while Next is set.
	ListHostsPage(ctx context.Context, after string, limit int) (HostPage, error)
	// SetHostEnabled flips enabled; ErrNotFound.
	SetHostEnabled(ctx context.Context, id string, enabled bool) (Host, error)
	// RecordProbe stores p as the host's last probe; ErrNotFound if the host is gone.
	RecordProbe(ctx context.Context, id string, p Probe) error
	// RecordDrain records on the host's probe what a drain or resume
	// answered, at once: draining, and idle when the host said (nil: it
	// did not). A host never probed keeps no probe, and none is made.
	// ErrNotFound if the host is gone. The next probe overwrites both.
	RecordDrain(ctx context.Context, id string, draining bool, idle *bool) (Host, error)
	// DeleteHost removes a host with the runs that reference it (the Runs
	// role's records), their events (the Events role's) and their ledger
	// mirrors (the Egress role's), in bounded, resumable steps. One call
	// deletes at most DeleteHostRunsPerStep of the host's runs, each with
	// its events and ledger (a store may stop sooner: dynamostore after
	// about DeleteHostEventsPerStep items), and answers Done false while
	// runs remain; the call that finds none left removes the host too and
	// answers Done true. A run's events and ledger go before the run
	// and the host goes last, so a call cut short anywhere loses nothing a
	// repeat cannot finish. Without force it fails with ErrInUse while an
	// unexpired run references the host (expired runs never block it and
	// are deleted like the others). ErrNotFound if absent.
	DeleteHost(ctx context.Context, id string, force bool) (HostDeletion, error)
}

// Host is a registered runner host.
type Host struct {
	ID            string            `json:"id"`
	BaseURL       string            `json:"baseUrl"`
	CredentialRef string            `json:"credentialRef"`
	Labels        map[string]string `json:"labels,omitempty"`
	LocalPaths    []string          `json:"localPaths,omitempty"`
	// CAPEM, when set, is trusted (in addition to nothing else) for the host's TLS.
	CAPEM     string    `json:"caPem,omitempty"`
	Enabled   bool      `json:"enabled"`
	CreatedAt time.Time `json:"createdAt"`
	// Probe is the last probe, nil before the first.
	Probe *Probe `json:"probe,omitempty"`
}

// Probe is one probe of a host, as recorded.
type Probe struct {
	Status    string    `json:"status"`
	At        time.Time `json:"at"`
	LatencyMs int64     `json:"latencyMs"`
	Version   string    `json:"version,omitempty"`
	Agents    []string  `json:"agents,omitempty"`
	Features  Features  `json:"features"`
	CA        *CAInfo   `json:"ca,omitempty"`
	Draining  bool      `json:"draining"`
	// Idle is whether the host runs no task, when it says (nil: a host
	// older than the field). A draining host that is idle can be
	// suspended ("suspend only when idle").
	Idle *bool `json:"idle,omitempty"`
	// Storage is the host's free space against its reserve; nil from a
	// host older than the field, which routing takes as not low.
	Storage *Storage `json:"storage,omitempty"`
	// Limits is how the host bounds each task's resources; nil from a host
	// older than the field. Never an empty Limits: the probe records nil.
	Limits *Limits `json:"limits,omitempty"`
	// Load is the host's runs against its capacity when probed; nil from a
	// host older than the field. Routing prefers hosts with free slots.
	Load *Load `json:"load,omitempty"`
	// Detail explains a status other than ok; never carries a credential.
	Detail string `json:"detail,omitempty"`
	// LedgerKey is the public key the host seals its egress ledgers with,
	// as its health check gave it (egress.FormatPublicKey's form); empty
	// from a host older than the field. Fleet verifies a ledger's seal
	// only with the key recorded here for the ledger's host.
	LedgerKey string `json:"ledgerKey,omitempty"`
}

// Load is a host's attempts starting or running (Active) against its
// runner.maxConcurrent, as last probed.
type Load struct {
	Active        int `json:"active"`
	MaxConcurrent int `json:"maxConcurrent"`
}

// Probe statuses.
const (
	ProbeOK          = "ok"
	ProbeAuthFail    = "auth_fail"
	ProbeUnreachable = "unreachable"
	ProbeBadResponse = "bad_response"
)

// Features are what a host can do for a run that declares secrets; routing
// sends such a run only where both are true.
type Features struct {
	SecretsProxy bool `json:"secretsProxy"`
	ExecRequire  bool `json:"execRequire"`
}

// CAInfo dates the host's proxy CA.
type CAInfo struct {
	NotAfter          time.Time  `json:"notAfter"`
	SuccessorNotAfter *time.Time `json:"successorNotAfter,omitempty"`
}

// Storage is a host's free space where it records runs, against its
// reserve.
type Storage struct {
	FreeBytes    int64 `json:"freeBytes"`
	MinFreeBytes int64 `json:"minFreeBytes"`
	// Low: FreeBytes is under MinFreeBytes; routing goes around the host.
	Low bool `json:"low"`
}

// Limits are how a host bounds each task's resources.
type Limits struct {
	// Enforced names the mechanism (cgroup2, cgroup1, none, unavailable).
	Enforced string `json:"enforced"`
	// MemoryBytes, Pids and CPU (cores) are each task's limits; zero where
	// that limit is not set.
	MemoryBytes int64   `json:"memoryBytes,omitempty"`
	Pids        int64   `json:"pids,omitempty"`
	CPU         float64 `json:"cpu,omitempty"`
	// Detail says why limits are unavailable.
	Detail string `json:"detail,omitempty"`
}

// DeleteHost's bounds on one call (one step).
const (
	// DeleteHostRunsPerStep bounds the runs one DeleteHost call deletes.
	DeleteHostRunsPerStep = 100
	// DeleteHostEventsPerStep bounds, roughly, the items (events, and
	// the ledger mirror's) one call deletes in a store that deletes them
	// one item at a time: a run whose items would take the step past it is
	// left (its items partly deleted) for the next call.
	DeleteHostEventsPerStep = 2000
)

// HostDeletion is what one DeleteHost call did.
type HostDeletion struct {
	// Done: the host is gone, and so is every run that referenced it.
	Done bool
	// RunsDeleted counts the runs this call deleted.
	RunsDeleted int
}

// HostPage is one page of ListHostsPage.
type HostPage struct {
	Hosts []Host
	// Next is the after of the next page; empty when there is none.
	Next string
}
