package runner

import (
	"encoding/json"
	"errors"
	"sync/atomic"
	"time"

	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
)

// ticket is one admitted attempt's permission to exec. check runs just
// before the exec and returns the refusal that stops it, or nil to let it
// go; release gives the admission up once the start has ended, with a
// process or without. Each does something at most once.
type ticket struct {
	r        *Runner
	checked  atomic.Bool
	released atomic.Bool
}

func (r *Runner) issueTicket(*task) *ticket {
	r.metrics.tickets.Inc()
	return &ticket{r: r}
}

// check decides again with the facts as they are now: a cancel, a drain, the
// proxy going down, the CA lapsing, a key revoked by a policy reload or the
// task's registration dropped since admission all refuse. The caller holds
// t.mu, so a cancel cannot slip between this check and the exec.
func (k *ticket) check(r *Runner, t *task) *Refusal {
	if !k.checked.CompareAndSwap(false, true) {
		return &Refusal{Reason: hostproto.ReasonHostUnavailable, Detail: "the admission ticket was already used"}
	}
	facts := Facts{
		Canceled:    t.canceled,
		Draining:    r.Draining(),
		Identity:    r.identityErr,
		HoldsSlot:   true,
		NeedsBroker: t.needsBroker,
		Prepared:    true,
	}
	r.storageFacts(&facts)
	if t.needsBroker {
		r.brokerFacts(t, &facts)
		if r.broker != nil && !r.broker.Registered(t.runID) {
			facts.Preparation = errors.New("the task's registration with the proxy was revoked")
		}
	}
	ref := Decide(facts).Refusal()
	if ref != nil && ref.Reason == hostproto.ReasonCanceled && t.endReason == hostproto.ReasonHostShutdown {
		ref.Reason = hostproto.ReasonHostShutdown
		ref.Detail = "the host shut down before the process started"
	}
	return ref
}

func (k *ticket) release() {
	if k.released.CompareAndSwap(false, true) {
		k.r.metrics.tickets.Dec()
	}
}

// admissionData is the data of an admission event: the verdict on one
// attempt, with the keys it declared ("project/KEY"; never a placeholder).
type admissionData struct {
	Attempt  int      `json:"attempt"`
	Admitted bool     `json:"admitted"`
	Reason   string   `json:"reason,omitempty"`
	Detail   string   `json:"detail,omitempty"`
	Keys     []string `json:"keys,omitempty"`
}

func admissionEntry(ts time.Time, attempt int, d Decision, secrets []runspec.Secret) runlog.Entry {
	a := admissionData{Attempt: attempt, Admitted: d.Verdict == Admit, Reason: d.Reason, Detail: d.Detail}
	for _, s := range secrets {
		a.Keys = append(a.Keys, s.ProjectID+"/"+s.Key)
	}
	data, _ := json.Marshal(a)
	return runlog.Entry{Type: hostproto.EventAdmission, Data: data, TS: ts}
}
