package runner

import (
	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
)

// Spec is a run to start: what Start takes, the run request and the token
// that makes its start idempotent (a known token returns its run). The run
// log keeps it as its own runlog.Request, mapped here (stored, specOf) and
// nowhere else.
type Spec struct {
	ClientToken string
	// Credentials are the values Fleet minted for the run's keys that the
	// host's policy takes from Fleet: handed to the broker at admission,
	// never stored (stored leaves them out), recorded or logged.
	Credentials []Credential
	// Queued is the run's wait in Fleet's queue before this start: Start
	// records it as the run's first event (hostproto.EventQueued, in the
	// protocol's shape like every event's data). Not part of the stored
	// request: it describes the run's start, not what each attempt runs.
	// Nil: the run did not wait.
	Queued *hostproto.Queued
	runspec.Request
}

// Run is the runner's view of a run: its record's state, and whether a start
// found it already known.
type Run struct {
	RunID       string
	ClientToken string
	Status      string
	Attempt     int
	// ExitCode of the last attempt's process; nil while live or when it
	// never started.
	ExitCode *int
	// Reason is a hostproto Reason* code; Detail explains it for a person
	// and never holds a secret, a placeholder or a token.
	Reason string
	Detail string
	// Reused: Start returned a run already known for its ClientToken.
	Reused bool
	// MissingCredentials names ("project/KEY") the keys a live run takes
	// from Fleet that the broker holds no usable value for (an edge
	// restart lost it, or it expired); nil when none.
	MissingCredentials []string
}

// stored is s as its run's record keeps it: the record's form is the run
// log's own, so a change to the run request is never a migration of it.
// The values from Fleet are not in it: they live in the broker's memory
// alone.
func (s Spec) stored() runlog.Request {
	req := runlog.Request{
		ClientToken: s.ClientToken, Deadline: s.Deadline, Agent: s.Agent, Prompt: s.Prompt, Argv: s.Argv,
		Repository: s.Repository, CloneURL: s.CloneURL, LocalPath: s.LocalPath, Env: s.Env,
	}
	for _, sec := range s.Secrets {
		req.Secrets = append(req.Secrets, runlog.Secret{ProjectID: sec.ProjectID, Key: sec.Key, Domains: sec.Domains})
	}
	return req
}

// specOf is the start a record keeps, for each of the run's attempts.
func specOf(req runlog.Request) Spec {
	s := Spec{ClientToken: req.ClientToken, Request: runspec.Request{
		Deadline: req.Deadline, Agent: req.Agent, Prompt: req.Prompt, Argv: req.Argv,
		Repository: req.Repository, CloneURL: req.CloneURL, LocalPath: req.LocalPath, Env: req.Env,
	}}
	for _, sec := range req.Secrets {
		s.Secrets = append(s.Secrets, runspec.Secret{ProjectID: sec.ProjectID, Key: sec.Key, Domains: sec.Domains})
	}
	return s
}

// runOf is the run a record describes.
func runOf(rec runlog.Record) Run {
	return Run{
		RunID: rec.RunID, ClientToken: rec.ClientToken, Status: rec.Status, Attempt: rec.Attempt,
		ExitCode: rec.ExitCode, Reason: rec.Reason, Detail: rec.Detail,
	}
}
