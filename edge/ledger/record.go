package ledger

import (
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/shared/egress"
)

// recordOf is the ledger record of one audit entry, seq unset: the
// proxy's decision as the run's ledger keeps it. An SSH request is via
// "ssh", its request as the method, its git command and repository as
// command and path; a name the task's DNS refused is via "dns"; the path
// carries the masked query the proxy put in Entry.Query. Every string is
// made valid UTF-8 here, so the record hashed is the record a reader
// decodes.
func recordOf(e *audit.Entry) egress.Record {
	r := egress.Record{
		TS: e.TS.UTC(), Authority: e.Host, Method: e.Method, Path: e.Path, Status: e.Status,
		BytesUp: e.BytesIn, BytesDown: e.BytesOut, DurationUs: e.Duration.Microseconds(),
		Action: string(e.Action), Reason: e.Reason, Rule: e.Rule, Alert: e.Alert,
	}
	switch {
	case e.SSH != nil:
		r.Via, r.Method, r.Command, r.Path = egress.ViaSSH, e.SSH.Request, e.SSH.Command, e.SSH.Repository
	case e.Via == audit.ViaDNS:
		r.Via = egress.ViaDNS
	case e.Via == audit.ViaTransparent:
		r.Via = egress.ViaTransparent
	default:
		r.Via = egress.ViaProxy
	}
	if e.SSH == nil && e.Query != "" {
		r.Path += "?" + e.Query
	}
	if len(e.Keys) > 0 {
		r.Keys = slices.Compact(slices.Sorted(slices.Values(e.Keys)))
	}
	eachString(&r, func(s string) string { return strings.ToValidUTF8(s, "\uFFFD") })
	return r
}

// eachString replaces each of r's strings with f's result.
func eachString(r *egress.Record, f func(string) string) {
	for _, p := range []*string{&r.Via, &r.Authority, &r.Method, &r.Path, &r.Command, &r.Action, &r.Reason, &r.Rule, &r.Alert} {
		*p = f(*p)
	}
	for i := range r.Keys {
		r.Keys[i] = f(r.Keys[i])
	}
}

// canonical is r's canonical form with the redactor run over it (nil: no
// redactor). A record's strings already had placeholders masked by the
// proxy; a real value found now is taken out of the very field it is in
// (defence in depth), so what is hashed is what is kept. The whole form
// is searched first, and fields one by one only when it holds a value.
func canonical(r *egress.Record, redact func([]byte) []byte) ([]byte, error) {
	b, err := egress.Canonical(*r)
	if err != nil || redact == nil {
		return b, err
	}
	if out := redact(b); len(out) == len(b) && (len(b) == 0 || &out[0] == &b[0]) {
		return b, nil // the redactor found nothing: it returns its input
	}
	eachString(r, func(s string) string { return string(redact([]byte(s))) })
	return egress.Canonical(*r)
}

// withHash is the stored form of a record whose canonical form is
// canonical: that object with "hash" added last (the canonical form never
// holds it), which decodes to the record with its Hash, without encoding
// the record a second time.
func withHash(canonical []byte, hash [32]byte) []byte {
	out := make([]byte, 0, len(canonical)+len(`,"hash":""`)+64)
	out = append(out, canonical[:len(canonical)-1]...)
	out = append(out, `,"hash":"`...)
	out = hex.AppendEncode(out, hash[:])
	return append(out, `"}`...)
}

// decode reads a stored record.
func decode(b []byte) (egress.Record, error) {
	var r egress.Record
	err := json.Unmarshal(b, &r)
	return r, err
}
