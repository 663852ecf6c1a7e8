package runner

import (
	"fmt"
	"time"

	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
)

// Values from Fleet (issue 33): for a key the host's policy takes from
// Fleet, Fleet mints a value per run and sends it with the start, and
// again (PutCredentials) before it expires or once the host says it lost
// it (Run.MissingCredentials). The runner checks them and hands them to
// the broker, which holds them in memory for the run; none is stored in
// the run log, an event or a log line.

// Credential is the value Fleet sent for one of a run's keys.
type Credential struct {
	ProjectID string
	Key       string
	// Value prints as [redacted]; only the broker reveals it.
	Value secrets.Value
	// ExpiresAt is when the provider stops honouring Value (zero: not
	// said).
	ExpiresAt time.Time
}

// ID is how the key is named in errors and Run.MissingCredentials:
// "project/KEY".
func (c Credential) ID() string { return c.ProjectID + "/" + c.Key }

// checkCredentials checks the values of a start or a PUT, naming the field
// at fault (never a value): each for a well-formed key the run declares,
// at most once, and not empty.
func checkCredentials(creds []Credential, declared []runspec.Declared) error {
	seen := map[string]bool{}
	for i, c := range creds {
		at := fmt.Sprintf("credentials[%d]", i)
		if err := runspec.CheckID(at+".projectId", c.ProjectID); err != nil {
			return err
		}
		if !runspec.KeyNameValid(c.Key) {
			return badRequest(at+".key", "%s: want an environment variable name of at most %d characters", runspec.Quoted(c.Key), runspec.MaxKeyLength)
		}
		if !declares(declared, c) {
			return badRequest(at, "%s is not a secret the run declares", c.ID())
		}
		if seen[c.ID()] {
			return badRequest(at, "%s is given more than once", c.ID())
		}
		seen[c.ID()] = true
		if c.Value.IsZero() {
			return badRequest(at+".value", "the value of %s is empty", c.ID())
		}
	}
	return nil
}

func declares(declared []runspec.Declared, c Credential) bool {
	for _, d := range declared {
		if d.ProjectID == c.ProjectID && d.Key == c.Key {
			return true
		}
	}
	return false
}

// PutCredentials gives the run's live attempt fresh values from Fleet,
// replacing those the broker holds for their keys (or the ones an edge
// restart lost); the task's placeholders never change. A run the host
// does not hold is ErrNotFound; a value for a key the run does not
// declare, or the host's policy does not take from Fleet, is a
// *RequestError naming it; a run whose attempt ended (or was refused) is
// ErrNotRunning. An attempt still being admitted is waited for.
func (r *Runner) PutCredentials(runID string, creds []Credential) (Run, error) {
	rec, err := r.get(runID)
	if err != nil {
		return Run{}, err
	}
	if len(creds) == 0 {
		return Run{}, badRequest("credentials", "is required: at least one value")
	}
	// A stored request that no longer reads declares nothing: its
	// attempts are refused key_not_granted, and so are values for it.
	declared, _ := specOf(rec.Request).Declare()
	if err := checkCredentials(creds, declared); err != nil {
		return Run{}, err
	}
	if r.broker == nil {
		return Run{}, ErrNotRunning // no run with secrets is admitted here
	}
	if detail := r.broker.CheckCredentials(declared, creds, false); detail != "" {
		return Run{}, badRequest("credentials", "%s", detail)
	}
	t := r.liveTask(runID)
	if t == nil {
		return Run{}, ErrNotRunning
	}
	<-t.recorded
	<-t.decided
	if !t.recordedOK || !t.admittedOK || t.ended.Load() {
		return Run{}, ErrNotRunning
	}
	if err := r.broker.PutCredentials(runID, creds); err != nil {
		// Dropped meanwhile: only a purge drops a run, once it ended.
		r.logger.Warn("handing a run's values from Fleet to the proxy", fieldRun, runID, fieldError, err.Error())
		return Run{}, ErrNotRunning
	}
	ids := make([]string, len(creds))
	for i, c := range creds {
		ids[i] = c.ID()
	}
	r.logger.Info("run's values from Fleet replaced", fieldRun, runID, fieldKeys, ids)
	return r.Get(runID)
}

// view is the run a record describes, with the keys a live run takes from
// Fleet that the broker holds no usable value for.
func (r *Runner) view(rec runlog.Record) Run {
	run := runOf(rec)
	if r.broker == nil || hostproto.TerminalStatus(rec.Status) || len(rec.Request.Secrets) == 0 {
		return run
	}
	declared, err := specOf(rec.Request).Declare()
	if err != nil {
		return run
	}
	run.MissingCredentials = r.broker.MissingCredentials(rec.RunID, declared)
	return run
}
