package taskdns

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// grants is a Decide that resolves the names it lists and records every
// name it was asked about.
type grants struct {
	mu    sync.Mutex
	names []string
	asked []string
}

func (g *grants) decide(name string) Verdict {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.asked = append(g.asked, name)
	if slices.Contains(g.names, name) {
		return Resolve
	}
	return Refuse
}

func (g *grants) Asked() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.asked)
}

func newServer(t *testing.T, cfg Config, granted ...string) (*Server, *grants) {
	t.Helper()
	g := &grants{names: granted}
	if cfg.Decide == nil {
		cfg.Decide = g.decide
	}
	if cfg.Pins == nil {
		cfg.Pins = newPins(t, 100)
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, g
}

// query packs a query the way a stub resolver sends one.
func query(t testing.TB, id uint16, name string, qtype dnsmessage.Type) []byte {
	t.Helper()
	m := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: id, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: qtype, Class: dnsmessage.ClassINET}},
	}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func parse(t *testing.T, b []byte) dnsmessage.Message {
	t.Helper()
	var m dnsmessage.Message
	if err := m.Unpack(b); err != nil {
		t.Fatalf("answer does not parse: %v", err)
	}
	return m
}

// addrs lists the addresses of a message's answers, in order.
func addrs(m dnsmessage.Message) []string {
	var out []string
	for _, a := range m.Answers {
		switch b := a.Body.(type) {
		case *dnsmessage.AResource:
			out = append(out, netip.AddrFrom4(b.A).String())
		case *dnsmessage.AAAAResource:
			out = append(out, netip.AddrFrom16(b.AAAA).String())
		default:
			out = append(out, a.Header.Type.String())
		}
	}
	return out
}

func TestAnswerFollowsThePolicyPerNameAndType(t *testing.T) {
	s, _ := newServer(t, Config{}, "api.example.test")
	pin, _ := s.cfg.Pins.Pin("api.example.test") // the first pin, 198.18.0.1
	typeHTTPS := dnsmessage.Type(65)
	for _, tc := range []struct {
		name  string
		qtype dnsmessage.Type
		rcode dnsmessage.RCode
		addrs []string
	}{
		{"api.example.test.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{pin.String()}},
		{"API.Example.TEST.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{pin.String()}},
		{"api.example.test.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, nil},
		{"api.example.test.", dnsmessage.TypeMX, dnsmessage.RCodeSuccess, nil},
		{"api.example.test.", dnsmessage.TypeTXT, dnsmessage.RCodeSuccess, nil},
		{"api.example.test.", typeHTTPS, dnsmessage.RCodeSuccess, nil},
		{"api.example.test.", dnsmessage.TypeALL, dnsmessage.RCodeSuccess, nil},
		{"denied.example.test.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"denied.example.test.", dnsmessage.TypeAAAA, dnsmessage.RCodeNameError, nil},
		{"denied.example.test.", typeHTTPS, dnsmessage.RCodeNameError, nil},
		{"localhost.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"127.0.0.1"}},
		{"LocalHost.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, []string{"::1"}},
		{"db.svc.localhost.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"127.0.0.1"}},
		{"db.svc.localhost.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, []string{"::1"}},
		{"localhost.", dnsmessage.TypeMX, dnsmessage.RCodeSuccess, nil},
		// What netname.Canonical refuses is no name at all.
		{"intranet.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"10.0.0.1.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"host.123.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"_dmarc.example.test.", dnsmessage.TypeTXT, dnsmessage.RCodeNameError, nil},
		{".", dnsmessage.TypeNS, dnsmessage.RCodeNameError, nil},
		{"localhost.example.test.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
	} {
		resp := parse(t, s.Answer(query(t, 0xbeef, tc.name, tc.qtype)))
		got := addrs(resp)
		if resp.RCode != tc.rcode || !slices.Equal(got, tc.addrs) {
			t.Errorf("%s %v: %v %v, want %v %v", tc.name, tc.qtype, resp.RCode, got, tc.rcode, tc.addrs)
		}
		h := resp.Header
		if h.ID != 0xbeef || !h.Response || !h.RecursionDesired || !h.RecursionAvailable || h.Truncated || h.Authoritative {
			t.Errorf("%s %v: header %+v", tc.name, tc.qtype, h)
		}
		// The question comes back as asked, case included (clients that
		// randomise case check it).
		if len(resp.Questions) != 1 || resp.Questions[0].Name.String() != tc.name || resp.Questions[0].Type != tc.qtype {
			t.Errorf("%s %v: question echoed as %v", tc.name, tc.qtype, resp.Questions)
		}
		for _, a := range resp.Answers {
			if a.Header.Name.String() != tc.name || a.Header.TTL != 60 || a.Header.Class != dnsmessage.ClassINET {
				t.Errorf("%s %v: record header %+v", tc.name, tc.qtype, a.Header)
			}
		}
	}
	if n := s.cfg.Pins.Len(); n != 1 {
		t.Errorf("%d names pinned, want only api.example.test", n)
	}
}

func TestAnswerAsksThePolicyWithTheCanonicalNameOnly(t *testing.T) {
	s, g := newServer(t, Config{}, "xn--bcher-kva.example.test", "api.example.test")
	for _, name := range []string{"API.Example.Test.", "bücher.example.test.", "intranet.", "db.localhost.", "localhost.", "127.0.0.1."} {
		s.Answer(query(t, 1, name, dnsmessage.TypeA))
	}
	want := []string{"api.example.test", "xn--bcher-kva.example.test"}
	if got := g.Asked(); !slices.Equal(got, want) {
		t.Fatalf("Decide asked about %q, want %q", got, want)
	}
	a, _ := s.cfg.Pins.Pin("xn--bcher-kva.example.test")
	resp := parse(t, s.Answer(query(t, 1, "bücher.example.test.", dnsmessage.TypeA)))
	if got := addrs(resp); !slices.Equal(got, []string{a.String()}) {
		t.Fatalf("an IDN in UTF-8 resolved to %v, want its punycode name's pin %v", got, a)
	}
}

func TestAnswerRefusesWhatIsNotOneQuestionOfClassIN(t *testing.T) {
	s, g := newServer(t, Config{}, "api.example.test")
	name := dnsmessage.MustNewName("api.example.test.")
	pack := func(m dnsmessage.Message) []byte {
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	q := dnsmessage.Question{Name: name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}
	chaos := q
	chaos.Class = dnsmessage.ClassCHAOS
	good := query(t, 7, "api.example.test.", dnsmessage.TypeA)
	for _, tc := range []struct {
		what      string
		msg       []byte
		rcode     dnsmessage.RCode
		questions int
	}{
		{"no question", pack(dnsmessage.Message{Header: dnsmessage.Header{ID: 7}}), dnsmessage.RCodeFormatError, 0},
		{"two questions", pack(dnsmessage.Message{Header: dnsmessage.Header{ID: 7}, Questions: []dnsmessage.Question{q, q}}), dnsmessage.RCodeFormatError, 0},
		{"class CHAOS", pack(dnsmessage.Message{Header: dnsmessage.Header{ID: 7}, Questions: []dnsmessage.Question{chaos}}), dnsmessage.RCodeFormatError, 1},
		{"opcode STATUS", pack(dnsmessage.Message{Header: dnsmessage.Header{ID: 7, OpCode: 2}, Questions: []dnsmessage.Question{q}}), dnsmessage.RCodeNotImplemented, 0},
		{"opcode UPDATE", pack(dnsmessage.Message{Header: dnsmessage.Header{ID: 7, OpCode: 5}, Questions: []dnsmessage.Question{q}}), dnsmessage.RCodeNotImplemented, 0},
		{"question cut short", good[:len(good)-2], dnsmessage.RCodeFormatError, 0},
		{"header only, one question announced", good[:12], dnsmessage.RCodeFormatError, 0},
	} {
		resp := parse(t, s.Answer(tc.msg))
		if resp.ID != 7 || !resp.Response || resp.RCode != tc.rcode || len(resp.Questions) != tc.questions || len(resp.Answers) != 0 {
			t.Errorf("%s: %+v, want %v with %d questions", tc.what, resp, tc.rcode, tc.questions)
		}
		if tc.rcode == dnsmessage.RCodeNotImplemented && resp.OpCode != dnsmessage.OpCode(tc.msg[2]>>3&0xf) {
			t.Errorf("%s: opcode not echoed: %v", tc.what, resp.OpCode)
		}
	}
	if asked := g.Asked(); len(asked) != 0 {
		t.Errorf("Decide asked about %q for malformed queries", asked)
	}

	response := slices.Clone(good)
	response[2] |= 0x80 // QR: a response, not a query
	for what, msg := range map[string][]byte{"a response": response, "a short header": good[:11], "nothing": nil} {
		if resp := s.Answer(msg); resp != nil {
			t.Errorf("%s answered: % x", what, resp)
		}
	}
}

func TestAnswerIgnoresEDNS(t *testing.T) {
	s, _ := newServer(t, Config{}, "api.example.test")
	m := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: 9, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName("api.example.test."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}},
	}
	var opt dnsmessage.ResourceHeader
	if err := opt.SetEDNS0(1232, dnsmessage.RCodeSuccess, false); err != nil {
		t.Fatal(err)
	}
	m.Additionals = []dnsmessage.Resource{{Header: opt, Body: &dnsmessage.OPTResource{}}}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	resp := parse(t, s.Answer(b))
	if resp.RCode != dnsmessage.RCodeSuccess || !slices.Equal(addrs(resp), []string{"198.18.0.1"}) || len(resp.Additionals) != 0 {
		t.Fatalf("query with OPT: %+v", resp)
	}
}

func TestAnswerUsesTheConfiguredTTL(t *testing.T) {
	s, _ := newServer(t, Config{TTL: 5 * time.Second}, "api.example.test")
	for _, name := range []string{"api.example.test.", "localhost."} {
		resp := parse(t, s.Answer(query(t, 1, name, dnsmessage.TypeA)))
		if len(resp.Answers) != 1 || resp.Answers[0].Header.TTL != 5 {
			t.Errorf("%s: %+v, want one record with TTL 5", name, resp.Answers)
		}
	}
}

func TestAnswerPastTheLimitIsTruncated(t *testing.T) {
	s, _ := newServer(t, Config{}, "api.example.test")
	q := query(t, 3, "api.example.test.", dnsmessage.TypeA)
	full := parse(t, s.respond(q, maxUDPSize))
	if full.Truncated || len(full.Answers) != 1 {
		t.Fatalf("an A answer fits 512 bytes: %+v", full)
	}
	// No real answer of this server exceeds 512 bytes, so a smaller limit
	// stands in for a larger answer.
	b := s.respond(q, len(q)+1)
	cut := parse(t, b)
	if !cut.Truncated || len(cut.Answers) != 0 || cut.RCode != dnsmessage.RCodeSuccess || len(cut.Questions) != 1 || cut.ID != 3 {
		t.Fatalf("answer over the limit: %+v", cut)
	}
}

func TestAFullPinTableAnswersServfailAndWarnsOnceWithoutNames(t *testing.T) {
	logs := &syncbuf.Buffer{}
	s, _ := newServer(t, Config{
		Pins:   newPins(t, 1),
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	}, "one.example.test", "two.example.test", "three.example.test")
	for i, tc := range []struct {
		name  string
		qtype dnsmessage.Type
		rcode dnsmessage.RCode
	}{
		{"one.example.test.", dnsmessage.TypeA, dnsmessage.RCodeSuccess},
		{"two.example.test.", dnsmessage.TypeA, dnsmessage.RCodeServerFailure},
		{"three.example.test.", dnsmessage.TypeA, dnsmessage.RCodeServerFailure},
		{"two.example.test.", dnsmessage.TypeAAAA, dnsmessage.RCodeServerFailure},
		{"one.example.test.", dnsmessage.TypeA, dnsmessage.RCodeSuccess},
		{"one.example.test.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess},
	} {
		resp := parse(t, s.Answer(query(t, uint16(i), tc.name, tc.qtype)))
		if resp.RCode != tc.rcode {
			t.Errorf("%s %v: %v, want %v", tc.name, tc.qtype, resp.RCode, tc.rcode)
		}
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], `"level":"WARN"`) || !strings.Contains(lines[0], `"pinned":1`) {
		t.Fatalf("want one warning with the count, got:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "example") {
		t.Fatalf("a queried name reached the log:\n%s", logs.String())
	}
}

func TestNewServerNamesWhatIsMissing(t *testing.T) {
	pins := newPins(t, 1)
	decide := func(string) Verdict { return Resolve }
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Pins: pins}, "Decide is required"},
		{Config{Decide: decide}, "Pins is required"},
		{Config{Decide: decide, Pins: pins, TTL: -time.Second}, "TTL"},
		{Config{Decide: decide, Pins: pins, TTL: 1 << 31 * time.Second}, "TTL"},
		{Config{Decide: decide, Pins: pins, IdleTimeout: -1}, "IdleTimeout"},
		{Config{Decide: decide, Pins: pins, MaxConns: -1}, "MaxConns"},
	} {
		if _, err := NewServer(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewServer(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// FuzzAnswer feeds Answer arbitrary messages: it never panics, and what it
// answers is a response that parses and carries the query's ID.
func FuzzAnswer(f *testing.F) {
	for i, q := range []struct {
		name  string
		qtype dnsmessage.Type
	}{
		{"api.example.test.", dnsmessage.TypeA},
		{"api.example.test.", dnsmessage.TypeAAAA},
		{"denied.example.test.", dnsmessage.TypeA},
		{"localhost.", dnsmessage.TypeAAAA},
		{"x.localhost.", dnsmessage.TypeA},
		{"bücher.example.test.", dnsmessage.Type(65)},
		{"intranet.", dnsmessage.TypeMX},
	} {
		f.Add(query(f, uint16(i), q.name, q.qtype))
	}
	pins, err := NewPins(netip.MustParsePrefix(DefaultPinRange), 4)
	if err != nil {
		f.Fatal(err)
	}
	// A small table, so that the full-table path is fuzzed too.
	s, err := NewServer(Config{Pins: pins, Decide: func(name string) Verdict {
		if strings.Contains(name, "denied") {
			return Refuse
		}
		return Resolve
	}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		for _, limit := range []int{maxMessageSize, maxUDPSize} {
			resp := s.respond(msg, limit)
			if resp == nil {
				continue
			}
			if len(resp) > limit {
				t.Fatalf("answer of %d bytes over the limit of %d", len(resp), limit)
			}
			var m dnsmessage.Message
			if err := m.Unpack(resp); err != nil {
				t.Fatalf("answer to % x does not parse: %v", msg, err)
			}
			if len(msg) < 2 || m.ID != binary.BigEndian.Uint16(msg) || !m.Response {
				t.Fatalf("answer %+v to % x: not a response with the query's ID", m.Header, msg)
			}
		}
	})
}

// refusals records what a Server tells Config.Refused.
type refusals struct {
	mu  sync.Mutex
	got []string // "name: reason"
}

func (r *refusals) refused(name, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, name+": "+reason)
}

func (r *refusals) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// Each name answered NXDOMAIN is reported once, whatever type was asked
// and however often: one the policy refuses as canonical, one that is no
// name as asked, with why. What resolves, a localhost name, and a pin
// table that is full (SERVFAIL, not a refusal) report nothing.
func TestRefusedNamesAreReportedOnce(t *testing.T) {
	var r refusals
	s, _ := newServer(t, Config{Refused: r.refused, Pins: newPins(t, 1)}, "api.example.test", "full.example.test")
	for i, q := range []struct {
		name  string
		qtype dnsmessage.Type
		rcode dnsmessage.RCode
	}{
		{"api.example.test.", dnsmessage.TypeA, dnsmessage.RCodeSuccess},
		{"Nope.Example.Test.", dnsmessage.TypeA, dnsmessage.RCodeNameError},
		{"nope.example.test.", dnsmessage.TypeAAAA, dnsmessage.RCodeNameError},
		{"nope.example.test.", dnsmessage.TypeA, dnsmessage.RCodeNameError},
		{"exfil_data.example.test.", dnsmessage.TypeA, dnsmessage.RCodeNameError},
		{"intranet.", dnsmessage.TypeA, dnsmessage.RCodeNameError},
		{"intranet.", dnsmessage.TypeA, dnsmessage.RCodeNameError},
		{"a.localhost.", dnsmessage.TypeA, dnsmessage.RCodeSuccess},
		{"full.example.test.", dnsmessage.TypeA, dnsmessage.RCodeServerFailure},
	} {
		if got := parse(t, s.Answer(query(t, uint16(i), q.name, q.qtype))).RCode; got != q.rcode {
			t.Errorf("%s %v answered %v, want %v", q.name, q.qtype, got, q.rcode)
		}
	}
	want := []string{
		"nope.example.test: " + ReasonNotReached,
		"exfil_data.example.test: not a name edge resolves: not a valid DNS name",
		"intranet: not a name edge resolves: a single-label name is not allowed: use a fully qualified name",
	}
	if got := r.list(); !slices.Equal(got, want) {
		t.Errorf("reported\n%q\nwant\n%q", got, want)
	}
}

// Past maxReported distinct names, a Server remembers no more and reports
// every refusal: nothing refused goes unreported, and the set stays
// bounded.
func TestRefusedPastTheBoundAreReportedEachTime(t *testing.T) {
	var r refusals
	s, _ := newServer(t, Config{Refused: r.refused})
	for i := range maxReported {
		s.Answer(query(t, 1, fmt.Sprintf("n%d.example.test.", i), dnsmessage.TypeA))
	}
	for range 3 {
		s.Answer(query(t, 1, "late.example.test.", dnsmessage.TypeA))
	}
	if got := len(r.list()); got != maxReported+3 {
		t.Errorf("%d reports, want %d", got, maxReported+3)
	}
	if n := len(s.reported); n != maxReported {
		t.Errorf("the server remembers %d names, want at most %d", n, maxReported)
	}
}
