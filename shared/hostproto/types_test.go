package hostproto

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/runspec"
)

// A value travels as JSON and nowhere else: every fmt verb and both of
// slog's handlers (Fleet logs JSON, which marshals a struct it is given
// unless the struct says how it logs) show a request carrying one without
// it, naming its keys.
func TestAValueOnTheWirePrintsAndLogsRedacted(t *testing.T) {
	const value = "ghs_ValueOnTheWire0123456789abcdefABCD"
	b := BrokeredValue{ProjectID: "acme", Key: "GH", Value: value, ExpiresAt: time.Date(2026, 5, 4, 13, 0, 0, 0, time.UTC)}
	start := StartRequest{ClientToken: "ct-1", Credentials: []BrokeredValue{b}, Request: runspec.Request{Agent: "shell"}}
	put := CredentialsRequest{Credentials: []BrokeredValue{b}}
	wire, err := json.Marshal(put)
	if err != nil || !bytes.Contains(wire, []byte(value)) {
		t.Fatalf("the wire form lost the value: %s %v", wire, err)
	}
	for _, x := range []any{b, &b, start, &start, put, &put, b.Value} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d"} {
			if s := fmt.Sprintf(verb, x); strings.Contains(s, value) || strings.Contains(strings.ToLower(s), fmt.Sprintf("%x", value)) {
				t.Errorf("%s of a %T shows the value", verb, x)
			}
		}
		for name, h := range map[string]func(*bytes.Buffer) slog.Handler{
			"JSON": func(w *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(w, nil) },
			"text": func(w *bytes.Buffer) slog.Handler { return slog.NewTextHandler(w, nil) },
		} {
			var buf bytes.Buffer
			slog.New(h(&buf)).Info("sent", "request", x)
			if strings.Contains(buf.String(), value) {
				t.Errorf("slog's %s handler shows a %T's value: %s", name, x, buf.String())
			}
			if _, isValue := x.(SecretString); !isValue && !strings.Contains(buf.String(), "acme/GH") {
				t.Errorf("slog's %s handler does not name a %T's key: %s", name, x, buf.String())
			}
		}
	}
}
