package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"testing"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/upstream"
)

// Every refusal maps to what the task sees and the audit records, for
// CONNECT refusals as for the pipeline's; an exchange's error maps by its
// kind, wrapped or not (exchangeFailed, the one place error kinds become
// statuses). A 407 asks for credentials, a 405 at the proxy says what is
// allowed.
func TestRefusalsMapEveryKind(t *testing.T) {
	for _, c := range []struct {
		name   string
		r      *refusal
		status int
		action audit.Action
		fields string
	}{
		{"credentials", refuseCredentials("proxy credentials missing, unknown or revoked"), 407, audit.Denied, `map[Proxy-Authenticate:[Basic realm="runfleet edge"]]`},
		{"attempt ended", refuseCredentials("the attempt ended"), 407, audit.Denied, `map[Proxy-Authenticate:[Basic realm="runfleet edge"]]`},
		{"method at the proxy", refuseMethod("only CONNECT is proxied", "CONNECT"), 405, audit.Denied, "map[Allow:[CONNECT]]"},
		{"method intercepted", refuseMethod("CONNECT inside an intercepted connection", ""), 405, audit.Denied, "map[]"},
		{"bad request", refuseBadRequest("CONNECT target: missing port"), 400, audit.Denied, "map[]"},
		{"target", refuseTarget("no key of this task reaches x.example:443; egress is strict"), 403, audit.Denied, "map[]"},
		{"misdirected", refuseMisdirected("no Host"), 421, audit.Denied, "map[]"},
		{"blocked", refuseBlocked("a placeholder in the method", policy.KeyRef{}), 403, audit.Blocked, "map[]"},
		{"withheld", refuseWithheld(policy.KeyRef{}), 403, audit.Withheld, "map[]"},
		{"limit in the head", refuseLimit(false, reasonTooManySubstitutions, policy.KeyRef{}), 431, audit.Blocked, "map[]"},
		{"limit in the body", refuseLimit(true, reasonTooManySubstitutions, policy.KeyRef{}), 413, audit.Blocked, "map[]"},
		{"unscannable", refuseUnscannable(), 502, audit.Blocked, "map[]"},
		{"upgrade", refuseUpgrade(), 501, audit.Blocked, "map[]"},
		{"upstream refused", exchangeFailed(&upstream.RefusedError{Host: "h", Addr: netip.MustParseAddrPort("10.0.0.1:443"), Verdict: upstream.AddressVerdict{Reason: "a private address"}}), 403, audit.Denied, "map[]"},
		{"fault", fault(errors.New("the secrets source failed"), policy.KeyRef{}), 500, audit.Denied, "map[]"},
		{"no uplink", exchangeFailed(fmt.Errorf("dialing: %w", upstream.ErrNoUplink)), 502, audit.Denied, "map[]"},
		{"cancelled", exchangeFailed(context.Canceled), 502, audit.Denied, "map[]"},
		{"unreachable", exchangeFailed(errors.New("connection refused")), 502, audit.Denied, "map[]"},
	} {
		r := c.r
		if r.status != c.status || r.action != c.action || r.reason == "" {
			t.Errorf("%s: %d %s %q, want %d %s", c.name, r.status, r.action, r.reason, c.status, c.action)
		}
		if got := fmt.Sprint(map[string][]string(r.header)); got != c.fields {
			t.Errorf("%s: fields %s, want %s", c.name, got, c.fields)
		}
		if r.status == http.StatusInternalServerError && r.reason != "internal error" {
			t.Errorf("a fault shows its cause: %q", r.reason)
		}
	}
}
