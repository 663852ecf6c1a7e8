package proxy

import (
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
)

// ruleState is a request's decisions by its keys' request rules
// (policy.DecideRequest, issue 31 item 4). A key's rules govern the
// requests that carry it, so each key is decided where its first
// occurrence is (substitute; resignAWSRequest for an aws key's
// signature), on what the task sent, noted before anything of it was
// substituted. Every front reaches those two places: HTTP/1.1, HTTP/2,
// a WebSocket's handshake (and its messages, decided on the handshake's
// method and path) and transparent connections. Under requestState.mu:
// a streamed body's occurrences are decided on the upstream body writer's
// goroutine.
type ruleState struct {
	// noted: a granted key has rules, and in is what they read.
	noted bool
	in    policy.RequestInput
	// decided are the keys decided, each with its refusal (nil: it went).
	decided []ruledKey
	// warned is the first decision warn mode let through, allowed the
	// first rule that let a key go: the audit line's rule (ruleOutcome).
	warned  policy.RequestDecision
	allowed string
}

type ruledKey struct {
	ref     policy.KeyRef
	refused *refusal
}

// methodOverrideFields carry a method an upstream may act on instead of
// the request's own (Google's APIs, Symfony, Laravel); a _method query
// parameter is the other way.
var methodOverrideFields = [...]string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// noteRuleInput keeps what the request rules read of r, as the task sent
// it: before any placeholder in it is substituted (a url key's changes
// the path), and only when a key of the task has rules.
func (st *requestState) noteRuleInput(r *http.Request) {
	if !slices.ContainsFunc(st.grants.granted, func(g policy.Granted) bool { return g.Rules != nil }) {
		return
	}
	// The path as the forwarder writes it (http1.WriteRequestTarget,
	// and x/net/http2's :path alike).
	in := policy.RequestInput{Method: r.Method, Path: r.URL.EscapedPath()}
	switch {
	case r.URL.Opaque != "":
		in.Path = "" // not a path: refused by a key whose rules name paths
	case in.Path == "":
		in.Path = "/"
	}
	for _, name := range methodOverrideFields {
		for _, v := range r.Header[name] {
			in.Overrides = appendMethods(in.Overrides, strings.Split(v, ","))
		}
	}
	if r.URL.RawQuery != "" {
		// Some servers split a query at ";" as at "&" (url.ParseQuery
		// drops such a pair instead).
		q, _ := url.ParseQuery(strings.ReplaceAll(r.URL.RawQuery, ";", "&"))
		in.Overrides = appendMethods(in.Overrides, q["_method"])
	}
	st.rules = ruleState{noted: true, in: in}
}

// appendMethods appends the methods named, an empty one left out: an
// empty override field names none.
func appendMethods(to, methods []string) []string {
	for _, m := range methods {
		if m = strings.TrimSpace(m); m != "" {
			to = append(to, m)
		}
	}
	return to
}

// ruleRefusal is ruleRefusalLocked taking st.mu.
func (st *requestState) ruleRefusal(ref policy.KeyRef) *refusal {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.ruleRefusalLocked(ref)
}

// ruleRefusalLocked decides the request by ref's rules, once per key: the
// refusal when they refuse it in enforce mode, nil when it may go (warn
// mode's refusal kept for the audit line). ref is a key the substitution
// or signing decision let through, so one of the task's. st.mu is held.
func (st *requestState) ruleRefusalLocked(ref policy.KeyRef) *refusal {
	rs := &st.rules
	if !rs.noted {
		return nil
	}
	for _, k := range rs.decided {
		if k.ref == ref {
			return k.refused
		}
	}
	var refused *refusal
	if g := st.grants.index(ref); g >= 0 && st.grants.granted[g].Rules != nil {
		d := policy.DecideRequest(st.grants.granted[g].Rules, rs.in)
		switch {
		case !d.Allow:
			refused = refuseBlocked(d.Reason, ref)
			refused.rule = d.Rule
		case d.Warn:
			if !rs.warned.Warn {
				rs.warned = d
			}
		case rs.allowed == "":
			rs.allowed = d.Rule
		}
	}
	rs.decided = append(rs.decided, ruledKey{ref, refused})
	return refused
}

// ruleOutcomeLocked puts the rules' part of a forwarded request's decision
// on its audit line: the rule that refused it, else the rule warn mode let
// it past (action Warned), else the rule that let its keys go. st.mu is
// held.
func (st *requestState) ruleOutcomeLocked(e *audit.Entry) {
	switch w := st.rules.warned; {
	case st.refused != nil:
		e.Rule = st.refused.rule
	case w.Warn:
		e.Action, e.Rule = audit.Warned, w.Rule
		if e.Reason == "" {
			e.Reason = "warned: " + w.Reason + "; warn mode let it through"
		}
	default:
		e.Rule = st.rules.allowed
	}
}
