package runner

import (
	"errors"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/shared/hostproto"
)

func TestDecide(t *testing.T) {
	ready := Facts{MaxConcurrent: 2}
	broker := Facts{MaxConcurrent: 2, NeedsBroker: true}
	prepared := broker
	prepared.Prepared = true
	with := func(f Facts, change func(*Facts)) Facts {
		change(&f)
		return f
	}
	tests := []struct {
		name    string
		facts   Facts
		verdict Verdict
		reason  string
		detail  string
	}{
		{"nothing known refuses (deny by default)", Facts{}, Refuse, hostproto.ReasonHostBusy, ""},
		{"a run without secrets is admitted", ready, Admit, "", ""},
		{"a cancel refuses first", with(prepared, func(f *Facts) { f.Canceled = true; f.Draining = true }), Refuse, hostproto.ReasonCanceled, ""},
		{"a draining host refuses", with(ready, func(f *Facts) { f.Draining = true }), Refuse, hostproto.ReasonHostUnavailable, "draining"},
		{"no usable identity refuses", with(ready, func(f *Facts) { f.Identity = errors.New("cannot switch users") }), Refuse, hostproto.ReasonHostUnavailable, "cannot switch users"},
		{"limits that cannot be enforced refuse", with(prepared, func(f *Facts) { f.Limits = errors.New("the host cannot enforce runner.limits") }), Refuse, hostproto.ReasonHostUnavailable, "cannot enforce runner.limits"},
		{"a data dir under its reserve refuses, with both sizes", with(ready, func(f *Facts) { f.FreeBytes = 3<<20 + 1<<19; f.MinFreeBytes = 512 << 20 }), Refuse, hostproto.ReasonHostStorageLow, "has 3.5 MiB free, under its reserve of 512.0 MiB (runner.minFreeBytes)"},
		{"storage refuses before a busy host", with(ready, func(f *Facts) { f.FreeBytes = 1; f.MinFreeBytes = 2; f.Active = 2 }), Refuse, hostproto.ReasonHostStorageLow, ""},
		{"a retry's check refuses on storage too", with(prepared, func(f *Facts) { f.HoldsSlot = true; f.FreeBytes = 0; f.MinFreeBytes = 1 << 30 }), Refuse, hostproto.ReasonHostStorageLow, "0 B free"},
		{"exactly the reserve is admitted", with(ready, func(f *Facts) { f.FreeBytes = 1 << 30; f.MinFreeBytes = 1 << 30 }), Admit, "", ""},
		{"free space that cannot be read refuses", with(ready, func(f *Facts) {
			f.FreeBytes = 1 << 40
			f.MinFreeBytes = 1
			f.Storage = errors.New("statfs: input/output error")
		}), Refuse, hostproto.ReasonHostStorageLow, "input/output error"},
		{"a full host refuses", with(ready, func(f *Facts) { f.Active = 2 }), Refuse, hostproto.ReasonHostBusy, ""},
		{"a held slot is not counted again", with(ready, func(f *Facts) { f.Active = 2; f.HoldsSlot = true }), Admit, "", ""},
		{"a proxy that is down refuses a run with secrets", with(broker, func(f *Facts) { f.Proxy = errors.New("killed") }), Refuse, hostproto.ReasonBrokerNotReady, "secrets proxy: killed"},
		{"a proxy that is down does not matter without secrets", with(ready, func(f *Facts) { f.Proxy = errors.New("killed") }), Admit, "", ""},
		{"a lapsed CA refuses", with(broker, func(f *Facts) { f.CA = errors.New("expired") }), Refuse, hostproto.ReasonBrokerNotReady, "proxy CA: expired"},
		{"an ungranted key refuses, named", with(broker, func(f *Facts) { f.Ungranted = "acme/OTHER_KEY"; f.UngrantedReason = "not in the host policy" }), Refuse, hostproto.ReasonKeyNotGranted, "acme/OTHER_KEY"},
		{"values from Fleet that disagree with the policy refuse, named", with(broker, func(f *Facts) {
			f.Credentials = "the host's policy takes acme/API from its own sources, not from Fleet"
		}), Refuse, hostproto.ReasonKeyNotGranted, "the host's policy takes acme/API from its own sources, not from Fleet"},
		{"an ungranted key is named before values from Fleet", with(broker, func(f *Facts) { f.Ungranted = "acme/OTHER_KEY"; f.Credentials = "acme/GH" }), Refuse, hostproto.ReasonKeyNotGranted, "does not grant acme/OTHER_KEY"},
		{"a granted run is prepared before it is admitted", broker, Prepare, "", ""},
		{"a failed preparation refuses", with(prepared, func(f *Facts) { f.Preparation = errors.New("trust file not written") }), Refuse, hostproto.ReasonBrokerNotReady, "trust file not written"},
		{"a prepared run is admitted", prepared, Admit, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(tt.facts)
			if d.Verdict != tt.verdict || d.Reason != tt.reason || !strings.Contains(d.Detail, tt.detail) {
				t.Fatalf("Decide = %v %q %q; want %v %q containing %q", d.Verdict, d.Reason, d.Detail, tt.verdict, tt.reason, tt.detail)
			}
			if (d.Refusal() != nil) != (tt.verdict == Refuse) {
				t.Fatalf("Refusal() = %v for verdict %v", d.Refusal(), d.Verdict)
			}
		})
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 4 << 20: "4.0 MiB", 1 << 30: "1.0 GiB", 5 << 40: "5.0 TiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestBuildArgvKeepsThePromptOneArgument(t *testing.T) {
	prompt := `echo "hi"; rm -rf / $(whoami) 'x'`
	got := buildArgv([]string{"sh", "-c", "{prompt}"}, prompt, []string{"extra arg"})
	if len(got) != 4 || got[2] != prompt || got[3] != "extra arg" {
		t.Fatalf("argv = %q", got)
	}
	got = buildArgv([]string{"agent", "--task={prompt}"}, "a b", nil)
	if len(got) != 2 || got[1] != "--task=a b" {
		t.Fatalf("argv = %q", got)
	}
}

func TestBuildEnvIsFromScratchAndRunnerOwnedVariablesWin(t *testing.T) {
	t.Setenv("EDGE_PRIVATE", "leak")
	env := buildEnv(envInput{
		User: "nobody", Home: "/w/home",
		AgentEnv: map[string]string{"AGENT_MODE": "x", "LANG": "en_US.UTF-8"},
		RunEnv:   map[string]string{"FOO": "bar", "OPENAI_API_KEY": "real-value"},
		Broker: &brokerEnv{
			Placeholders: map[string]string{"OPENAI_API_KEY": "sk-placeholder"},
			ProxyURL:     "http://run-1:pw@127.0.0.1:7071", ProxiedKeys: `{"OPENAI_API_KEY":["api.openai.com"]}`,
			TrustFile: "/w/trust/trust.pem", CABundle: "/w/trust/ca-bundle.pem",
		},
	})
	want := map[string]string{
		"PATH": taskPath, "HOME": "/w/home", "LANG": "en_US.UTF-8", "FOO": "bar", "AGENT_MODE": "x",
		"OPENAI_API_KEY": "sk-placeholder", "HTTPS_PROXY": "http://run-1:pw@127.0.0.1:7071", "https_proxy": "http://run-1:pw@127.0.0.1:7071",
		"RUNFLEET_PROXIED_KEYS": `{"OPENAI_API_KEY":["api.openai.com"]}`,
		"SSL_CERT_FILE":         "/w/trust/trust.pem", "REQUESTS_CA_BUNDLE": "/w/trust/trust.pem", "CURL_CA_BUNDLE": "/w/trust/trust.pem",
		"GIT_SSL_CAINFO": "/w/trust/trust.pem", "AWS_CA_BUNDLE": "/w/trust/trust.pem", "NODE_EXTRA_CA_CERTS": "/w/trust/ca-bundle.pem",
	}
	got := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = v
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if _, ok := got["EDGE_PRIVATE"]; ok {
		t.Error("edge's own environment reached the task")
	}
}

func TestInputText(t *testing.T) {
	tests := map[string]string{
		`"hello"`:          "hello",
		`{"b": 1, "a": 2}`: `{"b":1,"a":2}`,
		`42`:               "42",
		`null`:             "null",
		`["x"]`:            `["x"]`,
	}
	for in, want := range tests {
		got, err := inputText([]byte(in))
		if err != nil || got != want {
			t.Errorf("inputText(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := inputText([]byte(`{bad`)); err == nil {
		t.Error("invalid JSON accepted")
	}
}
