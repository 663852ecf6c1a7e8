package fleetapi

import (
	"encoding/json"
	"time"

	"github.com/runfleet/runfleet/shared/runspec"
)

// A run's statuses: the host's, and Fleet's own dispatching (the host has
// not answered yet) and lost (the host denies the run). Succeeded, failed,
// canceled and lost are terminal.
const (
	StatusDispatching = "dispatching"
	// StatusQueued: the run waits for an eligible host with room
	// (DispatchRequest.Queue); no host has it yet.
	StatusQueued    = "queued"
	StatusPending   = "pending"
	StatusAdmitted  = "admitted"
	StatusRunning   = "running"
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
	StatusCanceled  = "canceled"
	StatusLost      = "lost"
)

// DispatchRequest is POST /fleet/runs' body: the run request's caller
// fields (RunRequest) and Fleet's own: Host (route to it only), Labels
// (the host must carry them; routing only, never sent to the host) and
// Idempotency (the key, or the Idempotency-Key header). Fleet refuses an
// optional string given empty and an empty Argv rather than take them for
// absent, so a client leaves a field zero to omit it.
type DispatchRequest struct {
	Host        string            `json:"host,omitempty"`
	Agent       string            `json:"agent"`
	Prompt      string            `json:"prompt,omitempty"`
	Argv        []string          `json:"argv,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Repository  string            `json:"repository,omitempty"`
	LocalPath   string            `json:"localPath,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Secrets     []runspec.Secret  `json:"secrets,omitempty"`
	Idempotency string            `json:"idempotency,omitempty"`
	// Queue asks the run to wait for capacity when no eligible host can
	// take it now, instead of a 409: the answer is then 202 with the run
	// queued. Absent: Fleet's default (RUNFLEET_QUEUE_TIMEOUT; none
	// unless configured).
	Queue *QueueRequest `json:"queue,omitempty"`
}

// QueueRequest is how a run waits: Timeout is the longest wait, a Go
// duration ("30m", "1h"; "0s" never waits, overriding Fleet's default),
// required, at most Fleet's RUNFLEET_QUEUE_MAX_TIMEOUT; Priority orders
// the run in its routing class, higher first (-100..100, 0 by default).
// Refused 400, naming the field: a timeout that is not a duration, is
// negative or over the maximum, a priority out of range, a queue with a
// named Host (such a run does not wait), or with a Repository URL that
// carries credentials (a waiting run is kept in Fleet's store, which never
// holds them). The idempotency hash includes the queue only when given,
// so a request without one hashes as before runs could wait.
type QueueRequest struct {
	Timeout  string `json:"timeout"`
	Priority int    `json:"priority,omitempty"`
}

// RunQueue is a run's wait (on a run that asked to wait): its routing
// Class (the agent, then "?" and its labels as a sorted query:
// "claude?gpu=a100"), Position (1 is next) while it waits (on GET and the
// dispatch answer; absent in listings), Priority, Since, Timeout (as
// time.Duration prints it: "30m0s") and Until (when it ends failed with
// reason queue_timeout); once a host took it, StartedAt and StartedOn.
// A run being offered to a host (status dispatching, hostId set) still
// waits and keeps its position until the host takes it.
type RunQueue struct {
	Class     string     `json:"class"`
	Position  int        `json:"position,omitempty"`
	Priority  int        `json:"priority,omitempty"`
	Since     time.Time  `json:"since"`
	Timeout   string     `json:"timeout"`
	Until     time.Time  `json:"until"`
	StartedAt *time.Time `json:"startedAt,omitempty"`
	StartedOn string     `json:"startedOn,omitempty"`
	// WaitedSeconds is how long the run waited: until it started, or so
	// far.
	WaitedSeconds int64 `json:"waitedSeconds"`
}

// ReasonQueueTimeout is a queued run's reason when its timeout passed
// before a host took it (status failed).
const ReasonQueueTimeout = "queue_timeout"

// RunRequest is the run request the dispatch asks for, as Fleet validates
// it (runspec.Request.Validate) and sends it on: Fleet's own fields left
// out, and what Fleet sets (the deadline, a clone URL) unset.
func (d DispatchRequest) RunRequest() runspec.Request {
	return runspec.Request{
		Agent: d.Agent, Prompt: d.Prompt, Argv: d.Argv, Repository: d.Repository, LocalPath: d.LocalPath,
		Env: d.Env, Secrets: d.Secrets,
	}
}

// RunLinks are a run's own URLs, absolute: follow them rather than build
// paths. Stream is on the stream function's URL in AWS, on the API's
// address locally.
type RunLinks struct {
	// Self is the run (GET); Self + "/input", "/cancel", "/retry" are its
	// verbs (POST).
	Self string `json:"self"`
	// Events is the run's mirrored events (GET, ?after=&limit=&wait=).
	Events string `json:"events"`
	// Stream is the run's Server-Sent Events.
	Stream string `json:"stream"`
	// Egress is the run's egress ledger as Fleet mirrored it (GET,
	// ?cursor=&limit=&verify=).
	Egress string `json:"egress"`
}

// DispatchAnswer is POST /fleet/runs' answer: 201 for a new run, 202 for
// one that waits for a host with room (status queued, hostId empty, Queue
// with its position), 200 for the first run of a reused idempotency key
// (queued or not, as it stands). Reason and Detail say why a run ended at
// once; Pending: still dispatching (the host did not answer).
type DispatchAnswer struct {
	FleetRunID       string   `json:"fleetRunId"`
	HostID           string   `json:"hostId"`
	ChildRunID       string   `json:"childRunId,omitempty"`
	Status           string   `json:"status"`
	Pending          bool     `json:"pending"`
	Reused           bool     `json:"reused"`
	RewroteLocalPath bool     `json:"rewroteLocalPath,omitempty"`
	Reason           string   `json:"reason,omitempty"`
	Detail           string   `json:"detail,omitempty"`
	Note             string   `json:"note,omitempty"`
	Links            RunLinks `json:"links"`
	// Details are present when a host routing chose refused the dispatch
	// with a transient reason (host_busy, host_storage_low,
	// host_unavailable, draining, or unreachable): the dispatch went on to
	// the next eligible host, and the run is where it landed.
	Details *DispatchDetails `json:"details,omitempty"`
	// Queue is the run's wait, on a run that waits (202) or waited.
	Queue *RunQueue `json:"queue,omitempty"`
}

// DispatchDetails lists the hosts a dispatch tried that refused it, in the
// order tried, each with its one reason and what it said. On a refused
// dispatch (409) the last of them is the run's own refusal.
type DispatchDetails struct {
	Excluded []Exclusion `json:"excluded"`
}

// DispatchRefused is POST /fleet/runs' 409 when the chosen host refused
// the run or could not be reached: nothing started, the run is recorded
// failed, and Code is its reason. It is an Error (error, code) and the
// dispatch answer in one object, so a client reading either finds it. (A
// 409 without fleetRunId is an Error: no_eligible_host, a key in use.)
type DispatchRefused struct {
	Error string `json:"error"`
	Code  string `json:"code"`
	DispatchAnswer
}

// Run is a Fleet run. Reason is a typed cause (the host's, or Fleet's
// dispatch_lost or run_not_found) and Detail says what it means and what
// to change. Deadline is set while dispatching. Repository is the
// dispatch's repository (a URL's credentials redacted), absent when it
// named none and on runs recorded before Fleet kept it.
type Run struct {
	FleetRunID       string     `json:"fleetRunId"`
	OwnerID          string     `json:"ownerId"`
	HostID           string     `json:"hostId"`
	ChildRunID       string     `json:"childRunId,omitempty"`
	Status           string     `json:"status"`
	Pending          bool       `json:"pending"`
	Attempt          int        `json:"attempt"`
	ExitCode         *int       `json:"exitCode,omitempty"`
	Reason           string     `json:"reason,omitempty"`
	Detail           string     `json:"detail,omitempty"`
	Agent            string     `json:"agent"`
	Repository       string     `json:"repository,omitempty"`
	IdempotencyKey   string     `json:"idempotencyKey,omitempty"`
	RewroteLocalPath bool       `json:"rewroteLocalPath,omitempty"`
	CreatedAt        time.Time  `json:"createdAt"`
	UpdatedAt        time.Time  `json:"updatedAt"`
	Deadline         *time.Time `json:"deadline,omitempty"`
	EndedAt          *time.Time `json:"endedAt,omitempty"`
	Links            RunLinks   `json:"links"`
	// Egress is the summary of the run's egress ledger as last mirrored:
	// on GET /fleet/runs/{id} and the alerts listing (GET
	// /fleet/runs?alerts=true), absent elsewhere and while no ledger is
	// mirrored.
	Egress *EgressSummary `json:"egress,omitempty"`
	// Credentials are the run's brokered keys (values Fleet mints, README
	// "Credentials Fleet mints") with when the value its host holds
	// expires: on GET /fleet/runs/{id}, absent elsewhere and for a run
	// with none. Never a value.
	Credentials []BrokeredCredential `json:"credentials,omitempty"`
	// Queue is the run's wait, on a run that asked to wait.
	Queue *RunQueue `json:"queue,omitempty"`
}

// BrokeredCredential is one brokered key of a run.
type BrokeredCredential struct {
	ProjectID string `json:"projectId"`
	Key       string `json:"key"`
	// Kind is the recipe's kind: githubApp or oauth2.
	Kind string `json:"kind"`
	// ExpiresAt is when the value the host holds now expires; Fleet sends
	// a fresh one at least 10 minutes before, while the run is live.
	ExpiresAt time.Time `json:"expiresAt"`
	// RevokedAt is when Fleet revoked the run's own token (githubApp, at
	// the run's end).
	RevokedAt *time.Time `json:"revokedAt,omitempty"`
}

// RunPage is GET /fleet/runs: the caller's runs, newest first; with
// ?alerts=true (admin), the runs whose egress ledgers hold alerts, the
// latest first alert first, each with its egress summary. NextCursor
// (empty on the last page) is the next page's cursor. Its keys are in the
// order Fleet writes them.
type RunPage struct {
	HasMore    bool   `json:"hasMore"`
	NextCursor string `json:"nextCursor"`
	Runs       []Run  `json:"runs"`
}

// RunAnswer is GET /fleet/runs/{id}: the run, Refreshed when its host was
// asked just now, with a Note when the host could not be. Its keys are in
// the order Fleet writes them.
type RunAnswer struct {
	Note      string `json:"note,omitempty"`
	Refreshed bool   `json:"refreshed"`
	Run       Run    `json:"run"`
}

// InputRequest is POST /fleet/runs/{id}/input's body in its wrapped form:
// Input is sent to the task as it is (null included). Any other JSON
// value than an object with "input" alone is sent as the input itself.
type InputRequest struct {
	Input json.RawMessage `json:"input"`
}

// Interaction is the answer of the run verbs (POST
// /fleet/runs/{id}/input, /cancel, /retry): the host's outcome and the
// run as recorded after. 200 when the host took the verb, 202 when its
// outcome is unknown; a refusal is an InteractionRefused.
type Interaction struct {
	FleetRunID string `json:"fleetRunId"`
	Outcome
	Run Run `json:"run"`
}

// InteractionRefused is a run verb's 409: the host refused it, or it
// certainly never reached the host, so nothing was done. It is an Error
// (error, and code: the refusal's, as Outcome says) and the Interaction in
// one object, so a client reading either finds it. (A 409 without
// "accepted" is an Error: run_not_on_host.)
type InteractionRefused struct {
	Error string `json:"error"`
	Interaction
}
