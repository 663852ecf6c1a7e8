package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"testing"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/upstream"
)

// classify is the one mapping from error kinds to what the task sees and
// the audit records, for CONNECT refusals as for the pipeline's; a wrapped
// error maps as its kind. A 407 asks for credentials, a 405 at the proxy
// says what is allowed.
func TestClassifyMapsEveryKind(t *testing.T) {
	p := &Proxy{}
	for _, c := range []struct {
		err    error
		status int
		action audit.Action
		fields string
	}{
		{credentialsError{"proxy credentials missing, unknown or revoked"}, 407, audit.Denied, `map[Proxy-Authenticate:[Basic realm="runfleet edge"]]`},
		{credentialsError{"the attempt ended"}, 407, audit.Denied, `map[Proxy-Authenticate:[Basic realm="runfleet edge"]]`},
		{methodError{"only CONNECT is proxied", "CONNECT"}, 405, audit.Denied, "map[Allow:[CONNECT]]"},
		{methodError{reason: "CONNECT inside an intercepted connection"}, 405, audit.Denied, "map[]"},
		{badRequestError{"CONNECT target: missing port"}, 400, audit.Denied, "map[]"},
		{refusedTargetError{"no key of this task reaches x.example:443; egress is strict"}, 403, audit.Denied, "map[]"},
		{misdirectedError{"no Host"}, 421, audit.Denied, "map[]"},
		{fmt.Errorf("wrapped: %w", misdirectedError{"no Host"}), 421, audit.Denied, "map[]"},
		{&blockedError{reason: "a placeholder in the method"}, 403, audit.Blocked, "map[]"},
		{&withheldError{}, 403, audit.Withheld, "map[]"},
		{&limitError{reason: reasonTooManySubstitutions}, 431, audit.Blocked, "map[]"},
		{&limitError{inBody: true, reason: reasonTooManySubstitutions}, 413, audit.Blocked, "map[]"},
		{unscannableError{}, 502, audit.Blocked, "map[]"},
		{&upstream.RefusedError{Host: "h", Addr: netip.MustParseAddrPort("10.0.0.1:443"), Verdict: upstream.AddressVerdict{Reason: "a private address"}}, 403, audit.Denied, "map[]"},
		{&faultError{errors.New("the secrets source failed")}, 500, audit.Denied, "map[]"},
		{fmt.Errorf("dialing: %w", upstream.ErrNoUplink), 502, audit.Denied, "map[]"},
		{context.Canceled, 502, audit.Denied, "map[]"},
		{errors.New("connection refused"), 502, audit.Denied, "map[]"},
	} {
		status, action, reason := p.classify(c.err)
		if status != c.status || action != c.action || reason == "" {
			t.Errorf("%T %v: %d %s %q, want %d %s", c.err, c.err, status, action, reason, c.status, c.action)
		}
		if got := fmt.Sprint(map[string][]string(answerFields(c.err))); got != c.fields {
			t.Errorf("%T: fields %s, want %s", c.err, got, c.fields)
		}
		if status == http.StatusInternalServerError && reason != "internal error" {
			t.Errorf("a fault shows its cause: %q", reason)
		}
	}
}
