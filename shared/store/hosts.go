package store

import "time"

// Probe statuses.
const (
	ProbeOK          = "ok"
	ProbeAuthFail    = "auth_fail"
	ProbeUnreachable = "unreachable"
	ProbeBadResponse = "bad_response"
)

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
	// Detail explains a status other than ok; never carries a credential.
	Detail string `json:"detail,omitempty"`
}

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
	// DeleteHostEventsPerStep bounds, roughly, the events one call deletes
	// in a store that deletes them one item at a time: a run whose events
	// would take the step past it is left (its events partly deleted) for
	// the next call.
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
