package ca

import (
	"slices"
	"testing"
	"time"
)

func TestPlanRotation(t *testing.T) {
	tm := timing{lifetime: 100 * time.Hour, successorWindow: 30 * time.Hour, switchBefore: 5 * time.Hour}
	t0 := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(h int) time.Time { return t0.Add(time.Duration(h) * time.Hour) }
	ca := func(fromHour int) validity { return validity{NotBefore: at(fromHour), NotAfter: at(fromHour + 100)} }

	tests := []struct {
		name   string
		now    time.Time
		stored []validity
		want   rotationPlan
	}{
		{
			name: "first start: mint a signer",
			now:  at(0),
			want: rotationPlan{Signer: noCA, Successor: noCA},
		},
		{
			name:   "before the window: the signer alone, next transition when the window opens",
			now:    at(10),
			stored: []validity{ca(0)},
			want:   rotationPlan{Signer: 0, Successor: noCA, NextTransition: at(70)},
		},
		{
			name:   "the window opens: mint the successor",
			now:    at(70),
			stored: []validity{ca(0)},
			want:   rotationPlan{Signer: 0, Successor: noCA, MintSuccessor: true, NextTransition: at(95)},
		},
		{
			name:   "inside the window with a successor: next transition is the switch",
			now:    at(80),
			stored: []validity{ca(70), ca(0)},
			want:   rotationPlan{Signer: 1, Successor: 0, NextTransition: at(95)},
		},
		{
			name:   "the switch point: the successor signs, the old signer leaves",
			now:    at(95),
			stored: []validity{ca(0), ca(70)},
			want:   rotationPlan{Signer: 1, Successor: noCA, Drop: []int{0}, NextTransition: at(140)},
		},
		{
			name:   "the old signer expired: dropped",
			now:    at(101),
			stored: []validity{ca(0), ca(70)},
			want:   rotationPlan{Signer: 1, Successor: noCA, Drop: []int{0}, NextTransition: at(140)},
		},
		{
			name:   "down through the successor's own window: it signs and gets a successor",
			now:    at(150),
			stored: []validity{ca(0), ca(70)},
			want:   rotationPlan{Signer: 1, Successor: noCA, MintSuccessor: true, Drop: []int{0}, NextTransition: at(165)},
		},
		{
			name:   "down past every switch point: mint a new signer",
			now:    at(200),
			stored: []validity{ca(0), ca(70)},
			want:   rotationPlan{Signer: noCA, Successor: noCA, Drop: []int{0, 1}},
		},
		{
			name:   "down past the switch point without a successor: mint a new signer",
			now:    at(97),
			stored: []validity{ca(0)},
			want:   rotationPlan{Signer: noCA, Successor: noCA, Drop: []int{0}},
		},
		{
			name:   "three usable (never made, but read): the first-ending signs, the last-ending succeeds",
			now:    at(80),
			stored: []validity{ca(75), ca(0), ca(70)},
			want:   rotationPlan{Signer: 1, Successor: 0, Drop: []int{2}, NextTransition: at(95)},
		},
		{
			name:   "a clock set back before the signer's start keeps the signer",
			now:    at(-10),
			stored: []validity{ca(0)},
			want:   rotationPlan{Signer: 0, Successor: noCA, NextTransition: at(70)},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := planRotation(rotationInput{Now: tc.now, Stored: tc.stored, Timing: tm})
			if got.Reason == "" {
				t.Error("the plan gives no reason")
			}
			got.Reason = ""
			if got.Signer != tc.want.Signer || got.Successor != tc.want.Successor || got.MintSuccessor != tc.want.MintSuccessor ||
				!slices.Equal(got.Drop, tc.want.Drop) || !got.NextTransition.Equal(tc.want.NextTransition) {
				t.Errorf("plan\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
