package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"

	"github.com/runfleet/runfleet/shared/fleetclient"
	"github.com/runfleet/runfleet/shared/version"
)

// profileName is a profile's shape: short, printable, safe in a message.
var profileName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

func loginCmd() *command {
	return &command{
		name: "login", summary: "Save an API and a token as a profile",
		long: "The token is read from stdin, one line (there is no --token flag: a token on a command line\n" +
			"lands in shell history and ps). It is checked with GET /fleet/hosts before anything is saved;\n" +
			"a refused token saves nothing. The profile (default: \"default\") is written to\n" +
			"$XDG_CONFIG_HOME/runfleet/config.json (~/.config/runfleet/config.json), mode 0600, and\n" +
			"becomes the current one. On a terminal the token shows as it is typed: pipe it in instead.",
		examples: []string{
			"runfleet login --api http://127.0.0.1:8080 < .dev/demo-caller-token",
			"# a stream on another plain-http origin must be named, or the token is not sent there",
			"runfleet login --api http://fleet.lan:8080 --stream-url http://stream.lan:8081 < token-file",
			"# a second Fleet as its own profile, read from a password manager",
			"pass show runfleet/prod | runfleet login --with-token --api https://fleet.example.com --profile prod",
		},
		setup: func(fs *flagSet) func(*invocation) int {
			withToken := fs.Bool("with-token", "read the token from stdin without a prompt")
			stream := fs.String("stream-url", "URL", "the stream's URL when it is on another origin than the API and not https (an https API's https stream needs none)")
			return func(inv *invocation) int { return inv.login(*withToken, *stream) }
		},
	}
}

func logoutCmd() *command {
	return &command{
		name: "logout", summary: "Remove a profile and its token from the config file",
		long: "Removes the profile named by --profile (else RUNFLEET_PROFILE, else the current one). The\n" +
			"token stays valid in Fleet: an admin revokes it (DELETE /fleet/callers/{ownerId}).",
		examples: []string{"runfleet logout", "runfleet logout --profile prod"},
		setup: func(fs *flagSet) func(*invocation) int {
			return func(inv *invocation) int { return inv.logout() }
		},
	}
}

func (inv *invocation) login(withToken bool, stream string) int {
	path, err := configPath(inv.env.Getenv, inv.env.Home)
	if err != nil {
		return inv.fail(err)
	}
	cfg, err := loadConfig(path)
	if err != nil {
		return inv.fail(err)
	}
	name := firstOf(*inv.global.profile, inv.env.Getenv(EnvProfile), defaultProfile)
	if !profileName.MatchString(name) {
		return inv.usage(inv.path, usagef("profile %q: want 1-64 letters, digits and ._- starting with a letter or digit", name))
	}
	api := firstOf(*inv.global.api, inv.env.Getenv(EnvAPI), cfg.Profiles[name].API)
	if api == "" {
		return inv.usage(inv.path, usagef("--api is required: name Fleet's API, e.g. --api http://127.0.0.1:8080"))
	}
	if !withToken && inv.env.StdinTTY {
		fmt.Fprintf(inv.ui.err, "Paste the token for %s (it shows as you type; pipe it in to avoid that), then Enter: ", api)
	}
	token, err := readLine(inv.ctx, inv.env.Stdin)
	if err != nil {
		return inv.fail(err)
	}
	if token == "" {
		return inv.fail(errors.New("no token on stdin: pipe it in, e.g. runfleet login --api " + api + " < token-file"))
	}
	if prev := cfg.Profiles[name]; stream == "" && sameAPI(prev.API, api) {
		stream = prev.Stream
	}
	stream = firstOf(stream, inv.env.Getenv(EnvStream))
	client, err := fleetclient.New(fleetclient.Options{BaseURL: api, StreamURL: stream, Token: token, HTTPClient: inv.env.HTTPClient,
		Wait: inv.env.Wait, UserAgent: "runfleet-cli/" + version.Version})
	if err != nil {
		return inv.fail(errors.New(strings.TrimPrefix(err.Error(), "fleetclient: ")))
	}
	inv.client, inv.target = client, target{api: client.BaseURL(), apiSource: "--api", tokenSource: "stdin"}
	hosts, err := client.Hosts(inv.ctx)
	var apiErr *fleetclient.Error
	switch {
	case errors.As(err, &apiErr) && apiErr.Status == http.StatusUnauthorized:
		inv.ui.errorf("the token was refused by %s (%s): nothing was saved", client.BaseURL(), apiErr.Message)
		return ExitError
	case err != nil:
		if inv.intr.interrupted() {
			return inv.fail(err)
		}
		inv.ui.errorf("the token could not be checked, so nothing was saved: %s", inv.describe(err))
		return ExitError
	}
	if cfg.Profiles == nil {
		cfg.Profiles = map[string]profile{}
	}
	cfg.Profiles[name] = profile{API: client.BaseURL(), Token: token, Stream: stream}
	cfg.Current = name
	if err := saveConfig(path, cfg); err != nil {
		return inv.fail(err)
	}
	visible := fmt.Sprintf("%d hosts", len(hosts))
	if len(hosts) == 1 {
		visible = "1 host"
	}
	inv.ui.notef("Logged in to %s as profile %q (%s visible to this token); saved in %s", client.BaseURL(), name, visible, path)
	return ExitOK
}

func (inv *invocation) logout() int {
	path, err := configPath(inv.env.Getenv, inv.env.Home)
	if err != nil {
		return inv.fail(err)
	}
	cfg, err := loadConfig(path)
	if err != nil {
		return inv.fail(err)
	}
	name := firstOf(*inv.global.profile, inv.env.Getenv(EnvProfile), cfg.Current, defaultProfile)
	p, ok := cfg.Profiles[name]
	if !ok {
		return inv.fail(fmt.Errorf("no profile %q in %s: nothing to remove", name, path))
	}
	delete(cfg.Profiles, name)
	if cfg.Current == name {
		cfg.Current = ""
	}
	if err := saveConfig(path, cfg); err != nil {
		return inv.fail(err)
	}
	inv.ui.notef("Logged out: removed profile %q (%s) from %s", name, p.API, path)
	return ExitOK
}

// readLine reads one line from r, its line ending and surrounding spaces
// removed, or ends with ctx (an interrupt while waiting for input).
func readLine(ctx context.Context, r io.Reader) (string, error) {
	type result struct {
		line string
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		line, err := bufio.NewReader(r).ReadString('\n')
		if err == io.EOF {
			err = nil
		}
		ch <- result{strings.TrimSpace(line), err}
	}()
	select {
	case res := <-ch:
		if res.err != nil {
			return "", fmt.Errorf("reading the token from stdin: %w", res.err)
		}
		return res.line, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func firstOf(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}
