package ca

import (
	"fmt"
	"slices"
	"time"
)

// validity is what rotation reads of a stored CA.
type validity struct {
	NotBefore, NotAfter time.Time
}

func (v validity) successorAt(t timing) time.Time { return v.NotAfter.Add(-t.successorWindow) }
func (v validity) switchAt(t timing) time.Time    { return v.NotAfter.Add(-t.switchBefore) }

// rotationInput is everything a rotation decision depends on.
type rotationInput struct {
	Now    time.Time
	Stored []validity
	Timing timing
}

// noCA marks an absent signer or successor in a rotationPlan.
const noCA = -1

// rotationPlan says which stored CA signs and which is its successor at
// Now, and what must be minted. Roles follow from the dates alone, so a
// switch needs no write and a restart finds the same roles on disk.
type rotationPlan struct {
	// Signer indexes Stored, or is noCA: nothing stored may sign any
	// more (first start, or every CA passed its switch point while edge was
	// down), so a new CA must be minted to sign at once.
	Signer int
	// Successor indexes Stored, or is noCA.
	Successor int
	// MintSuccessor: the signer is inside its successor window without one.
	MintSuccessor bool
	// Retired lists stored CAs out of the bundle that the store keeps,
	// sealed: past their switch point or expired, not valid yet, or beside
	// a signer and successor. The maxRetired latest-ending are kept, so a
	// clock put back after running ahead (edge then minted a CA dated in
	// the future, its signer having passed its switch point) finds the
	// CAs it had and signs with them again.
	Retired []int
	// Drop lists the stored CAs the store lets go: retired past maxRetired.
	Drop []int
	// NextTransition is when the plan next changes by the passage of time
	// alone (a successor due, a switch); zero when Signer is noCA.
	NextTransition time.Time
	// Reason says, for a person, why the plan is what it is.
	Reason string
}

// maxRetired is how many CAs out of the bundle the store keeps (sealed):
// normal rotation retires one per lifetime, so these span years.
const maxRetired = 4

// planRotation decides the CA roles at in.Now. A CA can sign from its start
// (NotBefore) until its switch point (SwitchBefore its end); among those
// that can, the one ending first signs and the one ending last is its
// successor. The signer gets a successor once its successor window opens.
// Whatever cannot sign leaves the bundle: after the switch every leaf comes
// from the new signer, and every task holding the old bundle already
// received the successor at least SuccessorWindow-SwitchBefore ago. A CA
// not valid yet never signs: its leaves would not verify (a CA minted while
// the clock ran ahead, or a clock set back before a CA's start).
func planRotation(in rotationInput) (p rotationPlan) {
	p = rotationPlan{Signer: noCA, Successor: noCA}
	var usable, out []int
	for i, v := range in.Stored {
		if !in.Now.Before(v.NotBefore) && in.Now.Before(v.switchAt(in.Timing)) {
			usable = append(usable, i)
		} else {
			out = append(out, i)
		}
	}
	defer func() { p.Retired, p.Drop = retire(in.Stored, out) }()
	if len(usable) == 0 {
		if len(in.Stored) == 0 {
			p.Reason = "no CA yet: mint one"
		} else {
			p.Reason = "no stored CA can sign now (each is past its switch point or not valid yet): mint a new signer"
		}
		return p
	}
	p.Signer, p.Successor = usable[0], usable[0]
	for _, i := range usable[1:] {
		if in.Stored[i].NotAfter.Before(in.Stored[p.Signer].NotAfter) {
			p.Signer = i
		}
		if !in.Stored[i].NotAfter.Before(in.Stored[p.Successor].NotAfter) {
			p.Successor = i
		}
	}
	if p.Successor == p.Signer {
		p.Successor = noCA
	}
	for _, i := range usable {
		if i != p.Signer && i != p.Successor {
			out = append(out, i)
		}
	}
	signer := in.Stored[p.Signer]
	p.NextTransition = signer.switchAt(in.Timing)
	switch {
	case p.Successor != noCA:
		p.Reason = fmt.Sprintf("signer switches to its successor at %s", p.NextTransition.UTC().Format(time.RFC3339))
	case !in.Now.Before(signer.successorAt(in.Timing)):
		p.MintSuccessor = true
		p.Reason = "the signer's successor window is open: mint its successor"
	default:
		p.NextTransition = signer.successorAt(in.Timing)
		p.Reason = fmt.Sprintf("signer gets a successor at %s", p.NextTransition.UTC().Format(time.RFC3339))
	}
	return p
}

// retire splits the CAs out of the bundle into those the store keeps (the
// maxRetired latest-ending) and those it drops, each by index order.
func retire(stored []validity, out []int) (retired, drop []int) {
	byEnd := slices.Clone(out)
	slices.SortStableFunc(byEnd, func(i, j int) int { return stored[j].NotAfter.Compare(stored[i].NotAfter) })
	if len(byEnd) > maxRetired {
		drop = byEnd[maxRetired:]
		byEnd = byEnd[:maxRetired]
		slices.Sort(drop)
	}
	slices.Sort(byEnd)
	if len(byEnd) == 0 {
		byEnd = nil
	}
	return byEnd, drop
}
