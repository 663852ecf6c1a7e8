package policy

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

func key(domains []string, in []string, prefix string, length int) config.KeyPolicy {
	return config.KeyPolicy{Domains: domains, In: in, Placeholder: config.PlaceholderShape{Prefix: prefix, Length: length}}
}

func one(project, name string, k config.KeyPolicy) config.Policy {
	return config.Policy{Projects: map[string]config.ProjectPolicy{project: {Keys: map[string]config.KeyPolicy{name: k}}}}
}

func TestCompile(t *testing.T) {
	p, err := Compile(one("acme", "OPENAI_API_KEY", key([]string{"API.openai.com.", "api.openai.com", "alt.example:8443"}, nil, "sk-", 0)))
	if err != nil {
		t.Fatal(err)
	}
	k, ok := p.Key(KeyRef{"acme", "OPENAI_API_KEY"})
	if !ok {
		t.Fatal("key missing")
	}
	if len(k.Domains) != 2 || k.Domains[0] != (Domain{Name: "api.openai.com", Port: 443}) || k.Domains[1] != (Domain{Name: "alt.example", Port: 8443}) {
		t.Errorf("domains = %v", k.Domains)
	}
	if k.In != InHeader {
		t.Errorf("in defaults to header, got %v", k.In)
	}
	if k.Placeholder != (Shape{"sk-", 48}) {
		t.Errorf("shape = %+v", k.Placeholder)
	}
	if !p.AllowsName("api.openai.com") || !p.AllowsName("alt.example") || p.AllowsName("openai.com") {
		t.Error("AllowsName wrong")
	}
}

func TestCompileRefusesWithAClearMessage(t *testing.T) {
	for name, tc := range map[string]struct {
		pol  config.Policy
		want string
	}{
		"wildcard":     {one("acme", "K", key([]string{"*.openai.com"}, nil, "", 0)), `policy.projects.acme.keys.K.domains[0]: "*.openai.com": a wildcard`},
		"ip":           {one("acme", "K", key([]string{"10.0.0.1"}, nil, "", 0)), `domains[0]: "10.0.0.1": an IP address`},
		"ipv6":         {one("acme", "K", key([]string{"[::1]:443"}, nil, "", 0)), `domains[0]: "[::1]:443": an IP address`},
		"single label": {one("acme", "K", key([]string{"intranet"}, nil, "", 0)), `domains[0]: "intranet": a single-label`},
		"bad port":     {one("acme", "K", key([]string{"a.example:0"}, nil, "", 0)), `invalid port "0"`},
		"no domains":   {one("acme", "K", key(nil, nil, "", 0)), `keys.K.domains: at least one`},
		"bad in":       {one("acme", "K", key([]string{"a.example"}, []string{"cookie"}, "", 0)), `in[0]: "cookie" is not one of`},
		"short":        {one("acme", "K", key([]string{"a.example"}, nil, "sk-", 10)), "placeholder.length: 10 leaves fewer than 16 random"},
		"long":         {one("acme", "K", key([]string{"a.example"}, nil, "", 300)), "placeholder.length: 300 is above 256"},
		"prefix chars": {one("acme", "K", key([]string{"a.example"}, nil, "sk/", 0)), `placeholder.prefix: "sk/"`},
		"key name":     {one("acme", "K-1", key([]string{"a.example"}, nil, "", 0)), "environment variable"},
		"project name": {one("ac/me", "K", key([]string{"a.example"}, nil, "", 0)), `policy.projects["ac/me"]: a project id`},
	} {
		_, err := Compile(tc.pol)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to contain %q", name, err, tc.want)
		}
	}
}

func TestGrant(t *testing.T) {
	p, err := Compile(config.Policy{Projects: map[string]config.ProjectPolicy{"acme": {Keys: map[string]config.KeyPolicy{
		"A": key([]string{"a.example", "b.example"}, []string{"header", "body"}, "", 0),
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		declared    []runspec.Secret
		wantDomains []Domain
		wantRefused string
	}{
		"every domain":  {[]runspec.Secret{{ProjectID: "acme", Key: "A", Domains: []string{"a.example", "b.example"}}}, []Domain{{Name: "a.example", Port: 443}, {Name: "b.example", Port: 443}}, ""},
		"narrowed":      {[]runspec.Secret{{ProjectID: "acme", Key: "A", Domains: []string{"B.example."}}}, []Domain{{Name: "b.example", Port: 443}}, ""},
		"unknown key":   {[]runspec.Secret{{ProjectID: "acme", Key: "Z", Domains: []string{"a.example"}}}, nil, "does not proxy this key"},
		"other project": {[]runspec.Secret{{ProjectID: "other", Key: "A", Domains: []string{"a.example"}}}, nil, "does not proxy this key"},
		"domain too wide": {[]runspec.Secret{{ProjectID: "acme", Key: "A", Domains: []string{"a.example", "c.example"}}}, nil,
			"it may not reach c.example (port 443); this host's policy lets it reach only a.example, b.example"},
		"other port": {[]runspec.Secret{{ProjectID: "acme", Key: "A", Domains: []string{"a.example:8443"}}}, nil,
			"it may not reach a.example:8443 (port 8443); this host's policy lets it reach only a.example, b.example"},
	} {
		declared, err := runspec.Request{Agent: "shell", Secrets: tc.declared}.Declare()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		granted, refused := p.Grant(declared)
		if tc.wantRefused != "" {
			if len(refused) != 1 || !strings.Contains(refused[0].Reason, tc.wantRefused) || len(granted) != 0 {
				t.Errorf("%s: granted %v refused %v, want refusal %q", name, granted, refused, tc.wantRefused)
			}
			continue
		}
		if len(refused) != 0 || len(granted) != 1 || len(granted[0].Domains) != len(tc.wantDomains) {
			t.Errorf("%s: granted %v refused %v", name, granted, refused)
			continue
		}
		for i, d := range tc.wantDomains {
			if granted[0].Domains[i] != d {
				t.Errorf("%s: domains %v want %v", name, granted[0].Domains, tc.wantDomains)
			}
		}
		if granted[0].In != InHeader|InBody {
			t.Errorf("%s: in = %v", name, granted[0].In)
		}
	}
	if _, err := (runspec.Request{Agent: "shell", Secrets: []runspec.Secret{{ProjectID: "acme", Key: "A", Domains: []string{"*.x.example"}}}}).Declare(); err == nil {
		t.Error("a wildcard declared domain must be refused")
	}
	// A declaration that names no domain reaches nothing: it is refused,
	// never widened to the key's every domain.
	if granted, refused := p.Grant([]runspec.Declared{{ProjectID: "acme", Key: "A"}}); len(granted) != 0 || len(refused) != 1 {
		t.Errorf("a declaration without domains: granted %v refused %v", granted, refused)
	}
}

func TestDecideSubstitution(t *testing.T) {
	ref := KeyRef{"acme", "A"}
	granted := []Granted{{Ref: ref, Domains: []Domain{{Name: "a.example", Port: 443}}, In: InHeader | InURL}}
	at := func(s string) Authority {
		a, err := ParseAuthority(s, true)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	for name, tc := range map[string]struct {
		in    SubstituteInput
		allow bool
		why   string
	}{
		"allowed header":    {SubstituteInput{"t1", at("a.example:443"), granted, Occurrence{"t1", ref, InHeader}}, true, ""},
		"allowed url":       {SubstituteInput{"t1", at("a.example:443"), granted, Occurrence{"t1", ref, InURL}}, true, ""},
		"body not allowed":  {SubstituteInput{"t1", at("a.example:443"), granted, Occurrence{"t1", ref, InBody}}, false, "found in the body"},
		"other host":        {SubstituteInput{"t1", at("b.example:443"), granted, Occurrence{"t1", ref, InHeader}}, false, "may not reach b.example"},
		"other port":        {SubstituteInput{"t1", at("a.example:8443"), granted, Occurrence{"t1", ref, InHeader}}, false, "may not reach"},
		"ip":                {SubstituteInput{"t1", at("10.1.1.1:443"), granted, Occurrence{"t1", ref, InHeader}}, false, "may not reach"},
		"other task":        {SubstituteInput{"t1", at("a.example:443"), granted, Occurrence{"t2", ref, InHeader}}, false, "another task"},
		"key withdrawn":     {SubstituteInput{"t1", at("a.example:443"), nil, Occurrence{"t1", ref, InHeader}}, false, "not granted"},
		"another key's ref": {SubstituteInput{"t1", at("a.example:443"), granted, Occurrence{"t1", KeyRef{"acme", "B"}, InHeader}}, false, "not granted"},
	} {
		got := DecideSubstitution(tc.in)
		if got.Allow != tc.allow || !strings.Contains(got.Reason, tc.why) {
			t.Errorf("%s: %+v", name, got)
		}
	}
}

func TestDecideConnectEgress(t *testing.T) {
	target, _ := ParseAuthority("elsewhere.example:443", true)
	if d := DecideConnect(ConnectInput{Target: target, Egress: EgressOpen}); d.Action != Tunnel {
		t.Errorf("open egress: %+v", d)
	}
	if d := DecideConnect(ConnectInput{Target: target, Egress: EgressStrict}); d.Action != Refuse {
		t.Errorf("strict egress: %+v", d)
	}
	if d := DecideConnect(ConnectInput{Target: target}); d.Action != Refuse {
		t.Errorf("unset egress must refuse: %+v", d)
	}
}

// Under open egress, a task holding a key that may go in a url or body
// (one whose value an upstream may store and hand back) has its other
// names intercepted to scrub their answers, and its IP literals refused;
// a task with header keys alone tunnels them as before. Strict egress and
// the names keys reach are decided as they always were. Issue 27 item 4.
func TestDecideConnectStorableKeysUnderOpenEgress(t *testing.T) {
	at := func(s string) Authority {
		a, err := ParseAuthority(s, true)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	keyIn := func(name string, in Location) Granted {
		return Granted{Ref: KeyRef{"acme", name}, Domains: []Domain{{Name: "a.example", Port: 443}}, In: in}
	}
	header := []Granted{keyIn("H", InHeader)}
	url := []Granted{keyIn("H", InHeader), keyIn("U", InHeader|InURL)}
	body := []Granted{keyIn("B", InBody)}
	for name, tc := range map[string]struct {
		target  string
		granted []Granted
		egress  string
		want    ConnectAction
		why     string
	}{
		"header only, open":           {"elsewhere.example:443", header, EgressOpen, Tunnel, "egress is open"},
		"no keys, open":               {"elsewhere.example:443", nil, EgressOpen, Tunnel, "egress is open"},
		"url key, open":               {"elsewhere.example:443", url, EgressOpen, InterceptToScrub, "may store"},
		"body key, open":              {"elsewhere.example:443", body, EgressOpen, InterceptToScrub, "its answers are scrubbed"},
		"body key, open, other port":  {"elsewhere.example:8443", body, EgressOpen, InterceptToScrub, "elsewhere.example:8443"},
		"body key, open, IPv4":        {"203.0.113.7:443", body, EgressOpen, Refuse, "an IP address cannot be intercepted; " + StorableEgressRule},
		"body key, open, IPv6":        {"[2001:db8::1]:443", body, EgressOpen, Refuse, StorableEgressRule},
		"header only, open, IP":       {"203.0.113.7:443", header, EgressOpen, Tunnel, "egress is open"},
		"body key, strict":            {"elsewhere.example:443", body, EgressStrict, Refuse, "egress is strict"},
		"body key, unset egress":      {"elsewhere.example:443", body, "", Refuse, "egress is strict"},
		"body key, its own domain":    {"a.example:443", body, EgressOpen, Intercept, "may reach a.example"},
		"header key, its own domain":  {"a.example:443", header, EgressOpen, Intercept, "may reach a.example"},
		"body key, its name, no port": {"a.example:8443", body, EgressOpen, Refuse, "names port 8443 of a.example"},
	} {
		got := DecideConnect(ConnectInput{Target: at(tc.target), Granted: tc.granted, Egress: tc.egress})
		if got.Action != tc.want || !strings.Contains(got.Reason, tc.why) {
			t.Errorf("%s: %v (%s), want %v (%s)", name, got.Action, got.Reason, tc.want, tc.why)
		}
	}
}

func TestHoldsStorable(t *testing.T) {
	for _, tc := range []struct {
		in   []Location
		want bool
	}{
		{nil, false},
		{[]Location{InHeader}, false},
		{[]Location{InHeader, InHeader}, false},
		{[]Location{InURL}, true},
		{[]Location{InBody}, true},
		{[]Location{InHeader, InHeader | InBody}, true},
		{[]Location{InHeader | InURL | InBody}, true},
	} {
		var granted []Granted
		for _, l := range tc.in {
			granted = append(granted, Granted{In: l})
		}
		if got := HoldsStorable(granted); got != tc.want {
			t.Errorf("HoldsStorable(%v) = %v", tc.in, got)
		}
	}
}

const edgeJSON = `{"dataDir": "/tmp/d", "api": {"tokenFile": "/tmp/t"},
 "policy": {"projects": {"acme": {"keys": {"K": {"domains": [%s]}}}}}}`

func writeConfig(t *testing.T, path, domains string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Replace(edgeJSON, "%s", domains, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestWatcherReloadsOnChangeAndKeepsOldOnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.json")
	writeConfig(t, path, `"a.example"`)
	var logs syncbuf.Buffer
	fake := clock.NewFake(time.Unix(1_800_000_000, 0))
	w, err := NewWatcher(WatcherConfig{Path: path, Clock: fake, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hup := make(chan os.Signal, 1)
	done := make(chan struct{})
	go func() { w.Run(ctx, hup); close(done) }()
	defer func() { cancel(); <-done }()

	// A change is picked up at the next poll.
	<-fake.WaitForTimers(1)
	writeConfig(t, path, `"b.example", "c.example"`)
	fake.Advance(2 * time.Second)
	await.Cond(t, 5*time.Second, "the poll to load b.example", func() bool { return w.Current().AllowsName("b.example") })
	if w.AllowName("a.example") {
		t.Error("a.example should be gone after the reload")
	}

	// An invalid policy keeps the one in force and says why.
	<-fake.WaitForTimers(1)
	writeConfig(t, path, `"*.example"`)
	fake.Advance(2 * time.Second)
	await.Cond(t, 5*time.Second, "the refusal to be logged", func() bool { return strings.Contains(logs.String(), "policy reload refused") })
	if !w.AllowName("b.example") {
		t.Error("the old policy must stay after a refused reload")
	}
	if !strings.Contains(logs.String(), "a wildcard is not allowed") {
		t.Errorf("the log does not say why: %s", logs.String())
	}

	// SIGHUP reloads now, without waiting for a poll: the fake clock is
	// not advanced again, so no poll runs and only SIGHUP can load it.
	writeConfig(t, path, `"d.example"`)
	hup <- syscall.SIGHUP
	await.Cond(t, 5*time.Second, "SIGHUP to load d.example", func() bool { return w.AllowName("d.example") })
}

// A new edge.json renamed into place with the same size and modification
// time (an editor's save or a config tool within one timestamp tick) is
// still a change: the poll sees another file and reloads.
func TestWatcherSeesAReplacementOfTheSameSizeAndTime(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "edge.json")
	mtime := time.Unix(1_800_000_000, 0)
	writeConfig(t, path, `"a.example"`)
	must(t, os.Chtimes(path, mtime, mtime))
	w, err := NewWatcher(WatcherConfig{Path: path, Logger: slog.New(slog.DiscardHandler)})
	must(t, err)
	next := filepath.Join(dir, "edge.json.new")
	writeConfig(t, next, `"b.example"`)
	must(t, os.Chtimes(next, mtime, mtime))
	must(t, os.Rename(next, path))
	w.pollOnce()
	if !w.AllowName("b.example") || w.AllowName("a.example") {
		t.Fatal("the replaced policy was not reloaded")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestNewWatcherRefusesABadPolicy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.json")
	writeConfig(t, path, `"intranet"`)
	_, err := NewWatcher(WatcherConfig{Path: path, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil || !strings.Contains(err.Error(), `policy.projects.acme.keys.K.domains[0]: "intranet"`) {
		t.Fatalf("err = %v", err)
	}
}
