package fleetapi

import "time"

// Host is a registered host as Fleet shows it. CredentialRef and CAPEM
// (how the host is reached) are shown to admins only.
type Host struct {
	ID            string            `json:"id"`
	BaseURL       string            `json:"baseUrl"`
	CredentialRef string            `json:"credentialRef,omitempty"`
	Labels        map[string]string `json:"labels"`
	LocalPaths    []string          `json:"localPaths"`
	CAPEM         string            `json:"caPem,omitempty"`
	Enabled       bool              `json:"enabled"`
	CreatedAt     time.Time         `json:"createdAt"`
	// Probe is the last probe; null until the host is first probed.
	Probe *Probe `json:"probe"`
}

// Probe statuses.
const (
	ProbeOK          = "ok"
	ProbeAuthFail    = "auth_fail"
	ProbeUnreachable = "unreachable"
	ProbeBadResponse = "bad_response"
)

// Probe is what Fleet last learnt of a host by asking its health: the
// status of the asking, and what the host reported.
type Probe struct {
	Status    string    `json:"status"`
	At        time.Time `json:"at"`
	LatencyMs int64     `json:"latencyMs"`
	Version   string    `json:"version,omitempty"`
	Agents    []string  `json:"agents"`
	Features  Features  `json:"features"`
	CA        *CAInfo   `json:"ca,omitempty"`
	Draining  bool      `json:"draining"`
	// Idle: the host runs no task; absent when the host does not say. A
	// draining host that is idle can be suspended.
	Idle *bool `json:"idle,omitempty"`
	// Storage and Limits are absent for a host older than the fields.
	Storage *Storage `json:"storage,omitempty"`
	Limits  *Limits  `json:"limits,omitempty"`
	// Load is the host's runs against its capacity when probed; absent
	// for a host older than the field. Routing prefers hosts with free
	// slots.
	Load *Load `json:"load,omitempty"`
	// Detail says why, when the status is not ok.
	Detail string `json:"detail,omitempty"`
	// LedgerKey is the public key that seals the host's egress ledgers
	// (ed25519:<base64>), as the host last reported it (kept from the
	// probe before when this one got no answer); absent for a host older
	// than ledgers. Fleet verifies a ledger's seal with it only.
	LedgerKey string `json:"ledgerKey,omitempty"`
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

// Storage is the host's free space where it records runs, against its
// reserve.
type Storage struct {
	FreeBytes    int64 `json:"freeBytes"`
	MinFreeBytes int64 `json:"minFreeBytes"`
	// Low: under the reserve; the host refuses new runs and routing
	// excludes it (storage_low).
	Low bool `json:"low"`
}

// Load is a host's attempts starting or running (active) against its
// runner.maxConcurrent; at it, the host refuses a start with host_busy.
type Load struct {
	Active        int `json:"active"`
	MaxConcurrent int `json:"maxConcurrent"`
}

// Limits are how the host bounds each task's resources.
type Limits struct {
	// Enforced is cgroup2, cgroup1, none or unavailable.
	Enforced string `json:"enforced"`
	// MemoryBytes, Pids and CPU (cores) are each task's limits; absent
	// where unset.
	MemoryBytes int64   `json:"memoryBytes,omitempty"`
	Pids        int64   `json:"pids,omitempty"`
	CPU         float64 `json:"cpu,omitempty"`
	// Detail says why limits are unavailable.
	Detail string `json:"detail,omitempty"`
}

// HostList is GET /fleet/hosts: the hosts the caller may see.
type HostList struct {
	Hosts []Host `json:"hosts"`
}

// RegisterHost is POST /fleet/hosts' body (admin). ID, BaseURL and
// CredentialRef are required; an empty optional string is refused, not
// taken for absent (so a client leaves it zero to omit it).
type RegisterHost struct {
	ID            string            `json:"id"`
	BaseURL       string            `json:"baseUrl"`
	CredentialRef string            `json:"credentialRef"`
	Labels        map[string]string `json:"labels,omitempty"`
	LocalPaths    []string          `json:"localPaths,omitempty"`
	CAPEM         string            `json:"caPem,omitempty"`
	// Enabled: nil registers the host enabled.
	Enabled *bool `json:"enabled,omitempty"`
}

// HostAnswer is the answer of POST /fleet/hosts (201) and
// /fleet/hosts/{id}/enable: the host as now stored.
type HostAnswer struct {
	Host Host `json:"host"`
}

// SetEnabled is POST /fleet/hosts/{id}/enable's body; Enabled is always
// sent.
type SetEnabled struct {
	Enabled bool `json:"enabled"`
}

// HostDeleted is DELETE /fleet/hosts/{id} when done (200). RunsDeleted
// counts this call's runs. Its keys are in the order Fleet writes them.
type HostDeleted struct {
	Forced      bool   `json:"forced"`
	Removed     string `json:"removed"`
	RunsDeleted int    `json:"runsDeleted"`
}

// HostDeleting is DELETE /fleet/hosts/{id} when runs of the host remain
// (202): repeat the DELETE to continue. RunsDeleted counts this call's
// runs, not a total. Its keys are in the order Fleet writes them.
type HostDeleting struct {
	Deleting    bool   `json:"deleting"`
	Forced      bool   `json:"forced"`
	ID          string `json:"id"`
	Note        string `json:"note"`
	RunsDeleted int    `json:"runsDeleted"`
}

// ProbeAnswer is POST /fleet/hosts/{id}/probe: the probe just recorded.
type ProbeAnswer struct {
	Probe Probe `json:"probe"`
}

// ProbeAll is POST /fleet/probe: how many hosts were probed, and every
// host with its new probe. Its keys are in the order Fleet writes them.
type ProbeAll struct {
	Hosts  []Host `json:"hosts"`
	Probed int    `json:"probed"`
}

// HostDrain is the answer of POST /fleet/hosts/{id}/drain and /resume: the
// host's outcome as the run verbs show it, its state (Draining, and Idle
// when it says) and the host as Fleet recorded it. 200 when the host took
// the verb, 202 when its outcome is unknown; a refusal is a
// HostDrainRefused.
type HostDrain struct {
	HostID string `json:"hostId"`
	Outcome
	Draining bool  `json:"draining"`
	Idle     *bool `json:"idle,omitempty"`
	Host     Host  `json:"host"`
}

// HostDrainRefused is a drain's or resume's 409: the host refused it, or
// it certainly never reached the host. An Error (error, code: the
// refusal's) and the HostDrain in one object. A drain is recorded in Fleet
// all the same (Draining says so); a refused resume changes nothing.
type HostDrainRefused struct {
	Error string `json:"error"`
	HostDrain
}
