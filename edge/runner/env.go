package runner

import (
	"sort"
	"strings"
)

// A task's env, built from scratch for each attempt: nothing of edge's own
// environment reaches it, and the variables the runner owns (placeholders,
// proxy, trust) win over the agent's and the run's.

// taskPath is the PATH a task starts with: the system's directories only.
const taskPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// envInput is everything a task's env is built from. Nothing of edge's own
// environment reaches a task.
type envInput struct {
	User string
	Home string
	// Tmp is the task's private temporary directory (TMPDIR).
	Tmp      string
	AgentEnv map[string]string
	RunEnv   map[string]string
	// Broker is set for a run that declares secrets.
	Broker *brokerEnv
}

type brokerEnv struct {
	Placeholders map[string]string
	ProxyURL     string
	ProxiedKeys  string
	// TrustFile is the system roots followed by the CA bundle; CABundle is
	// the CA bundle alone (Node adds it to its own roots).
	TrustFile string
	CABundle  string
}

// buildEnv returns the task's env, sorted: a minimal base, the agent's fixed
// variables, the run's env, then what the runner owns (placeholders, proxy,
// trust), which nothing before it can override.
func buildEnv(in envInput) []string {
	env := map[string]string{
		"PATH":    taskPath,
		"HOME":    in.Home,
		"TMPDIR":  in.Tmp,
		"LANG":    "C.UTF-8",
		"TERM":    "xterm-256color",
		"USER":    in.User,
		"LOGNAME": in.User,
	}
	for k, v := range in.AgentEnv {
		env[k] = v
	}
	for k, v := range in.RunEnv {
		env[k] = v
	}
	if b := in.Broker; b != nil {
		for k, v := range b.Placeholders {
			env[k] = v
		}
		env["HTTPS_PROXY"] = b.ProxyURL
		env["https_proxy"] = b.ProxyURL
		env["RUNFLEET_PROXIED_KEYS"] = b.ProxiedKeys
		for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "AWS_CA_BUNDLE"} {
			env[k] = b.TrustFile
		}
		env["NODE_EXTRA_CA_CERTS"] = b.CABundle
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// taskEnv is the attempt's env: its user and directories, its agent's and
// run's variables and, for a run that declares secrets, its placeholders,
// proxy and trust files.
func (r *Runner) taskEnv(t *task) []string {
	req := t.spec
	in := envInput{User: t.ident.User, Home: t.dirs.Home, Tmp: t.dirs.Tmp, AgentEnv: r.cfg.Agents[req.Agent].Env, RunEnv: req.Env}
	if t.ident.Switch {
		in.Tmp = "/tmp" // its own, in its sandbox
	}
	if t.needsBroker {
		t.mu.Lock()
		in.Broker = &brokerEnv{
			Placeholders: t.secrets.Placeholders,
			ProxyURL:     t.proxyURL,
			ProxiedKeys:  string(t.secrets.ProxiedKeys),
			TrustFile:    t.dirs.trustFile(),
			CABundle:     t.dirs.caBundle(),
		}
		t.mu.Unlock()
	}
	return buildEnv(in)
}

// envValue is name's value in env, "" when it has none.
func envValue(env []string, name string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}
