// Package hostproto owns the host protocol: the HTTP API that Fleet calls on
// each edge host. Its types are the wire shapes of DESIGN.md's host protocol,
// shared by Fleet's client and edge's server so the two cannot drift apart.
//
// Every route takes the host credential as a bearer token, /healthz included.
// JSON field names here are a contract with deployed hosts: never rename one.
package hostproto

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/runspec"
)

// Run statuses as a host reports them.
const (
	StatusPending   = "pending"
	StatusAdmitted  = "admitted"
	StatusRunning   = "running"
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
	StatusCanceled  = "canceled"
)

// TerminalStatus reports whether a host status is final for the current attempt.
func TerminalStatus(s string) bool {
	return s == StatusSucceeded || s == StatusFailed || s == StatusCanceled
}

// Reasons: the typed refusals and failure causes a run's state carries.
const (
	ReasonBrokerNotReady  = "broker_not_ready"
	ReasonKeyNotGranted   = "key_not_granted"
	ReasonHostUnavailable = "host_unavailable"
	ReasonHostBusy        = "host_busy"
	ReasonCloneFailed     = "clone_failed"
	ReasonDeadlinePassed  = "deadline_passed"
	ReasonCanceled        = "canceled"
	ReasonTimedOut        = "timed_out"
	ReasonHostShutdown    = "host_shutdown"
	ReasonHostRestarted   = "host_restarted"
	ReasonOutputLimit     = "output_limit"
	// ReasonOOMKilled: the kernel killed the task's process for going past
	// its memory limit (runner.limits.memory).
	ReasonOOMKilled = "oom_killed"
	// ReasonStorageFull: the host could no longer record the run's output
	// (its data dir reached the reserve, runner.minFreeBytes), so the run
	// was ended rather than lose output silently.
	ReasonStorageFull = "storage_full"
	// ReasonHostStorageLow: admission refused the run because the host's
	// data dir has less free space than runner.minFreeBytes.
	ReasonHostStorageLow = "host_storage_low"
)

// Error codes a host answers in ErrorBody.Code.
const (
	CodeRunNotFound    = "run_not_found"
	CodeUnauthorized   = "unauthorized"
	CodeBadRequest     = "bad_request"
	CodeNotRunning     = "not_running"
	CodeNotRetryable   = "not_retryable"
	CodeDraining       = "draining"
	CodeDeadlinePassed = ReasonDeadlinePassed
	// CodeInvalidJSON: the body is not one well-formed JSON value, or
	// gives a key twice (the message names it by its path); a body that is
	// JSON but wrong for the route is bad_request.
	CodeInvalidJSON = "invalid_json"
)

// Event types.
const (
	EventOutput = "output"
	EventState  = "state"
	// EventQueued is a run's first event when it waited in Fleet's queue
	// (data: Queued).
	EventQueued    = "queued"
	EventInput     = "input"
	EventAdmission = "admission"
	// EventLimit: the task reached one of the host's limits (data:
	// LimitReached), said once per attempt and limit.
	EventLimit = "limit"
)

// The limits a LimitReached names.
const (
	LimitMemory = "memory"
	LimitPids   = "pids"
	// LimitStorage: the host's data dir reached its reserve, and output
	// was not recorded.
	LimitStorage = "storage"
)

// LimitReached is the data of a limit event.
type LimitReached struct {
	Limit string `json:"limit"`
	// Value is the limit (bytes of memory, processes); zero for storage.
	Value int64 `json:"value,omitempty"`
	// Detail says what happened, for a person.
	Detail string `json:"detail"`
	// UnrecordedBytes of output were not recorded (storage).
	UnrecordedBytes int64 `json:"unrecordedBytes,omitempty"`
}

// MaxEventData is the most data one event carries (32 KiB); longer output is
// split on UTF-8 boundaries into several events.
const MaxEventData = 32 << 10

// Health is GET /healthz. Features are as they are at the moment of asking:
// a host whose proxy is down reports SecretsProxy false.
type Health struct {
	OK       bool `json:"ok"`
	Draining bool `json:"draining"`
	// Idle is true when the host runs no task (none starting or running);
	// nil from a host older than the field. A draining host that is idle
	// can be suspended.
	Idle     *bool    `json:"idle,omitempty"`
	Version  string   `json:"version"`
	Agents   []string `json:"agents"`
	Features Features `json:"features"`
	CA       *CAInfo  `json:"ca,omitempty"`
	// InsecureSameUser is true when tasks run as edge's own user
	// (runner.insecureSameUser); reported so an operator can see it.
	InsecureSameUser bool `json:"insecureSameUser,omitempty"`
	// EgressConfined is true when each task runs in a network of its own
	// whose one way off its loopback is edge (runner.egress confined);
	// false when tasks reach the network directly.
	EgressConfined bool `json:"egressConfined"`
	// Storage is the data dir's free space against its reserve; nil from a
	// host older than the field.
	Storage *Storage `json:"storage,omitempty"`
	// Limits says how each task's resources are bounded; nil from a host
	// older than the field.
	Limits *Limits `json:"limits,omitempty"`
	// Load is how many runs the host holds against how many it admits at
	// once; nil from a host older than the field. Fleet orders routing
	// candidates by it.
	Load *Load `json:"load,omitempty"`
	// LedgerKey is the public key that seals this host's egress ledgers
	// (egress.FormatPublicKey); empty from a host older than the field.
	// Fleet's probe records it, and verifies a ledger's seal only with
	// the key it recorded for the host.
	LedgerKey string `json:"ledgerKey,omitempty"`
}

// Load is a host's runs against its capacity at one moment.
type Load struct {
	// Active is the attempts starting or running: each holds one of the
	// host's slots.
	Active int `json:"active"`
	// MaxConcurrent is runner.maxConcurrent: with Active at it, the host
	// refuses a start with host_busy.
	MaxConcurrent int `json:"maxConcurrent"`
}

// DrainState is the answer of POST /host/drain and /host/resume: whether
// the host admits nothing new now, and whether it runs no task (nil from a
// host older than the field).
type DrainState struct {
	Draining bool  `json:"draining"`
	Idle     *bool `json:"idle,omitempty"`
}

// Storage is a host's free space where it records runs (its data dir).
type Storage struct {
	FreeBytes    int64 `json:"freeBytes"`
	MinFreeBytes int64 `json:"minFreeBytes"`
	// Low: FreeBytes is under MinFreeBytes, and the host refuses new runs
	// (host_storage_low) until space returns. Fleet routes around it.
	Low bool `json:"low"`
}

// How a host bounds its tasks' resources (Limits.Enforced).
const (
	LimitsCgroup2 = "cgroup2"
	LimitsCgroup1 = "cgroup1"
	// LimitsNone: runner.limits is "none"; tasks are bounded only by the host.
	LimitsNone = "none"
	// LimitsUnavailable: the host can enforce no limit and runner.limits
	// does not say "none", so it refuses tasks (and reports ok: false).
	LimitsUnavailable = "unavailable"
)

// Limits are the per-task resource limits a host enforces: each task (all
// its attempts' processes) in a control group of its own.
type Limits struct {
	Enforced string `json:"enforced"`
	// MemoryBytes, Pids and CPU (cores) are each task's limits; zero where
	// that limit is not set.
	MemoryBytes int64   `json:"memoryBytes,omitempty"`
	Pids        int64   `json:"pids,omitempty"`
	CPU         float64 `json:"cpu,omitempty"`
	// Detail says why limits are unavailable.
	Detail string `json:"detail,omitempty"`
}

// Features are what a host can do for a run that declares secrets. Both must
// be true for Fleet to route such a run there.
type Features struct {
	SecretsProxy bool `json:"secretsProxy"`
	ExecRequire  bool `json:"execRequire"`
}

// CAInfo dates the host's proxy CA.
type CAInfo struct {
	NotAfter          time.Time  `json:"notAfter"`
	SuccessorNotAfter *time.Time `json:"successorNotAfter,omitempty"`
}

// StartRequest is POST /runs: the run request (runspec.Request, its JSON
// inline) and the token that makes its start idempotent. A start arriving
// after Deadline is refused with CodeDeadlinePassed.
//
// Credentials are the values Fleet minted for the run's brokered keys
// (DESIGN.md, "Credentials Fleet mints"): one per declared secret whose key
// Fleet's broker has a recipe for. The host keeps them in memory only (never
// in its run log, data dir, events or log lines), uses each as its key's
// real value for this run alone, and refuses the run at admission
// (key_not_granted) when its policy does not declare such a key
// "source": "fleet", or declares a key so that has no value here.
type StartRequest struct {
	ClientToken string          `json:"clientToken"`
	Credentials []BrokeredValue `json:"credentials,omitempty"`
	// Queued says the run waited in Fleet's queue before this start: the
	// host records it as the run's first event (EventQueued), so the
	// run's events say where it went and how long it waited. Nil: it did
	// not wait (or a host older than the field ignores it).
	Queued *Queued `json:"queued,omitempty"`
	runspec.Request
}

// Queued is a run's wait in Fleet's queue, as its first event's data.
type Queued struct {
	// Since is when it began to wait; StartedAt when Fleet offered it to
	// this host, which took it; WaitedMs the difference.
	Since     time.Time `json:"since"`
	StartedAt time.Time `json:"startedAt"`
	WaitedMs  int64     `json:"waitedMs"`
	// HostID is Fleet's id of the host that took it; Offers the hosts
	// that refused it before.
	HostID string `json:"hostId"`
	Offers int    `json:"offers,omitempty"`
}

// BrokeredValue is one brokered key's current value for one run.
type BrokeredValue struct {
	ProjectID string `json:"projectId"`
	Key       string `json:"key"`
	// Value is the real value; it prints as [redacted] (SecretString).
	Value SecretString `json:"value"`
	// ExpiresAt is when the provider stops honouring Value; Fleet sends a
	// fresh one (PUT /runs/{id}/credentials) well before.
	ExpiresAt time.Time `json:"expiresAt"`
}

// ID is how logs, errors and Run.MissingCredentials name the key:
// "<projectId>/<KEY>". It never includes the value.
func (b BrokeredValue) ID() string { return b.ProjectID + "/" + b.Key }

// LogValue is the key and its expiry: slog's JSON handler would marshal
// the struct, value and all (SecretString's own LogValue is not consulted
// inside a struct). StartRequest and CredentialsRequest log so too.
func (b BrokeredValue) LogValue() slog.Value {
	return slog.GroupValue(slog.String("key", b.ID()), slog.Time("expiresAt", b.ExpiresAt))
}

// brokeredIDs names values by key, for a log line.
func brokeredIDs(values []BrokeredValue) []string {
	ids := make([]string, len(values))
	for i, b := range values {
		ids[i] = b.ID()
	}
	return ids
}

// SecretString is a real value on the wire: JSON carries its bytes, every
// printer and log shows [redacted]. Convert it (string(s)) only where it is
// handed to the type that guards it on the other side (edge's
// secrets.Value) or sent.
type SecretString string

// redacted is what a SecretString shows.
const redacted = "[redacted]"

func (SecretString) String() string   { return redacted }
func (SecretString) GoString() string { return redacted }

// Format makes every fmt verb (%v %+v %#v %s %q %x...) show [redacted].
func (SecretString) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(redacted)) }

// LogValue keeps the value out of slog.
func (SecretString) LogValue() slog.Value { return slog.StringValue(redacted) }

// LogValue is the start's token, agent and the keys of its values, never
// a value (see BrokeredValue.LogValue).
func (r StartRequest) LogValue() slog.Value {
	return slog.GroupValue(slog.String("clientToken", r.ClientToken), slog.String("agent", r.Agent),
		slog.Any("credentials", brokeredIDs(r.Credentials)))
}

// CredentialsRequest is PUT /runs/{id}/credentials: fresh values of the
// run's brokered keys, replacing the ones the host holds (or gives it the
// values a restart lost). Each must be a key the run declared and the
// host's policy takes from Fleet; the placeholder the task holds never
// changes. The host answers 200 with the run (its MissingCredentials
// then empty for the keys given), 404 run_not_found, 409 not_running
// for a run that ended, 400 bad_request naming a key it does not take or
// whose value expires before the one it holds (a value never moves
// backwards; nothing of the request is taken).
type CredentialsRequest struct {
	Credentials []BrokeredValue `json:"credentials"`
}

// LogValue is the keys of the values, never a value.
func (r CredentialsRequest) LogValue() slog.Value {
	return slog.GroupValue(slog.Any("credentials", brokeredIDs(r.Credentials)))
}

// Run is a host's view of one run. POST /runs answers 201 with it, or 200
// with Reused set for a clientToken it already knows.
type Run struct {
	RunID       string `json:"runId"`
	ClientToken string `json:"clientToken"`
	Status      string `json:"status"`
	Attempt     int    `json:"attempt"`
	ExitCode    *int   `json:"exitCode,omitempty"`
	Reason      string `json:"reason,omitempty"`
	// Detail explains Reason for a person: what refused the run and what
	// to change. It never holds a secret, a placeholder or a token.
	Detail string `json:"detail,omitempty"`
	Reused bool   `json:"reused,omitempty"`
	// MissingCredentials names ("<projectId>/<KEY>") the brokered keys
	// of a live run that the host holds no value for (a restart lost
	// them): until Fleet sends them, the task's requests that would carry
	// one are answered 503 withheld. Absent when none is missing.
	MissingCredentials []string `json:"missingCredentials,omitempty"`
}

// RunList is GET /runs?clientToken=: empty, never 404, when unknown.
type RunList struct {
	Runs []Run `json:"runs"`
}

// Event is one entry of a run's event sequence. Sequences start at 1 and are
// contiguous across attempts. Data is a JSON string for output and input, and
// a StateChange (or Admission) object for state and admission events.
type Event struct {
	Sequence int64           `json:"sequence"`
	Type     string          `json:"type"`
	Data     json.RawMessage `json:"data"`
	TS       time.Time       `json:"ts"`
}

// StateChange is the data of a state event.
type StateChange struct {
	Status   string `json:"status"`
	Attempt  int    `json:"attempt"`
	ExitCode *int   `json:"exitCode,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Detail   string `json:"detail,omitempty"`
}

// EventPage is GET /runs/{id}/events?after=&limit=. NextCursor is the
// sequence of the last event returned (or after, when none was); nil
// (absent) when after is past the run's last event, a place from which no
// page continues. limit is 1 to 1000 (absent: 100).
type EventPage struct {
	Events     []Event `json:"events"`
	NextCursor *int64  `json:"nextCursor,omitempty"`
	HasMore    bool    `json:"hasMore"`
}

// EgressPage is GET /runs/{id}/egress?after=&limit=: the run's ledger
// records after a sequence, with the event pages' conventions (nextCursor
// absent when after is past the ledger's end). Summary counts the whole
// ledger, dropped records included; Seal is the host's latest seal over
// it, nil while the run has not ended.
type EgressPage struct {
	Records    []egress.Record `json:"records"`
	NextCursor *int64          `json:"nextCursor,omitempty"`
	HasMore    bool            `json:"hasMore"`
	Summary    egress.Summary  `json:"summary"`
	Seal       *egress.Seal    `json:"seal,omitempty"`
}

// InputRequest is POST /runs/{id}/input. Input is any JSON value, null included.
type InputRequest struct {
	Input json.RawMessage `json:"input"`
}

// ErrorBody is every error answer of the host protocol. (Fleet's API answers
// the same shape as its own type, fleetapi.Error.)
type ErrorBody struct {
	Error   string `json:"error"`
	Code    string `json:"code,omitempty"`
	Details any    `json:"details,omitempty"`
}
