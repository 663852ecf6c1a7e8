package proxy

import (
	"errors"
	"net"
	"net/http"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy/placeholder"
)

// interceptToScrub serves a connection decided policy.InterceptToScrub: a
// name no key of the task reaches, under open egress, for a run holding a
// key an upstream may store. A tunnel there would hand the task back
// whatever an upstream kept of a value, so the connection
// goes through the pipeline like a granted one, answers scrubbed, and what
// the proxy cannot read does not leave: a connection whose first byte is
// not TLS (plain HTTP, SSH), one that says nothing within the handshake
// timeout (a protocol whose server speaks first), and a handshake the
// client fails (it pins its certificate or does not trust edge's CA) are
// each refused and audited (denied, 403) with policy.StorableEgressRule.
// For the explicit proxy the CONNECT's 200 has been sent already; the
// refusal then closes the tunnel it opened.
//
// The leaf for a name the policy does not list is allowed by the leaf
// source only while AdmitName holds it: around this handshake alone.
func (p *Proxy) interceptToScrub(a *attempt, c *bufferedConn, ci *connInfo, ix *placeholder.Index, entry audit.Entry) {
	deny := func(reason string) {
		entry.Action, entry.Status, entry.Reason = audit.Denied, http.StatusForbidden, reason
		entry.Duration = p.cfg.Clock.Now().Sub(entry.TS)
		p.cfg.Audit.Record(entry)
	}
	// The name is whatever the task connected to, so it may hold a
	// placeholder: reasons name it redacted, as the audit's Host does.
	host := ci.logHost
	first, err := c.peekByte()
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			deny("nothing was sent to " + host + " within the handshake timeout, so it is not TLS; " + policy.StorableEgressRule)
		}
		return // closed before saying anything: nothing was refused
	}
	if first != tlsHandshakeRecord {
		entry.Action = audit.Denied
		p.refuseNotTLS(c, ix, entry,
			"plain HTTP to "+host+"; "+policy.StorableEgressRule,
			"neither TLS nor HTTP to "+host+"; "+policy.StorableEgressRule)
		return
	}
	release := p.cfg.Leaves.AdmitName(ci.target.Name)
	tc, err := p.handshake(a, c, ci)
	release()
	if err != nil {
		// The error is the TLS stack's (an alert the client sent, a
		// timeout) or the leaf source's, never a value; redacted all the
		// same, as everything the task may have shaped is.
		deny("the TLS handshake with the task for " + host + " failed (" + ix.Redacted(err.Error()) +
			"): its client may pin its certificate or not trust edge's CA; " + policy.StorableEgressRule)
		return
	}
	p.serveIntercepted(a, tc, ci)
}
