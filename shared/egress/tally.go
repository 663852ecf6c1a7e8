package egress

import (
	"slices"
	"sort"
)

// Tally accumulates a Summary record by record. It is JSON so a writer can
// keep it with the ledger across restarts. Not safe for concurrent use.
type Tally struct {
	Requests    int64                      `json:"requests"`
	Blocked     int64                      `json:"blocked"`
	Warned      int64                      `json:"warned"`
	BytesUp     int64                      `json:"bytesUp"`
	BytesDown   int64                      `json:"bytesDown"`
	Alerts      int64                      `json:"alerts"`
	Dropped     int64                      `json:"dropped"`
	Authorities map[string]*AuthorityTally `json:"authorities,omitempty"`
	// Overflow counts the records of authorities met after MaxTallied
	// distinct ones were (summarised as OtherAuthorities requests).
	Overflow int64 `json:"overflow,omitempty"`
}

// AuthorityTally is one authority's counts in a Tally.
type AuthorityTally struct {
	Requests int64    `json:"requests"`
	Blocked  int64    `json:"blocked"`
	Keys     []string `json:"keys,omitempty"`
}

// MaxTallied bounds the distinct authorities a Tally keeps apart, so a
// task calling name after name (or asking its DNS for them) costs a
// bounded tally: edge rewrites a run's tally with each flush that touched
// it, so its size is paid ten times a second. Five times MaxAuthorities
// keeps the summary's top right for any ordinary run.
const MaxTallied = 5 * MaxAuthorities

// maxKeysPerAuthority bounds an authority's key list.
const maxKeysPerAuthority = 32

// Add counts r, a record kept in the ledger. A Dropped record adds
// nothing: the records it stands for were counted as they were dropped
// (AddDropped), with all that was known of them.
func (t *Tally) Add(r Record) {
	if r.Action == Dropped {
		return // its records were counted as they were dropped (AddDropped)
	}
	t.Requests++
	blocked := IsBlocked(r.Action)
	if blocked {
		t.Blocked++
	}
	if r.Action == Warned {
		t.Warned++
	}
	if r.Alert != "" {
		t.Alerts++
	}
	t.BytesUp += r.BytesUp
	t.BytesDown += r.BytesDown
	if r.Authority == "" {
		return
	}
	if t.Authorities == nil {
		t.Authorities = map[string]*AuthorityTally{}
	}
	a := t.Authorities[r.Authority]
	if a == nil {
		if len(t.Authorities) >= MaxTallied {
			t.Overflow++
			return
		}
		a = &AuthorityTally{}
		t.Authorities[r.Authority] = a
	}
	a.Requests++
	if blocked {
		a.Blocked++
	}
	for _, k := range r.Keys {
		if i, found := slices.BinarySearch(a.Keys, k); !found && len(a.Keys) < maxKeysPerAuthority {
			a.Keys = slices.Insert(a.Keys, i, k)
		}
	}
}

// AddDropped counts r, a record not kept past the ledger's bound: it
// counts in every total as any record does, and in Dropped.
func (t *Tally) AddDropped(r Record) {
	t.Add(r)
	t.Dropped++
}

// Summary is the tally as a Summary: authorities most requested first
// (then by name), at most MaxAuthorities.
func (t *Tally) Summary() Summary {
	s := Summary{Requests: t.Requests, Blocked: t.Blocked, Warned: t.Warned, BytesUp: t.BytesUp,
		BytesDown: t.BytesDown, Alerts: t.Alerts, Dropped: t.Dropped, Authorities: []AuthoritySummary{}}
	for name, a := range t.Authorities {
		s.Authorities = append(s.Authorities, AuthoritySummary{Authority: name, Requests: a.Requests, Blocked: a.Blocked,
			Keys: append([]string{}, a.Keys...)})
	}
	sort.Slice(s.Authorities, func(i, j int) bool {
		a, b := s.Authorities[i], s.Authorities[j]
		if a.Requests != b.Requests {
			return a.Requests > b.Requests
		}
		return a.Authority < b.Authority
	})
	if len(s.Authorities) > MaxAuthorities {
		for _, a := range s.Authorities[MaxAuthorities:] {
			s.OtherAuthorities += a.Requests
		}
		s.Authorities = s.Authorities[:MaxAuthorities]
	}
	s.OtherAuthorities += t.Overflow
	return s
}
