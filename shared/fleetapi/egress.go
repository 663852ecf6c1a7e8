package fleetapi

import "time"

// A run's egress ledger through Fleet (issue 31): GET
// /fleet/runs/{id}/egress pages the records Fleet mirrored from the run's
// host, with the ledger's summary and seal, and ?verify=true checks the
// whole mirror's chain and seal. The record, summary and seal types below
// have the very JSON of shared/egress's (a test in shared/api pins it
// field for field), so a client can recompute the chain itself with that
// package; fleetapi keeps types of its own so that its callers depend on
// nothing of Fleet's.

// Ledger record actions (EgressRecord.Action). Blocked, withheld and
// denied stopped the traffic; warned went on past a rule in warn mode that
// would have refused it; dropped is the record that counts records not
// kept past the ledger's bound.
const (
	EgressSubstituted = "substituted"
	EgressForwarded   = "forwarded"
	EgressBlocked     = "blocked"
	EgressWithheld    = "withheld"
	EgressTunnelled   = "tunnelled"
	EgressDenied      = "denied"
	EgressWarned      = "warned"
	EgressDropped     = "dropped"
)

// EgressRecord is one decision of a run's egress ledger, as its host wrote
// it, hash included. Its JSON without Hash is the canonical form the chain
// hashes (shared/egress): hash_n = SHA-256(hash_{n-1} || canonical_n).
type EgressRecord struct {
	Seq int64     `json:"seq"`
	TS  time.Time `json:"ts"`
	// Via is proxy, transparent, dns or ssh: which of edge's fronts saw
	// the traffic.
	Via string `json:"via"`
	// Authority is host:port, or the DNS name a DNS refusal names.
	Authority string `json:"authority,omitempty"`
	Method    string `json:"method,omitempty"`
	// Path is the path as the task sent it, placeholders and every query
	// value masked ("*").
	Path string `json:"path,omitempty"`
	// Command is an SSH exec's git command.
	Command    string   `json:"command,omitempty"`
	Status     int      `json:"status,omitempty"`
	BytesUp    int64    `json:"bytesUp"`
	BytesDown  int64    `json:"bytesDown"`
	DurationUs int64    `json:"durationUs"`
	Keys       []string `json:"keys,omitempty"`
	Action     string   `json:"action"`
	Reason     string   `json:"reason,omitempty"`
	// Rule names the request rule that decided
	// ("projects.<p>.keys.<KEY>.rules[<i>]").
	Rule string `json:"rule,omitempty"`
	// Alert is foreign_placeholder, ungranted_domain or
	// real_value_from_task on a record that shows a key escaping.
	Alert string `json:"alert,omitempty"`
	// Dropped, on a dropped record, counts the records not kept.
	Dropped int64 `json:"dropped,omitempty"`
	// Hash is the chain's hash after this record, hex.
	Hash string `json:"hash,omitempty"`
}

// EgressSummary counts a run's whole ledger as its host last reported it,
// dropped records included: a run's "egress" (GET /fleet/runs/{id}) and an
// egress page's "summary". While the run is live it may count records the
// mirror does not hold yet.
type EgressSummary struct {
	Requests int64 `json:"requests"`
	// Blocked counts blocked, denied and withheld decisions.
	Blocked   int64 `json:"blocked"`
	Warned    int64 `json:"warned"`
	BytesUp   int64 `json:"bytesUp"`
	BytesDown int64 `json:"bytesDown"`
	Alerts    int64 `json:"alerts"`
	Dropped   int64 `json:"dropped"`
	// Authorities are the most requested first, at most 50; the requests
	// of the rest are OtherAuthorities.
	Authorities      []EgressAuthority `json:"authorities"`
	OtherAuthorities int64             `json:"otherAuthorities,omitempty"`
}

// EgressAuthority counts one authority's decisions and the keys used or
// refused toward it ("project/KEY").
type EgressAuthority struct {
	Authority string   `json:"authority"`
	Requests  int64    `json:"requests"`
	Blocked   int64    `json:"blocked"`
	Keys      []string `json:"keys"`
}

// EgressSeal is the host's Ed25519 signature over the run's chain at Count
// records, made when the run ended. PublicKey is what the host claims;
// Fleet verifies with the key its probe recorded for the host, never
// with this one.
type EgressSeal struct {
	Count     int64     `json:"count"`
	LastHash  string    `json:"lastHash"`
	Signature string    `json:"signature"`
	PublicKey string    `json:"publicKey"`
	SealedAt  time.Time `json:"sealedAt"`
}

// EgressVerification is ?verify=true's finding over the whole mirrored
// ledger. OK holds only when every record chains from the run's genesis,
// the seal covers exactly the records mirrored and its signature verifies
// with LedgerKey, the key Fleet's probe recorded for HostID. Otherwise
// FailedSeq names the first record that fails (absent when it is the
// seal's failure) and Problem says what failed.
type EgressVerification struct {
	OK        bool   `json:"ok"`
	Records   int64  `json:"records"`
	Sealed    bool   `json:"sealed"`
	FailedSeq int64  `json:"failedSeq,omitempty"`
	Problem   string `json:"problem,omitempty"`
	HostID    string `json:"hostId"`
	// LedgerKey is the key verified with (ed25519:<base64>); absent when
	// Fleet knows none for the host.
	LedgerKey string `json:"ledgerKey,omitempty"`
	// HostChecked: the host still held the run and its own current seal
	// was compared with the mirror's (a mirror cut back to an earlier seal
	// of the same chain verifies on its own; the host's seal says so).
	// False once the host purged the run, or when it did not answer.
	HostChecked bool `json:"hostChecked"`
}

// EgressPage is GET /fleet/runs/{id}/egress: the mirrored ledger records
// after the asked cursor, in ledger order, with the events pages'
// conventions: HasMore (more mirrored past this page now), NextCursor (the
// last record's seq, the asked one when none came; absent when the asked
// cursor is past the mirror's end) and Live (the ledger may still grow or
// be sealed: false once the run is drained). Summary is null while no
// ledger is mirrored (a run not started yet, or on a host older than
// ledgers); Seal is null until the run has ended. Verification is present
// with ?verify=true. Its keys are in the order Fleet writes them.
type EgressPage struct {
	Records      []EgressRecord      `json:"records"`
	HasMore      bool                `json:"hasMore"`
	Live         bool                `json:"live"`
	NextCursor   *int64              `json:"nextCursor,omitempty"`
	Summary      *EgressSummary      `json:"summary"`
	Seal         *EgressSeal         `json:"seal"`
	Verification *EgressVerification `json:"verification,omitempty"`
}
