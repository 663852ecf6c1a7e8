package ca

import (
	"fmt"
	"time"
)

// Inspection is the CA set as stored, read at one moment without unsealing
// a key or writing anything (for `edge ca bundle|status`, which may run
// beside a serving edge).
type Inspection struct {
	Status Status
	// Bundle is the PEM the serving edge hands tasks at that moment.
	Bundle []byte
	// SuccessorDue is set when the signer's successor window is open but no
	// successor is stored yet: the serving edge mints it at its next review.
	SuccessorDue bool
}

// Inspect reads the CA set under cfg.Dir as of cfg.Clock's now. Only Dir,
// the lifetimes and Clock are read from cfg. It fails when no CA is stored
// yet, when the store cannot be read, or when no stored CA can sign any
// more (the next `edge serve` mints a new one).
func Inspect(cfg Config) (Inspection, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validateTiming(); err != nil {
		return Inspection{}, err
	}
	stored, err := loadStored(cfg.Dir)
	if err != nil {
		return Inspection{}, err
	}
	if len(stored) == 0 {
		return Inspection{}, fmt.Errorf("ca: no CA under %s yet: `edge serve` creates one at its first start", cfg.Dir)
	}
	now := cfg.Clock.Now()
	plan := planRotation(rotationInput{Now: now, Stored: validities(stored), Timing: cfg.timing()})
	if plan.Signer == noCA {
		return Inspection{}, fmt.Errorf("ca: no CA under %s can sign at %s (%s); `edge serve` mints a new one at start",
			cfg.Dir, now.UTC().Format(time.RFC3339), plan.Reason)
	}
	var successor *authority
	if plan.Successor != noCA {
		successor = stored[plan.Successor]
	}
	st := newState(stored[plan.Signer], successor, plan.NextTransition)
	return Inspection{Status: st.status, Bundle: st.bundle, SuccessorDue: plan.MintSuccessor}, nil
}
