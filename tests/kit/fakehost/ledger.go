package fakehost

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"

	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// Egress ledgers, as edge keeps them (issue 31): each run's records
// chained from its genesis, counted in a tally, and sealed with the host's
// ledger key when the run ends (its status set terminal, by SetRun or a
// cancel), which /healthz reports as ledgerKey. GET /runs/{id}/egress
// pages them with the events pages' conventions. Tests add records, and
// alter or drop them after they were chained (tampering on the host), or
// sign with another key than the one reported.

// ledger is one run's egress ledger.
type ledger struct {
	records []egress.Record
	last    [32]byte
	tally   egress.Tally
	seal    *egress.Seal
}

// ledgerKey makes the host's ledger key from its URL, unique per host and
// deterministic (no randomness in tests).
func ledgerKey(url string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("fakehost ledger key " + url))
	return ed25519.NewKeyFromSeed(seed[:])
}

// LedgerKey is the public key /healthz reports (FormatPublicKey's form);
// empty for a host made with NoLedger.
func (h *Host) LedgerKey() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.health.LedgerKey
}

// SignLedgersWith makes the host seal ledgers with key from now on while
// /healthz still reports its own: a ledger sealed by another host's key.
func (h *Host) SignLedgersWith(key ed25519.PrivateKey) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.signer = key
}

// HoldSeals stops (true) or resumes (false) sealing ledgers when runs end:
// a host whose seal comes late, or never. SealEgress seals one by hand.
func (h *Host) HoldSeals(hold bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.holdSeals = hold
}

// AddEgress appends records to the run's ledger, as the run's traffic
// would: each gets the next seq, a time (the host's clock) when it has
// none, and its chain hash; the tally counts it.
func (h *Host) AddEgress(runID string, records ...egress.Record) {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.ledgerLocked(runID)
	for _, r := range records {
		r.Seq = int64(len(l.records) + 1)
		if r.TS.IsZero() {
			r.TS = h.clock.Now().UTC()
		}
		r.Hash = ""
		canonical, err := egress.Canonical(r)
		if err != nil {
			panic("fakehost: a record that does not encode: " + err.Error())
		}
		l.last = egress.Next(l.last, canonical)
		r.Hash = hex.EncodeToString(l.last[:])
		l.records = append(l.records, r)
		l.tally.Add(r)
	}
}

// AlterEgress changes the run's record seq as served, after it was
// chained (its hash is left as it was).
func (h *Host) AlterEgress(runID string, seq int64, change func(*egress.Record)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if l := h.ledgers[runID]; l != nil && seq >= 1 && seq <= int64(len(l.records)) {
		change(&l.records[seq-1])
	}
}

// DropEgress stops serving the run's record seq (the others keep theirs).
func (h *Host) DropEgress(runID string, seq int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if l := h.ledgers[runID]; l != nil && seq >= 1 && seq <= int64(len(l.records)) {
		l.records[seq-1].Seq = 0 // not served
	}
}

// SealEgress seals the run's ledger now, as its end does.
func (h *Host) SealEgress(runID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sealLocked(runID)
}

// Egress returns a copy of the run's ledger as served and its seal.
func (h *Host) Egress(runID string) ([]egress.Record, *egress.Seal) {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.ledgers[runID]
	if l == nil {
		return nil, nil
	}
	var out []egress.Record
	for _, r := range l.records {
		if r.Seq > 0 {
			r.Keys = append([]string(nil), r.Keys...)
			out = append(out, r)
		}
	}
	var seal *egress.Seal
	if l.seal != nil {
		s := *l.seal
		seal = &s
	}
	return out, seal
}

// ledgerLocked is the run's ledger, made at its first use. h.mu is held.
func (h *Host) ledgerLocked(runID string) *ledger {
	l := h.ledgers[runID]
	if l == nil {
		l = &ledger{last: egress.Genesis(runID)}
		h.ledgers[runID] = l
	}
	return l
}

// sealLocked seals the run's ledger with the signing key. h.mu is held.
func (h *Host) sealLocked(runID string) {
	l := h.ledgerLocked(runID)
	s := egress.Sign(h.signer, runID, int64(len(l.records)), l.last, h.clock.Now())
	l.seal = &s
}

// endedLocked seals the ledger of a run whose status just became
// terminal, unless seals are held. h.mu is held.
func (h *Host) endedLocked(r *hostproto.Run) {
	if hostproto.TerminalStatus(r.Status) && !h.holdSeals && !h.noLedger {
		h.sealLocked(r.RunID)
	}
}

func (h *Host) handleEgress(w http.ResponseWriter, r *http.Request) {
	after, limit, ok := pageQuery(w, r)
	if !ok {
		return
	}
	limit = min(limit, h.maxEgressPage)
	h.mu.Lock()
	_, known := h.runs[r.PathValue("id")]
	page := hostproto.EgressPage{Records: []egress.Record{}, NextCursor: &after}
	if l := h.ledgers[r.PathValue("id")]; l != nil {
		for _, rec := range l.records {
			if rec.Seq <= after {
				continue
			}
			if len(page.Records) == limit {
				page.HasMore = true
				break
			}
			rec.Keys = append([]string(nil), rec.Keys...)
			page.Records = append(page.Records, rec)
			page.NextCursor = &rec.Seq
		}
		page.Summary = l.tally.Summary()
		if l.seal != nil {
			s := *l.seal
			page.Seal = &s
		}
	} else {
		page.Summary = (&egress.Tally{}).Summary()
	}
	h.mu.Unlock()
	if !known {
		writeJSON(w, http.StatusNotFound, hostproto.ErrorBody{Error: "no such run", Code: hostproto.CodeRunNotFound})
		return
	}
	writeJSON(w, http.StatusOK, page)
}

// pageQuery reads a page's after and limit as edge does; a bad one is
// answered 400 (ok false).
func pageQuery(w http.ResponseWriter, r *http.Request) (after int64, limit int, ok bool) {
	limit = defaultEventPage
	bad := false
	if s := r.URL.Query().Get("after"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		bad = bad || err != nil || n < 0
		after = n
	}
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		bad = bad || err != nil || n < 0
		if n > 0 {
			limit = n
		}
	}
	if bad {
		writeJSON(w, http.StatusBadRequest, hostproto.ErrorBody{Error: "after and limit must be non-negative integers", Code: hostproto.CodeBadRequest})
		return 0, 0, false
	}
	return after, limit, true
}
