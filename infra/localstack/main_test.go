package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEnumeratedVariablesRefuseTheStart: a value outside a variable's set
// stops the stack before it starts anything (no data dir made, exit 2),
// naming the variable and every allowed value, as one JSON record on the
// log and as a sentence on the terminal.
func TestEnumeratedVariablesRefuseTheStart(t *testing.T) {
	for _, c := range []struct{ name, value, want string }{
		{EnvEdge, "of", `RUNFLEET_EDGE: "of" is not one of on, off`},
		{EnvEdge, "OFF", `RUNFLEET_EDGE: "OFF" is not one of on, off`},
		{EnvEdge, "false", `RUNFLEET_EDGE: "false" is not one of on, off`},
		{"RUNFLEET_LOG_LEVEL", "verbose", `RUNFLEET_LOG_LEVEL: "verbose" is not one of debug, info, warn, error`},
		{"RUNFLEET_STORE", "sqlite:x.db", `RUNFLEET_STORE: "sqlite:x.db" is not one of dynamodb, bolt:<path>`},
		// Not enumerated, but refused the same way: the stack's wakes
		// never leave its process.
		{"RUNFLEET_WAKE_QUEUE", "https://sqs.us-east-1.amazonaws.com/123456789012/wakes",
			`RUNFLEET_WAKE_QUEUE="https://sqs.us-east-1.amazonaws.com/123456789012/wakes": the local stack wakes through a queue in its own process; unset it`},
		{"EDGE_SECRETS_PROXY", "of", `EDGE_SECRETS_PROXY="of": set it to "off" to keep the secrets proxy down, or leave it unset (or "on") to run it`},
	} {
		t.Run(c.name+"="+c.value, func(t *testing.T) {
			dataDir := filepath.Join(t.TempDir(), "data")
			env := map[string]string{c.name: c.value, EnvDataDir: dataDir, "RUNFLEET_ADDR": "127.0.0.1:0"}
			var log, human strings.Builder
			code := run(context.Background(), func(k string) string { return env[k] }, &log, &human)
			if code != 2 {
				t.Fatalf("exit %d, want 2\nlog: %s", code, log.String())
			}
			if got, want := human.String(), "localstack: configuration: "+c.want+"\n"; got != want {
				t.Fatalf("said %q\nwant %q", got, want)
			}
			var rec struct{ Level, Msg, Err string }
			if err := json.Unmarshal([]byte(log.String()), &rec); err != nil || rec.Level != "ERROR" || rec.Err != "configuration: "+c.want {
				t.Fatalf("the log %q (%v): want one ERROR record with err %q", log.String(), err, "configuration: "+c.want)
			}
			if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the refused start made its data dir (%v)", err)
			}
		})
	}
}
