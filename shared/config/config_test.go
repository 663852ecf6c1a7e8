package config

import (
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/credentials"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestFromEnvDefaults(t *testing.T) {
	c, err := FromEnv(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Tables != dynamostore.DefaultTableNames() || c.Addr != DefaultAddr || c.RetentionDays != 30 ||
		c.HostTimeout != 10*time.Second || c.ProbeTimeout != 5*time.Second || c.ProbeMaxAge != 30*time.Minute ||
		c.ProbeConcurrency != 8 || c.Store != "" || c.Credentials != (credentials.Spec{}) || c.LogLevel != slog.LevelInfo {
		t.Fatalf("defaults = %+v", c)
	}
	if c.StreamPollInterval != time.Second || c.StreamKeepAlive != 15*time.Second || c.StreamMaxDuration != 14*time.Minute ||
		c.ProbeInterval != 10*time.Second || c.SweepInterval != 10*time.Second || c.AdminTokenTTL != time.Minute ||
		c.StreamIdleTimeout != 3*time.Minute || c.StreamMaxPerCaller != 10 {
		t.Fatalf("stream and timer defaults = %+v", c)
	}
	if c.Retention() != 30*24*time.Hour {
		t.Fatalf("retention = %v", c.Retention())
	}
	// Nothing waits unless asked; a quiet host's probe is written every
	// 15 minutes; no wake queue, no class reported beyond what is seen.
	if c.QueueTimeout != 0 || c.QueueMaxTimeout != 24*time.Hour || c.ProbeRefresh != 15*time.Minute ||
		c.WakeQueue != "" || c.CapacityClasses != nil {
		t.Fatalf("queue and probe defaults = %+v", c)
	}
}

// TestProbeRefreshFollowsTheMaxAgeInEffect: unset, the refresh is half the
// probe's max age, whichever sets it; set, it must stay under it, and the
// error names both variables, the max age with the value in effect.
func TestProbeRefreshFollowsTheMaxAgeInEffect(t *testing.T) {
	c, err := FromEnv(env(map[string]string{EnvProbeMaxAge: "4m"}))
	if err != nil || c.ProbeRefresh != 2*time.Minute {
		t.Fatalf("PROBE_MAX_AGE=4m: refresh %v, %v; want 2m", c.ProbeRefresh, err)
	}
	if c, err := FromEnv(env(map[string]string{EnvProbeRefresh: "29m"})); err != nil || c.ProbeRefresh != 29*time.Minute {
		t.Fatalf("PROBE_REFRESH=29m under the default max age: %v, %v", c.ProbeRefresh, err)
	}
	for _, tc := range []struct {
		vars map[string]string
		want string
	}{
		{map[string]string{EnvProbeRefresh: "30m"},
			"RUNFLEET_PROBE_REFRESH=30m0s is not under RUNFLEET_PROBE_MAX_AGE=30m0s: a quiet host's probe would go stale before it is written again"},
		{map[string]string{EnvProbeRefresh: "5m", EnvProbeMaxAge: "2m"},
			"RUNFLEET_PROBE_REFRESH=5m0s is not under RUNFLEET_PROBE_MAX_AGE=2m0s: a quiet host's probe would go stale before it is written again"},
	} {
		if _, err := FromEnv(env(tc.vars)); err == nil || err.Error() != tc.want {
			t.Errorf("%v: %v\nwant %s", tc.vars, err, tc.want)
		}
	}
}

// TestQueueTimeouts: the default wait is any duration up to the maximum
// ("0s" as unset: no wait), the maximum a positive one.
func TestQueueTimeouts(t *testing.T) {
	c, err := FromEnv(env(map[string]string{EnvQueueTimeout: "10m", EnvQueueMaxTimeout: "2h"}))
	if err != nil || c.QueueTimeout != 10*time.Minute || c.QueueMaxTimeout != 2*time.Hour {
		t.Fatalf("10m up to 2h: %v %v, %v", c.QueueTimeout, c.QueueMaxTimeout, err)
	}
	if c, err := FromEnv(env(map[string]string{EnvQueueTimeout: "0s"})); err != nil || c.QueueTimeout != 0 {
		t.Fatalf("QUEUE_TIMEOUT=0s: %v, %v; want no default wait", c.QueueTimeout, err)
	}
	if c, err := FromEnv(env(map[string]string{EnvQueueTimeout: "24h"})); err != nil || c.QueueTimeout != 24*time.Hour {
		t.Fatalf("QUEUE_TIMEOUT=24h under the default maximum: %v, %v", c.QueueTimeout, err)
	}
	for _, tc := range []struct {
		vars map[string]string
		want string
	}{
		{map[string]string{EnvQueueTimeout: "25h"},
			"RUNFLEET_QUEUE_TIMEOUT=25h0m0s is over RUNFLEET_QUEUE_MAX_TIMEOUT=24h0m0s: the default wait must be one a dispatch may ask"},
		{map[string]string{EnvQueueTimeout: "2h", EnvQueueMaxTimeout: "1h"},
			"RUNFLEET_QUEUE_TIMEOUT=2h0m0s is over RUNFLEET_QUEUE_MAX_TIMEOUT=1h0m0s: the default wait must be one a dispatch may ask"},
		{map[string]string{EnvQueueTimeout: "-1s"}, `RUNFLEET_QUEUE_TIMEOUT="-1s": want a Go duration such as 10m (0s: none)`},
		{map[string]string{EnvQueueMaxTimeout: "0s"}, `RUNFLEET_QUEUE_MAX_TIMEOUT="0s": want a positive Go duration such as 10s`},
	} {
		if _, err := FromEnv(env(tc.vars)); err == nil || err.Error() != tc.want {
			t.Errorf("%v: %v\nwant %s", tc.vars, err, tc.want)
		}
	}
}

// TestCapacityClasses: each class is checked as fleet.ParseClass reads it
// and kept in fleet.ClassOf's form, once; a bad one names the variable and
// the class.
func TestCapacityClasses(t *testing.T) {
	c, err := FromEnv(env(map[string]string{EnvCapacityClasses: "claude, codex?pool=gpu&arch=arm64 ,shell,codex?arch=arm64&pool=gpu"}))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"claude", "codex?arch=arm64&pool=gpu", "shell"}
	if !reflect.DeepEqual(c.CapacityClasses, want) {
		t.Fatalf("classes %q, want %q", c.CapacityClasses, want)
	}
	for value, want := range map[string]string{
		"claude,,shell":      `RUNFLEET_CAPACITY_CLASSES="claude,,shell": an empty class (two commas, or one at an end)`,
		"claude,":            `RUNFLEET_CAPACITY_CLASSES="claude,": an empty class (two commas, or one at an end)`,
		"?pool=gpu":          `RUNFLEET_CAPACITY_CLASSES: class "?pool=gpu" names no agent: want <agent>[?<label>=<value>&...]`,
		"claude?pool=%zz":    `RUNFLEET_CAPACITY_CLASSES: class "claude?pool=%zz": invalid URL escape "%zz"`,
		"cl%zzaude?pool=gpu": `RUNFLEET_CAPACITY_CLASSES: class "cl%zzaude?pool=gpu": invalid URL escape "%zz"`,
	} {
		if _, err := FromEnv(env(map[string]string{EnvCapacityClasses: value})); err == nil || err.Error() != want {
			t.Errorf("%q: %v\nwant %s", value, err, want)
		}
	}
}

func TestFromEnvReadsEveryName(t *testing.T) {
	c, err := FromEnv(env(map[string]string{
		EnvAdminToken: "0123456789abcdef0123", EnvStore: "bolt:/tmp/f.db", EnvDynamoDBEndpoint: "http://127.0.0.1:5000",
		EnvTableHosts: "h", EnvTableRuns: "r", EnvTableEvents: "e", EnvTableEgress: "x", EnvTableCallers: "c", EnvTableIdempotency: "i",
		EnvCredentials: "file:/etc/c.json", EnvRepoURLs: "file:/etc/repos.json", EnvRetentionDays: "7",
		EnvAddr: "127.0.0.1:9999", EnvHostTimeout: "3s", EnvProbeTimeout: "2s", EnvProbeMaxAge: "1m",
		EnvProbeConcurrency: "2", EnvLogLevel: "debug",
		EnvStreamPollInterval: "250ms", EnvStreamKeepAlive: "5s", EnvStreamMaxDuration: "10m",
		EnvStreamIdleTimeout: "90s", EnvStreamMaxPerCaller: "4",
		EnvProbeInterval: "30s", EnvSweepInterval: "1m", EnvStreamURL: "https://s.lambda-url.eu-west-1.on.aws/",
		EnvAdminTokenTTL: "15s", EnvBroker: "file:/etc/broker.json", EnvBrokerKey: "kms:alias/runfleet-broker",
		EnvProbeRefresh: "20s", EnvQueueTimeout: "10m", EnvQueueMaxTimeout: "2h",
		EnvWakeQueue:       "https://sqs.eu-west-1.amazonaws.com/123456789012/runfleet-DispatchWakes-Ab12",
		EnvCapacityClasses: "claude,shell?pool=gpu",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := Fleet{
		AdminToken: "0123456789abcdef0123", Store: "bolt:/tmp/f.db", DynamoDBEndpoint: "http://127.0.0.1:5000",
		Tables:      Tables{Hosts: "h", Runs: "r", Events: "e", Egress: "x", Callers: "c", Idempotency: "i"},
		Credentials: credentials.Spec{Kind: "file", Arg: "/etc/c.json"}, RepoURLs: "file:/etc/repos.json",
		RetentionDays: 7, Addr: "127.0.0.1:9999", HostTimeout: 3 * time.Second, ProbeTimeout: 2 * time.Second,
		ProbeMaxAge: time.Minute, ProbeConcurrency: 2, LogLevel: slog.LevelDebug,
		StreamPollInterval: 250 * time.Millisecond, StreamKeepAlive: 5 * time.Second, StreamMaxDuration: 10 * time.Minute,
		StreamIdleTimeout: 90 * time.Second, StreamMaxPerCaller: 4,
		ProbeInterval: 30 * time.Second, SweepInterval: time.Minute, StreamURL: "https://s.lambda-url.eu-west-1.on.aws/",
		AdminTokenTTL: 15 * time.Second, Broker: "file:/etc/broker.json", BrokerKey: "kms:alias/runfleet-broker",
		ProbeRefresh: 20 * time.Second, QueueTimeout: 10 * time.Minute, QueueMaxTimeout: 2 * time.Hour,
		WakeQueue:       "https://sqs.eu-west-1.amazonaws.com/123456789012/runfleet-DispatchWakes-Ab12",
		CapacityClasses: []string{"claude", "shell?pool=gpu"},
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got %+v\nwant %+v", c, want)
	}
	if kind, path, _ := ParseStore(c.Store); kind != StoreBolt || path != "/tmp/f.db" {
		t.Fatalf("store = %s %s", kind, path)
	}
	if c.RepoURLsPath() != "/etc/repos.json" {
		t.Fatalf("repo path %q", c.RepoURLsPath())
	}
}

func TestFromEnvErrorsNameTheVariable(t *testing.T) {
	for name, value := range map[string]string{
		EnvAdminToken:         "x7Qk2",
		EnvStore:              "sqlite:/x",
		EnvCredentials:        "vault:x",
		EnvRepoURLs:           "/etc/repos.json",
		EnvRetentionDays:      "-1",
		EnvHostTimeout:        "10",
		EnvProbeTimeout:       "0s",
		EnvProbeMaxAge:        "soon",
		EnvProbeConcurrency:   "2.5",
		EnvLogLevel:           "loud",
		EnvStreamPollInterval: "-1s",
		EnvStreamKeepAlive:    "often",
		EnvStreamMaxDuration:  "0",
		EnvStreamIdleTimeout:  "5",
		EnvStreamMaxPerCaller: "101",
		EnvProbeInterval:      "10",
		EnvSweepInterval:      "0s",
		EnvAdminTokenTTL:      "1",
		EnvStreamURL:          "s.lambda-url.eu-west-1.on.aws",
		EnvBroker:             "file:",
		EnvBrokerKey:          "vault:x",
		EnvProbeRefresh:       "0s",
		EnvQueueTimeout:       "soon",
		EnvQueueMaxTimeout:    "1d",
		EnvWakeQueue:          "DispatchWakes",
		EnvCapacityClasses:    ",",
	} {
		_, err := FromEnv(env(map[string]string{name: value}))
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%q: %v, want an error naming it", name, value, err)
		}
		if name == EnvAdminToken && strings.Contains(err.Error(), value) {
			t.Errorf("the admin token error shows the token: %v", err)
		}
	}
}

// TestEnumeratedVariablesRefuseOtherValues: a variable that takes one of a
// set of values refuses any other at start, naming itself and the whole
// set, with the value as given (a typo, another case, a level slog alone
// would parse).
func TestEnumeratedVariablesRefuseOtherValues(t *testing.T) {
	for _, c := range []struct{ name, value, want string }{
		{EnvLogLevel, "loud", `RUNFLEET_LOG_LEVEL: "loud" is not one of debug, info, warn, error`},
		{EnvLogLevel, "DEBUG", `RUNFLEET_LOG_LEVEL: "DEBUG" is not one of debug, info, warn, error`},
		{EnvLogLevel, "warn+2", `RUNFLEET_LOG_LEVEL: "warn+2" is not one of debug, info, warn, error`},
		{EnvLogLevel, " info", `RUNFLEET_LOG_LEVEL: " info" is not one of debug, info, warn, error`},
		{EnvStore, "sqlite:/x", `RUNFLEET_STORE: "sqlite:/x" is not one of dynamodb, bolt:<path>`},
		{EnvStore, "bolt:", `RUNFLEET_STORE: "bolt:" is not one of dynamodb, bolt:<path>`},
		{EnvStore, "DynamoDB", `RUNFLEET_STORE: "DynamoDB" is not one of dynamodb, bolt:<path>`},
		{EnvCredentials, "vault:x", `RUNFLEET_CREDENTIALS: "vault:x" is not one of file:<path>, secretsmanager:<prefix>`},
		{EnvCredentials, "file:", `RUNFLEET_CREDENTIALS: "file:" is not one of file:<path>, secretsmanager:<prefix>`},
		{EnvRepoURLs, "/etc/repos.json", `RUNFLEET_REPO_URLS: "/etc/repos.json" is not file:<path>`},
		// Not quoted: the key itself pasted in place of where it is
		// would be quoted in the error.
		{EnvBrokerKey, "vault:x", `RUNFLEET_BROKER_KEY: want kms:<key id|arn|alias> or file:<path>`},
		{EnvBrokerKey, "kms:", `RUNFLEET_BROKER_KEY: want kms:<key id|arn|alias> or file:<path>`},
		{EnvBrokerKey, "q1Zl2YyG0rW9u8e3nT5bKc7xJ4hVfA6dLsM0pQ2iRoE=", `RUNFLEET_BROKER_KEY: want kms:<key id|arn|alias> or file:<path>`},
		{EnvBroker, "file:", `RUNFLEET_BROKER: want file:<path> or a Secrets Manager secret id or ARN`},
		{EnvBroker, `{"acme/GH": {"oauth2": {"refreshTokenSecret": "rt-1"}}}`, `RUNFLEET_BROKER: want file:<path> or a Secrets Manager secret id or ARN`},
	} {
		_, err := FromEnv(env(map[string]string{c.name: c.value}))
		if err == nil || err.Error() != c.want {
			t.Errorf("%s=%q: %v\nwant %s", c.name, c.value, err, c.want)
		}
	}
	for _, level := range LogLevels {
		c, err := FromEnv(env(map[string]string{EnvLogLevel: level}))
		if err != nil || c.LogLevel.String() != strings.ToUpper(level) {
			t.Errorf("%s=%s: level %v, %v", EnvLogLevel, level, c.LogLevel, err)
		}
	}
}

func TestSwitch(t *testing.T) {
	for _, c := range []struct {
		value   string
		def     bool
		want    bool
		wantErr string
	}{
		{"", true, true, ""},
		{"", false, false, ""},
		{"on", false, true, ""},
		{"off", true, false, ""},
		{"of", true, false, `RUNFLEET_X: "of" is not one of on, off`},
		{"OFF", true, false, `RUNFLEET_X: "OFF" is not one of on, off`},
		{"0", true, false, `RUNFLEET_X: "0" is not one of on, off`},
		{"true", false, false, `RUNFLEET_X: "true" is not one of on, off`},
		{"off ", true, false, `RUNFLEET_X: "off " is not one of on, off`},
	} {
		got, err := Switch(env(map[string]string{"RUNFLEET_X": c.value}), "RUNFLEET_X", c.def)
		if gotErr := fmt.Sprint(err); c.wantErr != "" && gotErr != c.wantErr || c.wantErr == "" && err != nil || got != c.want {
			t.Errorf("RUNFLEET_X=%q (default %t): %t, %v; want %t, %s", c.value, c.def, got, err, c.want, c.wantErr)
		}
	}
}
