package runner

import (
	"errors"
	"fmt"

	"github.com/runfleet/runfleet/shared/hostproto"
)

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
