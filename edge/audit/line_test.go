package audit

import (
	"encoding/json"
	"testing"
	"time"
)

// entryJSON is the line's schema as encoding/json writes it: the reference
// appendLine is held to.
type entryJSON struct {
	Entry
	DurationMs float64 `json:"durationMs"`
	UpstreamMs float64 `json:"upstreamMs,omitempty"`
}

func referenceLine(t testing.TB, e Entry) string {
	b, err := json.Marshal(entryJSON{Entry: e, DurationMs: ms(e.Duration), UpstreamMs: ms(e.Upstream)})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestLineIsWhatEncodingJSONWrites(t *testing.T) {
	ts := time.Date(2026, 11, 30, 10, 0, 0, 123456789, time.UTC)
	for _, e := range []Entry{
		{TS: ts, Action: Forwarded, Host: "api.example.test:443"},
		{TS: ts.Truncate(time.Second), Task: "run-1", Action: Substituted, Keys: []string{"acme/K"}, Host: "api.example.test:8443",
			Method: "GET", Path: "/v1/x", Status: 200, BytesIn: 12, BytesOut: 1 << 40, Scrubbed: 3, Duration: 1500 * time.Microsecond, Upstream: 999 * time.Microsecond},
		{TS: ts, Task: "run-2", Action: Blocked, Reason: `key acme/K may not reach <b>&"x"\y` + "\n\t\r\b\f\x00\x1f\x7f", Keys: []string{"acme/A", "acme/B"},
			Host: "b.example:443", Method: "POST", Path: "/p/\u2028\u2029/é/\xff\xfe", Status: 403, Duration: time.Nanosecond},
		{TS: ts, Action: Denied, Host: "h:1", Duration: 3 * time.Hour, Upstream: 400 * time.Nanosecond},
		{TS: ts, Task: "run-3", Action: Tunnelled, Host: "203.0.113.7:22", Status: 200, BytesIn: 1, Via: ViaTransparent},
		{TS: ts, Action: Action("other"), Host: "", Keys: []string{}},
		{TS: ts, Action: Forwarded, Host: "h:2", Duration: 1<<50*time.Microsecond + 7*time.Microsecond, Upstream: -(1<<50 - 1) * time.Microsecond},
		{TS: ts, Action: Forwarded, Host: "h:3", Duration: 1000 * time.Microsecond, Upstream: 10*time.Microsecond + 999},
		{TS: ts, Task: "run-4", Action: Substituted, Keys: []string{"acme/AWS"}, Host: "s3.us-east-1.amazonaws.com:443", Method: "PUT", Status: 200,
			AWS: &AWSSigning{Region: "us-east-1", Service: "s3", Payload: "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"}},
		{TS: ts, Task: "run-5", Action: Blocked, Reason: "signature_mismatch", Host: "s3.amazonaws.com:443",
			AWS: &AWSSigning{Region: "<eu>", Service: `s"3`, Payload: "literal", Presigned: true}},
		{TS: ts, Task: "run-5", Action: Substituted, Keys: []string{"acme/GIT_SSH"}, Host: "github.com:22", Status: 200,
			SSH: &SSHCommand{Request: "exec", Command: "git-upload-pack", Repository: "org/<repo>", ExitStatus: new(0)}},
		{TS: ts, Task: "run-6", Action: Blocked, Host: "github.com:22", Status: 403, Reason: "a shell is not allowed",
			SSH: &SSHCommand{Request: "shell"}},
		{TS: ts, Task: "run-7", Action: Warned, Host: "github.com:443", Method: "POST", Path: "/o/r.git/git-receive-pack", Status: 200,
			Rule: "projects.gh.keys.TOKEN.rules[0]", Query: "service=*"},
		{TS: ts, Task: "run-8", Action: Blocked, Host: "x.test:443", Status: 403, Reason: "real_value_from_task", Alert: "real_value_from_task"},
	} {
		if got, want := string(appendLine(nil, &e)), referenceLine(t, e); got != want {
			t.Errorf("line\n got %s\nwant %s", got, want)
		}
	}
}

// FuzzLine: whatever the strings and numbers, the line is encoding/json's.
func FuzzLine(f *testing.F) {
	f.Add("run-1", "reason <&>", "acme/K", "host:443", "GET", "/p\u2028\xff", 200, int64(5), int64(-1), int64(1500000))
	f.Fuzz(func(t *testing.T, task, reason, key, host, method, path string, status int, in, out, dur int64) {
		e := Entry{TS: time.Unix(1_800_000_000, dur).UTC(), Task: task, Action: Action(reason + "!"), Reason: reason, Keys: []string{key, task},
			Host: host, Method: method, Path: path, Status: status, BytesIn: in, BytesOut: out, Scrubbed: status / 3, Via: path, Duration: time.Duration(dur), Upstream: time.Duration(in),
			Rule: key, Alert: host, Query: path}
		if status%2 == 0 {
			e.AWS = &AWSSigning{Region: reason, Service: method, Payload: path, Presigned: status%4 == 0}
		}
		if status%3 == 0 {
			e.SSH = &SSHCommand{Request: method, Command: path, Repository: reason}
			if status%9 == 0 {
				e.SSH.ExitStatus = new(status)
			}
		}
		if got, want := string(appendLine(nil, &e)), referenceLine(t, e); got != want {
			t.Fatalf("line\n got %s\nwant %s", got, want)
		}
	})
}
