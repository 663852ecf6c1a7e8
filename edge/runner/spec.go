package runner

import (
	"time"

	"github.com/runfleet/runfleet/edge/runlog"
)

// Spec is a run to start: what Start takes. The host API maps the host
// protocol's start request to it; the run log keeps it as its own
// runlog.Request, mapped here (stored, specOf) and nowhere else.
type Spec struct {
	// ClientToken makes the start idempotent: a known token returns its run.
	ClientToken string
	// Deadline, when set, refuses a start arriving after it
	// (deadline_passed).
	Deadline *time.Time
	// Agent names an entry of the agent table.
	Agent string
	// Prompt replaces {prompt} inside the agent's argv.
	Prompt string
	// Argv is appended to the agent's argv.
	Argv []string
	// Repository and CloneURL say what is cloned into the work dir
	// (CloneURL first); LocalPath is a directory under runner.roots to
	// work in instead. At most one source.
	Repository string
	CloneURL   string
	LocalPath  string
	// Env is added to the task's env.
	Env map[string]string
	// Secrets are the keys the run needs through the secrets proxy.
	Secrets []Secret
}

// Secret declares one key a run needs: the broker grants it when the host
// policy allows ProjectID/Key toward Domains (empty: all the policy allows).
type Secret struct {
	ProjectID string
	Key       string
	Domains   []string
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
}

// stored is s as its run's record keeps it.
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
	s := Spec{
		ClientToken: req.ClientToken, Deadline: req.Deadline, Agent: req.Agent, Prompt: req.Prompt, Argv: req.Argv,
		Repository: req.Repository, CloneURL: req.CloneURL, LocalPath: req.LocalPath, Env: req.Env,
	}
	for _, sec := range req.Secrets {
		s.Secrets = append(s.Secrets, Secret{ProjectID: sec.ProjectID, Key: sec.Key, Domains: sec.Domains})
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
