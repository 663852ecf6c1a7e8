package runner

import (
	"net/url"
	"slices"

	"github.com/runfleet/runfleet/shared/netname"
	"github.com/runfleet/runfleet/shared/runspec"
)

// gitCredentialUser is the user name git gives with a token as its
// password: GitHub's (and GitHub Enterprise's) for installation tokens;
// other hosts that take a token as a password ignore the name.
const gitCredentialUser = "x-access-token"

// gitCredentialEnv is git's configuration, as environment variables, that
// gives an https clone URL's host the placeholder of the first key the
// run declares and is granted for that host: a credential helper scoped to
// that origin, printing x-access-token and "$KEY", which the proxy swaps
// for the key's value inside Basic auth as for any request. Edge's own
// clone of the run's repository uses it (a private repository, a GitHub
// key Fleet minted for it), and so does the task, whose origin is that
// URL: `git push` needs no credential in the URL. The helper holds the
// variable's name, never a value. Nil when no key reaches the host, the
// URL is not https or carries its own credentials, or env already sets
// GIT_CONFIG_COUNT (the run's or agent's own git configuration wins).
func gitCredentialEnv(rawURL string, declared []runspec.Declared, placeholders map[string]string, env []string) []string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "https" || u.User != nil || u.Host == "" || envValue(env, "GIT_CONFIG_COUNT") != "" {
		return nil
	}
	d, err := netname.ParseDomain(u.Host)
	if err != nil {
		return nil
	}
	for _, s := range declared {
		if _, granted := placeholders[s.Key]; !granted || !slices.Contains(s.Domains, d) {
			continue
		}
		origin := "https://" + u.Host
		helper := `!f() { test "$1" = get || exit 0; echo username=` + gitCredentialUser + `; echo "password=${` + s.Key + `}"; }; f`
		return []string{
			"GIT_CONFIG_COUNT=1",
			"GIT_CONFIG_KEY_0=credential." + origin + ".helper",
			"GIT_CONFIG_VALUE_0=" + helper,
		}
	}
	return nil
}
