package taskdns

import (
	"errors"
	"strings"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/runfleet/runfleet/shared/netname"
)

const (
	// maxUDPSize is the largest answer sent over UDP (RFC 1035 4.2.1): the
	// server speaks no EDNS, so a client's larger buffer size is not used.
	maxUDPSize = 512
	// maxMessageSize is the largest message TCP's length prefix can carry
	// (RFC 1035 4.2.2).
	maxMessageSize = 65535
)

var (
	loopback4 = dnsmessage.AResource{A: [4]byte{127, 0, 0, 1}}
	loopback6 = dnsmessage.AAAAResource{AAAA: [16]byte{15: 1}}
)

// Answer is the pure decision: the response to one query message, nil to
// drop it (not a query, or no readable header). Exposed for tests and
// fuzzing; the response is the one TCP would carry (no size limit but DNS's
// own).
func (s *Server) Answer(query []byte) []byte {
	return s.respond(query, maxMessageSize)
}

// respond answers query; an answer longer than limit loses its records and
// says so (TC), as RFC 2181 9 asks.
func (s *Server) respond(query []byte, limit int) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		// Answering a response could make two servers bounce a packet back
		// and forth forever; with no header there is no ID to answer.
		return nil
	}
	resp := dnsmessage.Message{Header: dnsmessage.Header{
		ID:                 h.ID,
		Response:           true,
		OpCode:             h.OpCode,
		RecursionDesired:   h.RecursionDesired,
		RecursionAvailable: true, // for the task this is its recursive resolver
	}}
	if h.OpCode != 0 { // only QUERY: no NOTIFY, UPDATE, IQUERY, STATUS
		resp.RCode = dnsmessage.RCodeNotImplemented
		return s.pack(resp, limit)
	}
	// Exactly one question (RFC 9619); reading one more tells a second one
	// from the end without parsing a count's worth of questions.
	q, err := p.Question()
	if err != nil {
		resp.RCode = dnsmessage.RCodeFormatError
		return s.pack(resp, limit)
	}
	if _, err := p.Question(); !errors.Is(err, dnsmessage.ErrSectionDone) {
		resp.RCode = dnsmessage.RCodeFormatError
		return s.pack(resp, limit)
	}
	resp.Questions = []dnsmessage.Question{q}
	if q.Class != dnsmessage.ClassINET {
		resp.RCode = dnsmessage.RCodeFormatError
		return s.pack(resp, limit)
	}
	resp.RCode, resp.Answers = s.resolve(q)
	return s.pack(resp, limit)
}

// resolve decides one IN question: an rcode and the answer records.
func (s *Server) resolve(q dnsmessage.Question) (dnsmessage.RCode, []dnsmessage.Resource) {
	raw := q.Name.String()
	// localhost is a single label, which netname.Canonical refuses; RFC 6761 6.3
	// reserves it and every name under it for loopback.
	if strings.EqualFold(strings.TrimSuffix(raw, "."), "localhost") {
		return dnsmessage.RCodeSuccess, s.loopback(q)
	}
	name, err := netname.Canonical(raw)
	if err != nil {
		s.refused(strings.TrimSuffix(raw, "."), reasonNotAName+err.Error())
		return dnsmessage.RCodeNameError, nil
	}
	if strings.HasSuffix(name, ".localhost") {
		return dnsmessage.RCodeSuccess, s.loopback(q)
	}
	if s.cfg.Decide(name) != Resolve {
		s.refused(name, ReasonNotReached)
		return dnsmessage.RCodeNameError, nil
	}
	// Pinned whatever the type asked, so that a full table fails every type
	// alike: a client that gets SERVFAIL for A must not take a NODATA for
	// AAAA as "no such host".
	addr, ok := s.cfg.Pins.Pin(name)
	if !ok {
		if s.warnedFull.CompareAndSwap(false, true) {
			s.cfg.Logger.Warn("taskdns: the pin table is full; new names get SERVFAIL", "pinned", s.cfg.Pins.Len())
		}
		return dnsmessage.RCodeServerFailure, nil
	}
	if q.Type != dnsmessage.TypeA {
		// NODATA: the name exists but has no such record, so a client falls
		// back to the A record, and no AAAA, HTTPS or SVCB record can point
		// it at an address edge did not pin.
		return dnsmessage.RCodeSuccess, nil
	}
	return dnsmessage.RCodeSuccess, []dnsmessage.Resource{s.record(q, &dnsmessage.AResource{A: addr.As4()})}
}

// loopback answers a localhost name: 127.0.0.1, ::1, or nothing for other
// types.
func (s *Server) loopback(q dnsmessage.Question) []dnsmessage.Resource {
	switch q.Type {
	case dnsmessage.TypeA:
		return []dnsmessage.Resource{s.record(q, &loopback4)}
	case dnsmessage.TypeAAAA:
		return []dnsmessage.Resource{s.record(q, &loopback6)}
	}
	return nil
}

// record answers q with body, under the question's own spelling of the name
// (a client may randomise its case and check it comes back).
func (s *Server) record(q dnsmessage.Question, body dnsmessage.ResourceBody) dnsmessage.Resource {
	return dnsmessage.Resource{
		Header: dnsmessage.ResourceHeader{Name: q.Name, Type: q.Type, Class: dnsmessage.ClassINET, TTL: s.ttl},
		Body:   body,
	}
}

// pack encodes resp, dropping its records for TC if it exceeds limit.
func (s *Server) pack(resp dnsmessage.Message, limit int) []byte {
	b, err := resp.Pack()
	if err != nil {
		// Every name here was unpacked from the query, so this is a fault of
		// ours; the header alone always packs.
		s.cfg.Logger.Warn("taskdns: packing an answer", "error", err)
		resp.Questions, resp.Answers = nil, nil
		resp.RCode = dnsmessage.RCodeServerFailure
		b, _ = resp.Pack()
		return b
	}
	if len(b) > limit {
		resp.Answers = nil
		resp.Truncated = true
		b, _ = resp.Pack()
	}
	return b
}
