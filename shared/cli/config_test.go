package cli

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// TestResolvePrecedence: the flags, then the environment, then the
// config file's profile; a profile's token goes only to its own API.
func TestResolvePrecedence(t *testing.T) {
	file := configFile{Current: "work", Profiles: map[string]profile{
		"default": {API: "http://default.example", Token: "tok-default"},
		"work":    {API: "http://work.example/", Token: "tok-work"},
	}}
	for name, tc := range map[string]struct {
		s                settings
		api, token, from string
		err              string
	}{
		"the current profile":             {s: settings{}, api: "http://work.example/", token: "tok-work", from: `profile "work"`},
		"RUNFLEET_PROFILE over current":   {s: settings{envProfile: "default"}, api: "http://default.example", token: "tok-default"},
		"--profile over RUNFLEET_PROFILE": {s: settings{envProfile: "default", flagProfile: "work"}, api: "http://work.example/", token: "tok-work"},
		"RUNFLEET_TOKEN over the profile": {s: settings{envToken: "tok-env"}, api: "http://work.example/", token: "tok-env", from: EnvToken},
		"RUNFLEET_API names the profile's API": {s: settings{envAPI: "http://work.example"}, api: "http://work.example",
			token: "tok-work"},
		"--api over RUNFLEET_API": {s: settings{envAPI: "http://other.example", flagAPI: "http://work.example"},
			api: "http://work.example", token: "tok-work"},
		"env alone, the file unread": {s: settings{envAPI: "http://e.example", envToken: "tok-env", flagProfile: "missing"},
			api: "http://e.example", token: "tok-env"},
		"another API gets no profile token": {s: settings{envAPI: "http://other.example"},
			err: `no token for http://other.example: profile "work" is for http://work.example/`},
		"a missing named profile": {s: settings{flagProfile: "prod"}, err: `no profile "prod" in config.json: run runfleet login --profile prod`},
	} {
		t.Run(name, func(t *testing.T) {
			loaded := false
			tc.s.fileName = "config.json"
			tc.s.load = func() (configFile, error) { loaded = true; return file, nil }
			got, err := resolve(tc.s)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want the error %q", got, err, tc.err)
				}
				for _, tok := range []string{"tok-work", "tok-default"} {
					if strings.Contains(err.Error(), tok) {
						t.Errorf("the error names a token: %v", err)
					}
				}
				return
			}
			if err != nil || got.api != tc.api || got.token != tc.token {
				t.Fatalf("got %+v, %v; want api %s token %s", got, err, tc.api, tc.token)
			}
			if tc.from != "" && got.tokenSource != tc.from {
				t.Errorf("token from %q, want %q", got.tokenSource, tc.from)
			}
			if name == "env alone, the file unread" && loaded {
				t.Error("the config file was read though the environment set both")
			}
		})
	}
	if _, err := resolve(settings{load: func() (configFile, error) { return configFile{}, nil }}); err == nil ||
		!strings.Contains(err.Error(), "set RUNFLEET_API") || !strings.Contains(err.Error(), "runfleet login") {
		t.Errorf("nothing configured: %v; want what to set", err)
	}
	boom := errors.New("boom")
	if _, err := resolve(settings{load: func() (configFile, error) { return configFile{}, boom }}); !errors.Is(err, boom) {
		t.Errorf("a config file that cannot be read: %v", err)
	}
}

// TestLoginSavesOnlyAnAcceptedToken: a refused token saves nothing and
// says so; an accepted one is saved as the current profile in a 0600 file
// in a 0700 directory, and later commands use it; a file others may read
// is refused, naming chmod 600.
func TestLoginSavesOnlyAnAcceptedToken(t *testing.T) {
	f := newFleet(t)
	f.addHost("h1", fakehost.Config{})
	alice := f.mint("alice")
	c := f.newCLI(nil)
	path := filepath.Join(c.home, ".config", "runfleet", "config.json")

	f.secret("rft_not-a-token-of-this-fleet")
	r := c.start("rft_not-a-token-of-this-fleet\n", "login", "--api", f.srv.URL).wait(t).want(t, ExitError)
	if !strings.Contains(r.stderr.String(), "the token was refused") || !strings.Contains(r.stderr.String(), "nothing was saved") {
		t.Errorf("stderr %s", r.stderr)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("a refused token left a config file (%v)", err)
	}

	c.start(alice+"\n", "login", "--with-token", "--api", f.srv.URL+"/").wait(t).want(t, 0)
	for p, want := range map[string]os.FileMode{path: 0o600, filepath.Dir(path): 0o700} {
		if info, err := os.Stat(p); err != nil || info.Mode().Perm() != want {
			t.Errorf("%s: %v, %v; want mode %04o", p, info.Mode(), err, want)
		}
	}
	var cfg configFile
	b, _ := os.ReadFile(path)
	if err := json.Unmarshal(b, &cfg); err != nil || cfg.Current != "default" || cfg.Profiles["default"].Token != alice || cfg.Profiles["default"].API != f.srv.URL {
		t.Errorf("config %s (%v)", b, err)
	}
	r = c.run(t, "hosts", "list").want(t, 0)
	if !strings.Contains(r.stdout.String(), "h1") {
		t.Errorf("hosts list with the saved profile: %s", r.stdout)
	}

	// A second profile becomes current; the first stays.
	bob := f.mint("bob")
	c.start(bob+"\n", "login", "--api", f.srv.URL, "--profile", "bob").wait(t).want(t, 0)
	b, _ = os.ReadFile(path)
	json.Unmarshal(b, &cfg)
	if cfg.Current != "bob" || cfg.Profiles["default"].Token != alice || cfg.Profiles["bob"].Token != bob {
		t.Errorf("after a second login: current %q, profiles %d", cfg.Current, len(cfg.Profiles))
	}
	// RUNFLEET_TOKEN wins over the profile: a bad one is refused, naming it.
	c.env[EnvToken] = "rft_not-a-token-of-this-fleet"
	r = c.run(t, "runs", "list").want(t, ExitError)
	if !strings.Contains(r.stderr.String(), "the API refused the token from RUNFLEET_TOKEN") {
		t.Errorf("stderr %s", r.stderr)
	}
	delete(c.env, EnvToken)

	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	r = c.run(t, "runs", "list").want(t, ExitError)
	if !strings.Contains(r.stderr.String(), "chmod 600 "+path) {
		t.Errorf("a 0644 config file: %s", r.stderr)
	}
	os.Chmod(path, 0o600)

	c.run(t, "logout", "--profile", "bob").want(t, 0)
	b, _ = os.ReadFile(path)
	cfg = configFile{}
	json.Unmarshal(b, &cfg)
	if _, ok := cfg.Profiles["bob"]; ok || cfg.Current != "" || cfg.Profiles["default"].Token != alice {
		t.Errorf("after logout: %+v", cfg.Current)
	}
	if info, _ := os.Stat(path); info.Mode().Perm() != 0o600 {
		t.Errorf("logout left mode %v", info.Mode())
	}
}

// TestXDGConfigHome: $XDG_CONFIG_HOME, when absolute, holds the file.
func TestXDGConfigHome(t *testing.T) {
	f := newFleet(t)
	alice := f.mint("alice")
	c := f.newCLI(nil)
	xdg := t.TempDir()
	c.env[EnvXDG] = xdg
	c.start(alice+"\n", "login", "--api", f.srv.URL).wait(t).want(t, 0)
	if _, err := os.Stat(filepath.Join(xdg, "runfleet", "config.json")); err != nil {
		t.Errorf("the file is not under XDG_CONFIG_HOME: %v", err)
	}
}
