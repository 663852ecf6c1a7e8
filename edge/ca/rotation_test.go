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
			name:   "the switch point: the successor signs, the old signer leaves the bundle (kept, retired)",
			now:    at(95),
			stored: []validity{ca(0), ca(70)},
			want:   rotationPlan{Signer: 1, Successor: noCA, Retired: []int{0}, NextTransition: at(140)},
		},
		{
			name:   "the old signer expired: retired",
			now:    at(101),
			stored: []validity{ca(0), ca(70)},
			want:   rotationPlan{Signer: 1, Successor: noCA, Retired: []int{0}, NextTransition: at(140)},
		},
		{
			name:   "down through the successor's own window: it signs and gets a successor",
			now:    at(150),
			stored: []validity{ca(0), ca(70)},
			want:   rotationPlan{Signer: 1, Successor: noCA, MintSuccessor: true, Retired: []int{0}, NextTransition: at(165)},
		},
		{
			name:   "down past every switch point: mint a new signer",
			now:    at(200),
			stored: []validity{ca(0), ca(70)},
			want:   rotationPlan{Signer: noCA, Successor: noCA, Retired: []int{0, 1}},
		},
		{
			name:   "down past the switch point without a successor: mint a new signer",
			now:    at(97),
			stored: []validity{ca(0)},
			want:   rotationPlan{Signer: noCA, Successor: noCA, Retired: []int{0}},
		},
		{
			name:   "three usable (never made, but read): the first-ending signs, the last-ending succeeds",
			now:    at(80),
			stored: []validity{ca(75), ca(0), ca(70)},
			want:   rotationPlan{Signer: 1, Successor: 0, Retired: []int{2}, NextTransition: at(95)},
		},
		{
			name:   "a clock set back before the signer's start: not valid yet, so a new signer is minted (the other kept)",
			now:    at(-10),
			stored: []validity{ca(0)},
			want:   rotationPlan{Signer: noCA, Successor: noCA, Retired: []int{0}},
		},
		{
			name:   "a clock put back after running ahead: the CA minted ahead is not valid yet, the earlier signer signs again",
			now:    at(20),
			stored: []validity{ca(0), ca(500)},
			want:   rotationPlan{Signer: 0, Successor: noCA, Retired: []int{1}, NextTransition: at(70)},
		},
		{
			name:   "more retired than the store keeps: the latest-ending kept, the others dropped",
			now:    at(600),
			stored: []validity{ca(100), ca(580), ca(0), ca(300), ca(200), ca(400)},
			want:   rotationPlan{Signer: 1, Successor: noCA, Retired: []int{0, 3, 4, 5}, Drop: []int{2}, NextTransition: at(650)},
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
				!slices.Equal(got.Retired, tc.want.Retired) || !slices.Equal(got.Drop, tc.want.Drop) ||
				!got.NextTransition.Equal(tc.want.NextTransition) {
				t.Errorf("plan\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
