package ledger

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/shared/egress"
)

// recordOf is the ledger record of one audit entry, seq unset: the
// proxy's decision as the run's ledger keeps it. An SSH request is via
// "ssh", its request as the method, its git command and repository as
// command and path; a name the task's DNS refused is via "dns"; the path
// carries the masked query the proxy put in Entry.Query. Every string is
// made valid UTF-8 here: encoding/json writes an invalid byte as the
// escape \ufffd but the U+FFFD a reader decodes it to as itself, so a
// record hashed with invalid bytes would not verify once read. The record
// may share e's Keys, which is never changed in place (eachString copies
// it first).
func recordOf(e *audit.Entry) egress.Record {
	r := egress.Record{
		TS: e.TS.UTC(), Authority: e.Host, Method: e.Method, Path: e.Path, Status: e.Status,
		BytesUp: e.BytesIn, BytesDown: e.BytesOut, DurationUs: e.Duration.Microseconds(),
		Action: string(e.Action), Reason: e.Reason, Rule: e.Rule, Alert: e.Alert, Keys: e.Keys,
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
	// Sorted and without repeats (the proxy's usual one key already is).
	if !strictlySorted(r.Keys) {
		r.Keys = slices.Compact(slices.Sorted(slices.Values(r.Keys)))
	}
	eachString(&r, validUTF8)
	return r
}

// tallied is what egress.Tally reads of e's record: recordOf's fields the
// tally counts, without the rest (a dropped record is only counted).
func tallied(e *audit.Entry) egress.Record {
	r := egress.Record{Authority: e.Host, BytesUp: e.BytesIn, BytesDown: e.BytesOut, Action: string(e.Action), Alert: e.Alert, Keys: e.Keys}
	if !strictlySorted(r.Keys) {
		r.Keys = slices.Compact(slices.Sorted(slices.Values(r.Keys)))
	}
	validTallied(&r)
	return r
}

// validTallied makes r's authority and keys valid UTF-8, copying Keys
// before it changes one.
func validTallied(r *egress.Record) {
	r.Authority = validUTF8(r.Authority)
	copied := false
	for i, k := range r.Keys {
		if v := validUTF8(k); v != k {
			if !copied {
				r.Keys, copied = slices.Clone(r.Keys), true
			}
			r.Keys[i] = v
		}
	}
}

func validUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

func strictlySorted(ks []string) bool {
	for i := 1; i < len(ks); i++ {
		if ks[i-1] >= ks[i] {
			return false
		}
	}
	return true
}

// eachString replaces each of r's strings with f's result, copying Keys
// before it changes one of them.
func eachString(r *egress.Record, f func(string) string) {
	for _, p := range []*string{&r.Via, &r.Authority, &r.Method, &r.Path, &r.Command, &r.Action, &r.Reason, &r.Rule, &r.Alert} {
		*p = f(*p)
	}
	copied := false
	for i, k := range r.Keys {
		if v := f(k); v != k {
			if !copied {
				r.Keys, copied = slices.Clone(r.Keys), true
			}
			r.Keys[i] = v
		}
	}
}

// appendCanonical appends r's canonical form: egress.Canonical's bytes
// (encoding/json's of egress.Record without its hash: field names, order,
// omissions and escaping), written by hand because the writer makes one
// per request a run sends and reflection was most of its cost. A test
// holds it to egress.Canonical, field by field of egress.Record: a field
// added there fails it until it is written here too.
func appendCanonical(b []byte, r *egress.Record) []byte {
	b = append(b, `{"seq":`...)
	b = strconv.AppendInt(b, r.Seq, 10)
	b = append(b, `,"ts":"`...)
	b = r.TS.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","via":`...)
	b = audit.AppendJSONString(b, r.Via)
	for _, f := range [...]struct {
		name  string
		value string
	}{{`,"authority":`, r.Authority}, {`,"method":`, r.Method}, {`,"path":`, r.Path}, {`,"command":`, r.Command}} {
		if f.value != "" {
			b = append(b, f.name...)
			b = audit.AppendJSONString(b, f.value)
		}
	}
	if r.Status != 0 {
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(r.Status), 10)
	}
	b = append(b, `,"bytesUp":`...)
	b = strconv.AppendInt(b, r.BytesUp, 10)
	b = append(b, `,"bytesDown":`...)
	b = strconv.AppendInt(b, r.BytesDown, 10)
	b = append(b, `,"durationUs":`...)
	b = strconv.AppendInt(b, r.DurationUs, 10)
	if len(r.Keys) > 0 {
		b = append(b, `,"keys":[`...)
		for i, k := range r.Keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = audit.AppendJSONString(b, k)
		}
		b = append(b, ']')
	}
	b = append(b, `,"action":`...)
	b = audit.AppendJSONString(b, r.Action)
	for _, f := range [...]struct {
		name  string
		value string
	}{{`,"reason":`, r.Reason}, {`,"rule":`, r.Rule}, {`,"alert":`, r.Alert}} {
		if f.value != "" {
			b = append(b, f.name...)
			b = audit.AppendJSONString(b, f.value)
		}
	}
	if r.Dropped != 0 {
		b = append(b, `,"dropped":`...)
		b = strconv.AppendInt(b, r.Dropped, 10)
	}
	return append(b, '}')
}

// encoder writes records' canonical forms into one buffer it reuses: the
// writer's, on its goroutine alone.
type encoder struct{ buf []byte }

func newEncoder() *encoder { return &encoder{} }

// canonical is r's canonical form with the redactor run over it (nil:
// none), valid until the next call. A record's strings already had
// placeholders masked by the proxy; a real value found now is taken out of
// the very field it is in (defence in depth), so what is hashed is what is
// kept. The whole form is searched first, and fields one by one only when
// it holds a value.
func (e *encoder) canonical(r *egress.Record, redact func([]byte) []byte) ([]byte, error) {
	if y := r.TS.Year(); y < 0 || y > 9999 {
		// encoding/json refuses such a time; so does the chain.
		return nil, fmt.Errorf("ledger: a record's time %v is outside years 0 to 9999", r.TS)
	}
	e.buf = appendCanonical(e.buf[:0], r)
	if redact == nil {
		return e.buf, nil
	}
	if out := redact(e.buf); len(out) == len(e.buf) && (len(out) == 0 || &out[0] == &e.buf[0]) {
		return e.buf, nil // the redactor found nothing: it returns its input
	}
	eachString(r, func(s string) string { return validUTF8(string(redact([]byte(s)))) })
	e.buf = appendCanonical(e.buf[:0], r)
	return e.buf, nil
}

// appendStored appends the stored form of a record whose canonical form is
// canonical, and a newline (runlog.EgressChunk): that object with "hash"
// added last (the canonical form never holds it), which decodes to the
// record with its Hash, without encoding the record a second time.
func appendStored(dst, canonical []byte, hash [32]byte) []byte {
	dst = append(dst, canonical[:len(canonical)-1]...)
	dst = append(dst, `,"hash":"`...)
	dst = hex.AppendEncode(dst, hash[:])
	return append(dst, "\"}\n"...)
}

// decode reads a stored record.
func decode(b []byte) (egress.Record, error) {
	var r egress.Record
	err := json.Unmarshal(b, &r)
	return r, err
}
