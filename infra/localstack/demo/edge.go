package demo

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/edge/runner"
)

// Edge is what the demo edge host's edge.json is made of.
type Edge struct {
	// DataDir is edge's data dir, private to edge. Required.
	DataDir string
	// WorkDir is runner.workDir: the tasks' directories and trust files.
	// Every directory above it must be traversable by the task's user.
	// Required.
	WorkDir string
	// TokenFile and SecretsFile are the host token and the secrets file
	// (0600). Required.
	TokenFile, SecretsFile string
	// UpstreamCAFile is where Write puts the upstream's CA, which the proxy
	// trusts. Required.
	UpstreamCAFile string
	// APIListen and ProxyListen are the host API's and the proxy's
	// addresses; empty is 127.0.0.1 on a free port.
	APIListen, ProxyListen string
	// InsecureSameUser runs tasks as edge itself: for an edge that is not
	// root and so cannot switch users (the local stack as an ordinary
	// user). Their egress is then open (runner.egress insecureOpen).
	InsecureSameUser bool
	// Upstream is the demo upstream the policy and the demo agent name.
	// Required.
	Upstream *Upstream
}

// Validate reports a missing required field.
func (e Edge) Validate() error {
	var errs []error
	for field, v := range map[string]string{"DataDir": e.DataDir, "WorkDir": e.WorkDir, "TokenFile": e.TokenFile,
		"SecretsFile": e.SecretsFile, "UpstreamCAFile": e.UpstreamCAFile} {
		if v == "" {
			errs = append(errs, errors.New("demo: Edge."+field+" is required"))
		}
	}
	if e.Upstream == nil {
		errs = append(errs, errors.New("demo: Edge.Upstream is required"))
	}
	return errors.Join(errs...)
}

// Config is edge.json for the demo: the policy grants the demo key for the
// upstream's name and port only (header substitution, placeholders of
// PlaceholderLength starting PlaceholderPrefix); the proxy pins that name
// to the upstream's IP, lets it through although it is loopback, and
// trusts the upstream's CA; the agents are the demo agent and a shell; tasks drain
// quickly on stop (a local stack stops on Ctrl-C).
func (e Edge) Config() *config.Config {
	listen := func(addr string) string {
		if addr == "" {
			return "127.0.0.1:0"
		}
		return addr
	}
	return &config.Config{
		DataDir: e.DataDir,
		API:     config.API{Listen: listen(e.APIListen), TokenFile: e.TokenFile},
		Proxy: config.Proxy{
			Listen: listen(e.ProxyListen), Egress: config.EgressOpen,
			Upstream: config.Upstream{
				Resolve:        map[string]string{UpstreamName: e.Upstream.IP()},
				AllowPrivate:   []string{"127.0.0.0/8"},
				ExtraRootsFile: e.UpstreamCAFile,
			},
		},
		Policy: config.Policy{Projects: map[string]config.ProjectPolicy{Project: {Keys: map[string]config.KeyPolicy{
			Key: {Domains: []string{e.Upstream.Domain()}, In: []string{"header"},
				Placeholder: config.PlaceholderShape{Prefix: PlaceholderPrefix, Length: PlaceholderLength}},
		}}}},
		Secrets: config.Secrets{File: e.SecretsFile},
		Agents: map[string]config.Agent{
			Agent:      {Argv: []string{"sh", "-c", AgentScript(e.Upstream), Agent, "{prompt}"}},
			ShellAgent: {Argv: []string{"sh", "-c", "{prompt}"}},
		},
		Runner: config.Runner{
			User: "nobody", InsecureSameUser: e.InsecureSameUser, WorkDir: e.WorkDir,
			Egress:       taskEgress(e.InsecureSameUser),
			Limits:       taskLimits(e.InsecureSameUser),
			MaxDuration:  config.Duration(30 * time.Minute),
			DrainTimeout: config.Duration(5 * time.Second), CancelGrace: config.Duration(2 * time.Second),
		},
	}
}

// taskEgress is runner.egress: tasks that run as edge itself cannot be
// confined, so they run with open egress, declared; others are confined.
func taskEgress(sameUser bool) string {
	if sameUser {
		return runner.TaskEgressInsecureOpen
	}
	return runner.TaskEgressConfined
}

// taskLimits is runner.limits: an edge that is not root can make no
// control group, so its tasks run bounded only by the host, declared;
// others take the defaults.
func taskLimits(sameUser bool) config.Limits {
	return config.Limits{None: sameUser}
}

// Write writes the upstream's CA to UpstreamCAFile and cfg (Config, maybe
// changed by the caller) as edge.json at path, both 0600.
func (e Edge) Write(path string, cfg *config.Config) error {
	if err := e.Validate(); err != nil {
		return err
	}
	if err := writePrivate(e.UpstreamCAFile, e.Upstream.CAPEM()); err != nil {
		return err
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return writePrivate(path, append(b, '\n'))
}
