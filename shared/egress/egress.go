// Package egress owns a run's egress ledger as both halves see it: the
// record of one decision a run's traffic caused, its one canonical form,
// the hash chain that links a run's records, the host's seal over the
// chain (an Ed25519 signature), verification, and the summary of a
// ledger. Edge writes ledgers (edge/ledger) and Fleet mirrors and verifies
// them with this same code, so what one side hashes the other recomputes
// byte for byte.
//
// The chain: record n (n from 1) carries
//
//	hash_n = SHA-256(hash_{n-1} || Canonical(record_n))
//
// where hash_0 = SHA-256("runfleet egress ledger v1\x00" || runID): the
// chain of one run can never pass for another's. The seal signs
//
//	"runfleet egress seal v1\x00" || runID || "\x00" || count (8 bytes, big endian) || hash_count
//
// with the host's ledger key, so a ledger cut short, lengthened, or
// presented under another run or by another host fails verification.
//
// A record never holds a real value or a placeholder: edge masks what a
// task chose to send (the path's placeholders, every query value) before a
// record is made.
package egress

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Actions: what edge did. The first six are the audit's actions
// (edge/audit); Warned is a request a rule in warn mode would have
// refused, let through; Dropped is the record that counts the records past
// the ledger's bound.
const (
	Substituted = "substituted"
	Forwarded   = "forwarded"
	Blocked     = "blocked"
	Withheld    = "withheld"
	Tunnelled   = "tunnelled"
	Denied      = "denied"
	Warned      = "warned"
	Dropped     = "dropped"
)

// Vias: which of edge's fronts saw the traffic.
const (
	ViaProxy       = "proxy"       // the explicit proxy (HTTPS_PROXY, CONNECT)
	ViaTransparent = "transparent" // a connection redirected from the task's network
	ViaDNS         = "dns"         // the task network's DNS server
	ViaSSH         = "ssh"         // edge's SSH front
)

// Alert kinds: a record that shows a key escaping its bounds.
const (
	// AlertForeignPlaceholder: a placeholder issued to another run.
	AlertForeignPlaceholder = "foreign_placeholder"
	// AlertUngrantedDomain: a placeholder of this run toward a domain its
	// key does not reach.
	AlertUngrantedDomain = "ungranted_domain"
	// AlertRealValue: a real value the proxy holds, sent by the task
	// itself (reason real_value_from_task).
	AlertRealValue = "real_value_from_task"
)

// Record is one decision of a run's ledger. Its JSON (omitting Hash) is
// the canonical form the chain hashes: fields may be added to the end,
// never renamed or reordered, and a reader that does not know a field
// cannot verify a ledger holding it (Verify says so).
type Record struct {
	Seq int64     `json:"seq"`
	TS  time.Time `json:"ts"`
	// Via is one of the Via constants.
	Via string `json:"via"`
	// Authority is host:port (a CONNECT's, a pin's, an SNI's), or a DNS
	// name for a DNS refusal.
	Authority string `json:"authority,omitempty"`
	// Method is the HTTP method (or the SSH request: "exec"...).
	Method string `json:"method,omitempty"`
	// Path is the request's path as the task sent it, each placeholder
	// masked, and its query with every value masked (MaskedValue).
	Path string `json:"path,omitempty"`
	// Command is an SSH exec's git command, normalised.
	Command string `json:"command,omitempty"`
	Status  int    `json:"status,omitempty"`
	// BytesUp counts the bytes from the task, BytesDown to it.
	BytesUp   int64 `json:"bytesUp"`
	BytesDown int64 `json:"bytesDown"`
	// DurationUs is the decision's whole time, in microseconds.
	DurationUs int64 `json:"durationUs"`
	// Keys names the keys used or refused ("project/KEY"), sorted.
	Keys   []string `json:"keys,omitempty"`
	Action string   `json:"action"`
	// Reason says why a request was blocked, withheld, denied or warned.
	Reason string `json:"reason,omitempty"`
	// Rule names the rule that decided: a request rule
	// ("projects.p.keys.K.rules[1]"), or empty for the policy's domains.
	Rule string `json:"rule,omitempty"`
	// Alert is one of the Alert kinds, when the record is one.
	Alert string `json:"alert,omitempty"`
	// Dropped, on a Dropped record, is how many records past the bound
	// were not kept since the previous Dropped record.
	Dropped int64 `json:"dropped,omitempty"`
	// Hash is the chain's hash after this record, hex; not part of the
	// canonical form.
	Hash string `json:"hash,omitempty"`
}

// MaskedValue replaces every query value in a record's Path.
const MaskedValue = "*"

// Canonical is the bytes the chain hashes for r: its JSON without Hash.
func Canonical(r Record) ([]byte, error) {
	r.Hash = ""
	return json.Marshal(r)
}

// Genesis is hash_0 of runID's chain.
func Genesis(runID string) [32]byte {
	return sha256.Sum256([]byte("runfleet egress ledger v1\x00" + runID))
}

// Next is the chain's hash after a record whose canonical form is
// canonical, following prev.
func Next(prev [32]byte, canonical []byte) [32]byte {
	h := sha256.New()
	h.Write(prev[:])
	h.Write(canonical)
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// Seal is a host's signature over a run's chain as it stood at Count
// records.
type Seal struct {
	Count int64 `json:"count"`
	// LastHash is hash_Count, hex.
	LastHash string `json:"lastHash"`
	// Signature is Ed25519's, base64 (standard encoding).
	Signature string `json:"signature"`
	// PublicKey is the key that signed, as FormatPublicKey writes it: what
	// the host claims, which a verifier compares with the key it trusts
	// for the host, never uses instead of it.
	PublicKey string    `json:"publicKey"`
	SealedAt  time.Time `json:"sealedAt"`
}

// SealMessage is what a seal signs.
func SealMessage(runID string, count int64, last [32]byte) []byte {
	var b bytes.Buffer
	b.WriteString("runfleet egress seal v1\x00")
	b.WriteString(runID)
	b.WriteByte(0)
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(count))
	b.Write(n[:])
	b.Write(last[:])
	return b.Bytes()
}

// Sign seals runID's chain at count records with key.
func Sign(key ed25519.PrivateKey, runID string, count int64, last [32]byte, at time.Time) Seal {
	return Seal{
		Count:     count,
		LastHash:  hex.EncodeToString(last[:]),
		Signature: base64.StdEncoding.EncodeToString(ed25519.Sign(key, SealMessage(runID, count, last))),
		PublicKey: FormatPublicKey(key.Public().(ed25519.PublicKey)),
		SealedAt:  at.UTC(),
	}
}

// keyPrefix names the algorithm in a formatted public key.
const keyPrefix = "ed25519:"

// FormatPublicKey writes key as "ed25519:<base64>", the form /healthz and
// a seal carry.
func FormatPublicKey(key ed25519.PublicKey) string {
	return keyPrefix + base64.StdEncoding.EncodeToString(key)
}

// ParsePublicKey reads FormatPublicKey's form.
func ParsePublicKey(s string) (ed25519.PublicKey, error) {
	rest, ok := strings.CutPrefix(s, keyPrefix)
	if !ok {
		return nil, errors.New("egress: a ledger key must start with " + keyPrefix)
	}
	b, err := base64.StdEncoding.DecodeString(rest)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, errors.New("egress: a ledger key must hold 32 bytes of base64 after " + keyPrefix)
	}
	return ed25519.PublicKey(b), nil
}

// Verification is what Verify found. OK holds only when every record
// chains, the seal covers exactly the records given and its signature
// verifies with the trusted key.
type Verification struct {
	OK bool `json:"ok"`
	// Records is how many records were checked.
	Records int64 `json:"records"`
	// Sealed tells whether the ledger has a seal (a run's ledger is sealed
	// when the run ends).
	Sealed bool `json:"sealed"`
	// FailedSeq is the first record that fails (zero when the failure is
	// the seal's, or none); Problem says what failed, in words.
	FailedSeq int64  `json:"failedSeq,omitempty"`
	Problem   string `json:"problem,omitempty"`
}

// Verify checks runID's records (in the order given, which must be the
// ledger's whole, from seq 1) against their chain and seal, whose
// signature must verify with trusted (the key the verifier knows for the
// host, not the seal's own claim). A record's stored Hash is compared with
// the recomputed one, so the first record altered, removed or moved is the
// one named.
func Verify(runID string, records []Record, seal *Seal, trusted ed25519.PublicKey) Verification {
	v := Verification{Records: int64(len(records)), Sealed: seal != nil}
	prev := Genesis(runID)
	for i, r := range records {
		want := int64(i + 1)
		if r.Seq != want {
			v.FailedSeq, v.Problem = want, fmt.Sprintf("record %d is missing or out of order (found %d in its place)", want, r.Seq)
			return v
		}
		canonical, err := Canonical(r)
		if err != nil {
			v.FailedSeq, v.Problem = r.Seq, "record cannot be encoded"
			return v
		}
		next := Next(prev, canonical)
		if r.Hash != hex.EncodeToString(next[:]) {
			v.FailedSeq, v.Problem = r.Seq, fmt.Sprintf("record %d does not match its hash: it, or one before it, was altered", r.Seq)
			return v
		}
		prev = next
	}
	switch {
	case seal == nil:
		v.Problem = "the ledger is not sealed yet: its run has not ended"
		return v
	case seal.Count != int64(len(records)):
		v.Problem = fmt.Sprintf("the seal covers %d records, the ledger holds %d", seal.Count, len(records))
		return v
	case seal.LastHash != hex.EncodeToString(prev[:]):
		v.Problem = "the seal's last hash is not the chain's"
		return v
	case trusted == nil:
		v.Problem = "no ledger key is known for the host that ran it"
		return v
	}
	sig, err := base64.StdEncoding.DecodeString(seal.Signature)
	if err != nil || !ed25519.Verify(trusted, SealMessage(runID, seal.Count, prev), sig) {
		v.Problem = "the seal's signature does not verify with the host's ledger key"
		if seal.PublicKey != FormatPublicKey(trusted) {
			v.Problem += " (it names another key)"
		}
		return v
	}
	v.OK = true
	return v
}

// Summary counts a run's ledger: every decision, including those past
// the bound (a Dropped record's count is added to Requests).
type Summary struct {
	// Requests counts the decisions (records other than Dropped ones, and
	// the records those dropped).
	Requests int64 `json:"requests"`
	// Blocked counts the decisions that stopped traffic: blocked, denied,
	// withheld.
	Blocked int64 `json:"blocked"`
	// Warned counts the requests a rule in warn mode would have refused.
	Warned    int64 `json:"warned"`
	BytesUp   int64 `json:"bytesUp"`
	BytesDown int64 `json:"bytesDown"`
	Alerts    int64 `json:"alerts"`
	// Dropped counts the records not kept past the bound.
	Dropped int64 `json:"dropped"`
	// Authorities counts per authority, most requested first; at most
	// MaxAuthorities, the requests of the rest counted in OtherAuthorities.
	Authorities      []AuthoritySummary `json:"authorities"`
	OtherAuthorities int64              `json:"otherAuthorities,omitempty"`
}

// AuthoritySummary counts one authority's records.
type AuthoritySummary struct {
	Authority string   `json:"authority"`
	Requests  int64    `json:"requests"`
	Blocked   int64    `json:"blocked"`
	Keys      []string `json:"keys"`
}

// MaxAuthorities bounds Summary.Authorities, so a summary stays small
// whatever a task calls.
const MaxAuthorities = 50

// IsBlocked reports whether action stopped traffic.
func IsBlocked(action string) bool {
	return action == Blocked || action == Denied || action == Withheld
}
