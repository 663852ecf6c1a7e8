package runner

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// Admission: whether an attempt may start. Decide is the decision, pure, on
// Facts gathered at one moment; begin gathers them for a reserved attempt,
// prepares a task that needs the broker when Decide asks, records the
// verdict and launches what it admits. A ticket (ticket.go) decides again
// just before the exec.

// Verdict is admission's answer.
type Verdict int

const (
	// Refuse: the attempt does not start; the Decision says why. The zero value.
	Refuse Verdict = iota
	// Prepare: every check so far passes and the attempt needs the broker:
	// register the task and write its trust file, then decide again with
	// Prepared set.
	Prepare
	// Admit: the attempt may start; it gets a ticket.
	Admit
)

func (v Verdict) String() string {
	switch v {
	case Prepare:
		return "prepare"
	case Admit:
		return "admit"
	}
	return "refuse"
}

// Facts are everything admission looks at, gathered by the runner at one
// moment. Error-valued facts are nil when the condition holds.
type Facts struct {
	// Draining: the host admits nothing new.
	Draining bool
	// Canceled: the run was canceled before its process started.
	Canceled bool
	// Identity is nil when tasks can run as runner.user (or, where edge
	// cannot switch users, runner.insecureSameUser allows edge's own).
	Identity error
	// Limits is nil when each task can be bounded as runner.limits says
	// (or they are "none").
	Limits error
	// FreeBytes is the data dir's free space and MinFreeBytes its reserve
	// (runner.minFreeBytes); Storage is why FreeBytes could not be read,
	// or why the data dir cannot take a run whatever its free bytes.
	FreeBytes    int64
	MinFreeBytes int64
	Storage      error
	// HoldsSlot: the attempt already holds a concurrency slot (a ticket's
	// check); otherwise Active and MaxConcurrent decide host_busy.
	HoldsSlot     bool
	Active        int
	MaxConcurrent int

	// NeedsBroker: the run declares secrets. The facts below count only then.
	NeedsBroker bool
	// Proxy: the secrets proxy is up and not killed.
	Proxy error
	// CA: the proxy's CA is valid now.
	CA error
	// Ungranted is the first declared key ("project/KEY") the host policy
	// does not grant, with why; empty when all are granted.
	Ungranted       string
	UngrantedReason string
	// Credentials says, naming the key, why the values Fleet sent with
	// the start disagree with the keys the policy takes from Fleet (a
	// value for a key it takes from its own sources, or none for one it
	// takes from Fleet); empty when they agree.
	Credentials string
	// Prepared: registration and the trust file were attempted; Preparation
	// is what came of it.
	Prepared    bool
	Preparation error
}

// Decision is admission's verdict with its typed reason and a human detail.
type Decision struct {
	Verdict Verdict
	Reason  string
	Detail  string
}

// Refusal returns the decision as a *Refusal, nil unless it refuses.
func (d Decision) Refusal() *Refusal {
	if d.Verdict != Refuse {
		return nil
	}
	return &Refusal{Reason: d.Reason, Detail: d.Detail}
}

// Decide is admission: deny by default, each check in turn, the first that
// fails naming the refusal. It is pure, so it runs the same way when an
// attempt is admitted and when its ticket is checked just before exec.
func Decide(f Facts) Decision {
	refuse := func(reason, detail string) Decision {
		return Decision{Verdict: Refuse, Reason: reason, Detail: detail}
	}
	switch {
	case f.Canceled:
		return refuse(hostproto.ReasonCanceled, "the run was canceled before its process started")
	case f.Draining:
		return refuse(hostproto.ReasonHostUnavailable, "the host is draining and admits nothing new")
	case f.Identity != nil:
		return refuse(hostproto.ReasonHostUnavailable, f.Identity.Error())
	case f.Limits != nil:
		return refuse(hostproto.ReasonHostUnavailable, f.Limits.Error())
	case f.Storage != nil:
		return refuse(hostproto.ReasonHostStorageLow, "the host's data dir cannot take a run: "+f.Storage.Error())
	case f.FreeBytes < f.MinFreeBytes:
		return refuse(hostproto.ReasonHostStorageLow, fmt.Sprintf("the host's data dir has %s free, under its reserve of %s (runner.minFreeBytes): it admits runs again once space is freed; dispatch to another host meanwhile",
			humanBytes(f.FreeBytes), humanBytes(f.MinFreeBytes)))
	case !f.HoldsSlot && f.MaxConcurrent <= 0:
		return refuse(hostproto.ReasonHostBusy, "the host runs no tasks (runner.maxConcurrent is 0)")
	case !f.HoldsSlot && f.Active >= f.MaxConcurrent:
		return refuse(hostproto.ReasonHostBusy, fmt.Sprintf("the host already runs %d %s, its runner.maxConcurrent: retry later, or dispatch to another host",
			f.Active, plural(f.Active, "task", "tasks")))
	}
	if !f.NeedsBroker {
		return Decision{Verdict: Admit}
	}
	switch {
	case f.Proxy != nil:
		return refuse(hostproto.ReasonBrokerNotReady, "secrets proxy: "+f.Proxy.Error())
	case f.CA != nil:
		return refuse(hostproto.ReasonBrokerNotReady, "proxy CA: "+f.CA.Error())
	case f.Ungranted != "":
		detail := "the host policy does not grant " + f.Ungranted
		if f.UngrantedReason != "" {
			detail += ": " + f.UngrantedReason
		}
		return refuse(hostproto.ReasonKeyNotGranted, detail)
	case f.Credentials != "":
		return refuse(hostproto.ReasonKeyNotGranted, f.Credentials)
	case !f.Prepared:
		return Decision{Verdict: Prepare}
	case f.Preparation != nil:
		var typed *Refusal
		if errors.As(f.Preparation, &typed) {
			return refuse(typed.Reason, typed.Detail)
		}
		return refuse(hostproto.ReasonBrokerNotReady, f.Preparation.Error())
	}
	return Decision{Verdict: Admit}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// runnerFacts reads admission's facts from the runner's own state and, when
// there is room, takes a concurrency slot for t, all at one moment. A slot
// taken here is given back by finish.
func (r *Runner) runnerFacts(t *task) Facts {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := Facts{
		Draining:      r.draining || r.closed,
		Identity:      r.identityErr,
		Limits:        r.limitsErr,
		Active:        r.slots,
		MaxConcurrent: r.cfg.MaxConcurrent,
	}
	if r.slots < r.cfg.MaxConcurrent {
		r.slots++
		t.holdsSlot = true
	}
	return f
}

// begin admits the reserved attempt and, once admitted, starts it in the
// background. It returns the run as it stands after admission.
func (r *Runner) begin(t *task) Run {
	req := t.spec
	facts := r.runnerFacts(t)
	facts.NeedsBroker = t.needsBroker
	r.storageFacts(&facts)
	localPath := ""
	if req.LocalPath != "" {
		p, err := r.resolveLocalPath(req.LocalPath)
		if err != nil && facts.Identity == nil {
			facts.Identity = fmt.Errorf("localPath: %w", err)
		}
		localPath = p
	}
	ident, err := r.identityFor(t.rec.Serial)
	if err != nil && facts.Identity == nil {
		facts.Identity = err
	}
	t.ident = ident
	t.dirs = r.dirsFor(t.runID, localPath)

	d := r.decide(t, facts)
	t.credentials = nil // the broker holds them now, or they are refused
	t.markDecided(d.Verdict == Admit)
	r.metrics.admission(d)
	admission := admissionEntry(r.clock.Now(), t.attempt, d, req.Secrets)
	if d.Verdict != Admit {
		r.logger.Info("run refused", fieldRun, t.runID, fieldAttempt, t.attempt, fieldReason, d.Reason)
		r.finish(t, refusedOutcome(d.Refusal()), admission)
		return r.currentRun(t.runID)
	}
	now := r.clock.Now()
	rec, err := r.log.Update(t.runID, func(rec *runlog.Record) error {
		rec.Status, rec.UpdatedAt = hostproto.StatusAdmitted, now
		return nil
	}, admission, stateEntry(now, hostproto.StateChange{Status: hostproto.StatusAdmitted, Attempt: t.attempt}))
	if err != nil {
		r.logs.Error(condRecordAdmission, "recording an admission", fieldRun, t.runID, fieldError, err.Error())
		r.finish(t, outcome{status: hostproto.StatusFailed, reason: hostproto.ReasonHostUnavailable, detail: "the host could not record the admission"})
		return r.currentRun(t.runID)
	}
	tk := r.issueTicket(t)
	go r.launch(t, tk)
	return r.view(rec)
}

// decide gathers the broker's facts and runs admission, preparing the task
// (registration, proxy password, trust file) when admission asks for it.
func (r *Runner) decide(t *task, facts Facts) Decision {
	if facts.NeedsBroker {
		r.brokerFacts(t, &facts)
		if facts.Proxy == nil && facts.Ungranted == "" {
			facts.Credentials = r.broker.CheckCredentials(t.declared, t.credentials, t.credentialsComplete)
		}
	}
	d := Decide(facts)
	if d.Verdict == Prepare {
		facts.Prepared = true
		facts.Preparation = r.prepare(t)
		d = Decide(facts)
	}
	return d
}

// brokerFacts gathers the facts that count for a run that declares secrets:
// the proxy's readiness, the host policy's grants of its keys, the CA's
// validity.
func (r *Runner) brokerFacts(t *task, f *Facts) {
	if r.broker == nil {
		f.Proxy = errors.New("this edge has no secrets proxy")
	} else {
		f.Proxy = r.broker.Ready()
		switch {
		case t.declareErr != nil:
			f.Ungranted, f.UngrantedReason = "the declared secrets", t.declareErr.Error()
		case f.Proxy == nil:
			f.Ungranted, f.UngrantedReason = r.broker.Ungranted(t.declared)
		}
	}
	if r.trust == nil {
		f.CA = errors.New("this edge has no CA")
	} else {
		f.CA = r.trust.Valid()
	}
}

// prepare readies a task that needs the broker: its directories, its
// registration and fresh proxy password, and its trust file, kept current
// from then on.
func (r *Runner) prepare(t *task) error {
	if err := prepareDirs(t.dirs, t.ident, t.spec.LocalPath == ""); err != nil {
		r.logger.Error("preparing a task's directories", fieldRun, t.runID, fieldError, err.Error())
		return errors.New("the host could not prepare the task's directories")
	}
	secrets, err := r.broker.Register(t.runID, t.declared, t.credentials)
	if err != nil {
		return fmt.Errorf("registering the task with the proxy: %w", err)
	}
	proxyURL, err := r.broker.StartAttempt(t.runID)
	t.mu.Lock()
	t.secrets, t.proxyURL, t.brokerOn = secrets, proxyURL, err == nil
	t.mu.Unlock()
	if err != nil {
		return fmt.Errorf("minting the task's proxy credential: %w", err)
	}
	unwatch, err := r.watchTrust(t)
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.unwatch = unwatch
	t.mu.Unlock()
	return nil
}

// watchTrust writes the task's trust files now and again on every new CA
// bundle until the returned function is called.
func (r *Runner) watchTrust(t *task) (func() error, error) {
	var mu sync.Mutex
	write := func(bundle []byte) error {
		mu.Lock()
		defer mu.Unlock()
		return writeTrustFiles(t.dirs, r.systemRoots, bundle)
	}
	unsubscribe, err := r.trust.WatchTrust(func(_ context.Context, bundle []byte) error { return write(bundle) })
	if err != nil {
		return nil, fmt.Errorf("following the CA's bundle: %w", err)
	}
	// Read the bundle under the writer's lock: a delivery racing this first
	// write then lands after it, so the newest bundle is the one that stays.
	mu.Lock()
	err = writeTrustFiles(t.dirs, r.systemRoots, r.trust.Bundle())
	mu.Unlock()
	if err != nil {
		unsubscribe()
		r.logger.Error("writing a task's trust file", fieldRun, t.runID, fieldError, err.Error())
		return nil, errors.New("the host could not write the task's trust file")
	}
	return unsubscribe, nil
}

// currentRun is the run as stored now; one that cannot be read is logged,
// and answered with its id alone.
func (r *Runner) currentRun(runID string) Run {
	rec, err := r.log.Get(runID)
	if err != nil {
		r.logger.Error("reading a run", fieldRun, runID, fieldError, err.Error())
		return Run{RunID: runID}
	}
	return r.view(rec)
}
