package runspec

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/netname"
)

func secret(key string, domains ...string) Secret {
	return Secret{ProjectID: "acme", Key: key, Domains: domains}
}

// Every rule of the run request, each naming the field at fault. The same
// rows run against Fleet's dispatch and edge's host API in
// tests/runrequest_test.go.
func TestValidateNamesTheField(t *testing.T) {
	past := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for name, tc := range map[string]struct {
		req   Request
		field string // "" when valid
		says  string
	}{
		"minimal":               {Request{Agent: "shell"}, "", ""},
		"everything":            {Request{Deadline: &past, Agent: "shell", Prompt: "p", Argv: []string{"-x"}, Repository: "acme/app", CloneURL: "https://git.example/app.git", Env: map[string]string{"A": "1"}, Secrets: []Secret{secret("K", "api.example.com", "alt.example:8443")}}, "", ""},
		"repository and path":   {Request{Agent: "shell", Repository: "acme/app", LocalPath: "/srv/app"}, "", ""},
		"no agent":              {Request{}, "agent", "agent is required"},
		"agent shape":           {Request{Agent: "a b"}, "agent", `agent "a b": want 1-64`},
		"empty argv":            {Request{Agent: "shell", Argv: []string{}}, "argv", "argv must not be empty"},
		"argv NUL":              {Request{Agent: "shell", Argv: []string{"a", "b\x00"}}, "argv[1]", "argv[1] contains a NUL byte"},
		"argv too many":         {Request{Agent: "shell", Argv: make([]string, MaxArgv+1)}, "argv", "argv: 257 entries"},
		"prompt NUL":            {Request{Agent: "shell", Prompt: "a\x00"}, "prompt", "prompt contains a NUL byte"},
		"prompt too long":       {Request{Agent: "shell", Prompt: strings.Repeat("x", MaxPromptBytes+1)}, "prompt", "prompt: 262145 bytes"},
		"repository option":     {Request{Agent: "shell", Repository: "--upload-pack=x"}, "repository", "must not begin with '-'"},
		"cloneUrl option":       {Request{Agent: "shell", CloneURL: "-u"}, "cloneUrl", "must not begin with '-'"},
		"repository newline":    {Request{Agent: "shell", Repository: "a\nb"}, "repository", "repository is not"},
		"relative localPath":    {Request{Agent: "shell", LocalPath: "src"}, "localPath", "want an absolute path"},
		"cloneUrl and path":     {Request{Agent: "shell", CloneURL: "https://git.example/a.git", LocalPath: "/srv/a"}, "localPath", "not both"},
		"no projectId":          {Request{Agent: "shell", Secrets: []Secret{{Key: "K", Domains: []string{"a.example"}}}}, "secrets[0].projectId", "secrets[0].projectId is required"},
		"projectId shape":       {Request{Agent: "shell", Secrets: []Secret{{ProjectID: "a/b", Key: "K", Domains: []string{"a.example"}}}}, "secrets[0].projectId", `secrets[0].projectId "a/b"`},
		"no key":                {Request{Agent: "shell", Secrets: []Secret{{ProjectID: "acme", Domains: []string{"a.example"}}}}, "secrets[0].key", "secrets[0].key is required"},
		"no domains":            {Request{Agent: "shell", Secrets: []Secret{secret("K")}}, "secrets[0].domains", "at least one domain"},
		"key shape":             {Request{Agent: "shell", Secrets: []Secret{secret("1K", "a.example")}}, "secrets[0].key", "environment variable name"},
		"key too long":          {Request{Agent: "shell", Secrets: []Secret{secret("K"+strings.Repeat("x", MaxKeyLength), "a.example")}}, "secrets[0].key", "at most 128"},
		"key reserved":          {Request{Agent: "shell", Secrets: []Secret{secret("https_proxy", "a.example")}}, "secrets[0].key", "names a variable the host sets"},
		"key runfleet":          {Request{Agent: "shell", Secrets: []Secret{secret("RUNFLEET_X", "a.example")}}, "secrets[0].key", "names a variable the host sets"},
		"key twice":             {Request{Agent: "shell", Secrets: []Secret{secret("K", "a.example"), secret("K", "b.example")}}, "secrets[1].key", "declared twice"},
		"key twice in case":     {Request{Agent: "shell", Secrets: []Secret{secret("Key", "a.example"), secret("KEY", "b.example")}}, "secrets[1].key", "declared twice"},
		"wildcard domain":       {Request{Agent: "shell", Secrets: []Secret{secret("K", "a.example", "*.b.example")}}, "secrets[0].domains[1]", "wildcard"},
		"IP domain":             {Request{Agent: "shell", Secrets: []Secret{secret("K", "10.0.0.1")}}, "secrets[0].domains[0]", "IP address"},
		"bad port":              {Request{Agent: "shell", Secrets: []Secret{secret("K", "a.example:0443")}}, "secrets[0].domains[0]", "invalid port"},
		"env name":              {Request{Agent: "shell", Env: map[string]string{"1X": "y"}}, "env", "env name"},
		"env proxy":             {Request{Agent: "shell", Env: map[string]string{"HTTPS_PROXY": "x"}}, "env.HTTPS_PROXY", "proxy and trust"},
		"env proxy lower":       {Request{Agent: "shell", Env: map[string]string{"all_proxy": "x"}}, "env.all_proxy", "proxy and trust"},
		"env git no verify":     {Request{Agent: "shell", Env: map[string]string{"GIT_SSL_NO_VERIFY": "1"}}, "env.GIT_SSL_NO_VERIFY", "proxy and trust"},
		"env node reject":       {Request{Agent: "shell", Env: map[string]string{"NODE_TLS_REJECT_UNAUTHORIZED": "0"}}, "env.NODE_TLS_REJECT_UNAUTHORIZED", "proxy and trust"},
		"env runfleet lower":    {Request{Agent: "shell", Env: map[string]string{"runfleet_x": "1"}}, "env.runfleet_x", "RUNFLEET_*"},
		"env names a key":       {Request{Agent: "shell", Env: map[string]string{"k": "x"}, Secrets: []Secret{secret("K", "a.example")}}, "env.k", "names a key declared"},
		"env NUL":               {Request{Agent: "shell", Env: map[string]string{"X": "a\x00"}}, "env.X", "NUL"},
		"env first name sorted": {Request{Agent: "shell", Env: map[string]string{"Z_PROXY_OK": "1", "HTTPS_PROXY": "x", "NO_PROXY": "*"}}, "env.HTTPS_PROXY", "env HTTPS_PROXY"},
		"encodes too large":     {Request{Agent: "shell", Prompt: strings.Repeat("<", 200<<10)}, "request", "encode to"},
	} {
		err := tc.req.Validate()
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v, want valid", name, err)
			}
			continue
		}
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Error(), tc.says) {
			t.Errorf("%s: %v (%+v), want field %s saying %q", name, err, fe, tc.field, tc.says)
		}
		if fe != nil && !strings.HasPrefix(fe.Error(), strings.SplitN(tc.field, ".", 2)[0]) && tc.field != "request" {
			t.Errorf("%s: %q does not begin with the field it names", name, fe.Error())
		}
	}
}

// Declare reads each declared domain once, canonical, duplicates dropped,
// in the order declared.
func TestDeclareCanonicalises(t *testing.T) {
	got, err := Request{Agent: "shell", Secrets: []Secret{
		secret("A", "API.Example.COM.", "api.example.com", "bücher.example:8443"),
		{ProjectID: "other", Key: "B", Domains: []string{"b.example"}},
	}}.Declare()
	if err != nil {
		t.Fatal(err)
	}
	want := []Declared{
		{ProjectID: "acme", Key: "A", Domains: []netname.Domain{{Name: "api.example.com", Port: 443}, {Name: "xn--bcher-kva.example", Port: 8443}}},
		{ProjectID: "other", Key: "B", Domains: []netname.Domain{{Name: "b.example", Port: 443}}},
	}
	if len(got) != len(want) {
		t.Fatalf("declared %+v", got)
	}
	for i := range want {
		if got[i].ProjectID != want[i].ProjectID || got[i].Key != want[i].Key || len(got[i].Domains) != len(want[i].Domains) {
			t.Fatalf("declared %+v, want %+v", got, want)
		}
		for j := range want[i].Domains {
			if got[i].Domains[j] != want[i].Domains[j] {
				t.Fatalf("declared %+v, want %+v", got, want)
			}
		}
	}
}

func TestRefuseEmpty(t *testing.T) {
	for body, field := range map[string]string{
		`{"agent":"shell","prompt":""}`:                "prompt",
		`{"agent":"shell","repository":""}`:            "repository",
		`{"agent":"shell","cloneUrl":"","x":1}`:        "cloneUrl",
		`{"agent":"shell","localPath":""}`:             "localPath",
		`{"agent":"shell","prompt":"p"}`:               "",
		`{"agent":"shell","prompt":null}`:              "",
		`not json`:                                     "",
		`{"agent":"shell","env":{"prompt":""}}`:        "",
		`{"agent":"shell","localPath":"/a","x":""}`:    "",
		`{"agent":"shell","repository":"\u0000"}`:      "",
		`{"agent":"shell","secrets":[{"key":""}]}`:     "",
		`{"agent":"shell","prompt":"","localPath":""}`: "prompt",
	} {
		err := RefuseEmpty([]byte(body))
		var fe *FieldError
		switch {
		case field == "" && err != nil:
			t.Errorf("%s: %v, want nil", body, err)
		case field != "" && (!errors.As(err, &fe) || fe.Field != field || !strings.Contains(err.Error(), "omit it instead")):
			t.Errorf("%s: %v, want a refusal of %s", body, err, field)
		}
	}
}

func TestReserved(t *testing.T) {
	for _, name := range []string{"HTTPS_PROXY", "https_proxy", "Https_Proxy", "SSL_CERT_DIR", "GIT_SSL_CAPATH", "NODE_EXTRA_CA_CERTS", "RUNFLEET_PROXIED_KEYS", "runfleet_anything"} {
		if !Reserved(name) {
			t.Errorf("%s is not reserved", name)
		}
	}
	for _, name := range []string{"HOME", "PATH", "OPENAI_API_KEY", "PROXY", "RUNFLEET"} {
		if Reserved(name) {
			t.Errorf("%s is reserved", name)
		}
	}
}
