package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// configFile is $XDG_CONFIG_HOME/runfleet/config.json (default
// ~/.config/runfleet/config.json): the profiles `runfleet login` saved and
// the current one. It holds tokens, so it is 0600 in a 0700 directory, and
// a file others may read is refused rather than used.
type configFile struct {
	Current  string             `json:"current,omitempty"`
	Profiles map[string]profile `json:"profiles"`
}

type profile struct {
	API   string `json:"api"`
	Token string `json:"token"`
	// Stream is the stream's base URL when it is on another origin than
	// API (login --stream-url): the one other origin the token goes to.
	Stream string `json:"stream,omitempty"`
}

const defaultProfile = "default"

// configPath is where the config file is: under $XDG_CONFIG_HOME when it
// is an absolute path (the XDG rule), else under home's .config.
func configPath(getenv func(string) string, home string) (string, error) {
	dir := getenv(EnvXDG)
	if !filepath.IsAbs(dir) {
		if home == "" {
			return "", errors.New("cannot place the config file: neither XDG_CONFIG_HOME nor HOME is set; set RUNFLEET_API and RUNFLEET_TOKEN instead")
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "runfleet", "config.json"), nil
}

// loadConfig reads the config file; a missing one is empty. A file that
// group or others may read or write is refused, naming the fix.
func loadConfig(path string) (configFile, error) {
	var cfg configFile
	info, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cfg, nil
	}
	if err != nil {
		return cfg, fmt.Errorf("reading the config file: %w", err)
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		return cfg, fmt.Errorf("the config file %s holds tokens but its mode is %04o, open to others: run chmod 600 %s", path, perm, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("reading the config file: %w", err)
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		// encoding/json's errors quote no value of the file.
		return cfg, fmt.Errorf("the config file %s is not runfleet's JSON (%v): fix it, or remove it and run runfleet login", path, err)
	}
	return cfg, nil
}

// saveConfig writes cfg whole: a new 0600 file in the 0700 directory,
// renamed over the old one, so a crash leaves the old file or the new.
func saveConfig(path string, cfg configFile) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	// MkdirAll leaves an existing directory as it was.
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("making %s private: %w", dir, err)
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".config-*.json") // 0600
	if err != nil {
		return fmt.Errorf("writing the config file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("writing the config file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("writing the config file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing the config file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing the config file: %w", err)
	}
	return nil
}

// target is the API a command calls and the token it sends, with where
// each came from (for errors: never the token itself).
type target struct {
	api, token             string
	stream                 string // the stream's base URL on another origin, or ""
	profile                string
	apiSource, tokenSource string
}

// settings are what resolve weighs, highest first: the flags, the
// environment, then the profile of the config file.
type settings struct {
	flagAPI, flagProfile string
	envAPI, envToken     string
	envStream            string
	envProfile           string
	// load reads the config file; called only when the flags and the
	// environment leave the API or the token unset.
	load     func() (configFile, error)
	fileName string
}

// resolve decides the target. A profile's token is sent only to the
// profile's own API: with --api or RUNFLEET_API naming another, it is
// not used (a token typed for one Fleet must not reach another).
func resolve(s settings) (target, error) {
	t := target{api: s.flagAPI, apiSource: "--api", token: s.envToken, tokenSource: EnvToken, stream: s.envStream}
	if t.api == "" && s.envAPI != "" {
		t.api, t.apiSource = s.envAPI, EnvAPI
	}
	if t.api != "" && t.token != "" {
		return t, nil
	}
	cfg, err := s.load()
	if err != nil {
		return target{}, err
	}
	name, explicit := s.flagProfile, true
	switch {
	case name != "":
	case s.envProfile != "":
		name = s.envProfile
	case cfg.Current != "":
		name, explicit = cfg.Current, false
	default:
		name, explicit = defaultProfile, false
	}
	t.profile = name
	p, ok := cfg.Profiles[name]
	if !ok && explicit {
		return target{}, fmt.Errorf("no profile %q in %s: run runfleet login --profile %s --api URL", name, s.fileName, name)
	}
	if t.api == "" && p.API != "" {
		t.api, t.apiSource = p.API, fmt.Sprintf("profile %q", name)
	}
	if t.api == "" {
		return target{}, errors.New("no Fleet API is set: set RUNFLEET_API (and RUNFLEET_TOKEN), pass --api URL, or run runfleet login --api URL")
	}
	if t.token == "" && p.Token != "" && sameAPI(p.API, t.api) {
		t.token, t.tokenSource = p.Token, fmt.Sprintf("profile %q", name)
	}
	if t.stream == "" && sameAPI(p.API, t.api) {
		t.stream = p.Stream
	}
	if t.token == "" {
		if ok && p.Token != "" {
			return target{}, fmt.Errorf("no token for %s: profile %q is for %s; set RUNFLEET_TOKEN, or run runfleet login --api %s --profile NAME", t.api, name, p.API, t.api)
		}
		return target{}, fmt.Errorf("no token for %s: set RUNFLEET_TOKEN, or run runfleet login --api %s", t.api, t.api)
	}
	return t, nil
}

func sameAPI(a, b string) bool {
	return strings.TrimRight(strings.TrimSpace(a), "/") == strings.TrimRight(strings.TrimSpace(b), "/")
}

// resolveTarget is resolve over this invocation's flags and environment.
func (inv *invocation) resolveTarget() (target, error) {
	path, pathErr := configPath(inv.env.Getenv, inv.env.Home)
	s := settings{
		envAPI: inv.env.Getenv(EnvAPI), envToken: inv.env.Getenv(EnvToken), envProfile: inv.env.Getenv(EnvProfile),
		envStream: inv.env.Getenv(EnvStream),
		fileName:  path,
		load: func() (configFile, error) {
			if pathErr != nil {
				return configFile{}, pathErr
			}
			return loadConfig(path)
		},
	}
	if inv.global.api != nil {
		s.flagAPI, s.flagProfile = *inv.global.api, *inv.global.profile
	}
	return resolve(s)
}
