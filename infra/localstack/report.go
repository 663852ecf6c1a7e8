package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/runfleet/runfleet/infra/localstack/demo"
	"github.com/runfleet/runfleet/shared/config"
)

// report is what the stack says once it is ready, made once and told two
// ways that cannot differ: the "ready" record of its JSON log, and the
// banner a person at a terminal reads. Every command in it works pasted as
// it is in any directory, and still after a restart: every address is fixed
// (or set), every path absolute, and the tokens are read from the data
// dir's files (a token is never written to the log).
type report struct {
	Fleet       string // Fleet's base URL
	Store       string
	Credentials string // kind:arg
	// AdminTokenFile keeps the admin token; "" when RUNFLEET_ADMIN_TOKEN
	// gives it.
	AdminTokenFile string
	// adminToken is shown on the banner alone, never logged.
	adminToken string
	// cliMissing: no runfleet beside the stack's binary, so the commands
	// name the one on the PATH (runfleetCommand).
	cliMissing             bool
	ProbeEvery, SweepEvery time.Duration
	Edge                   *edgeReport // nil with RUNFLEET_EDGE=off
	// SecondEdge is the host the stack writes ready for `edge serve`; nil
	// without the local edge or with RUNFLEET_CREDENTIALS of the user's.
	SecondEdge *secondEdgeReport
	Try        []string // runfleet commands with the admin token: the hosts, the runs, a run's output
}

// secondEdgeReport is edge-1: where its edge.json is, the address it
// serves on and the credentialRef to register it with.
type secondEdgeReport struct {
	ID, Config, API, CredentialRef string
}

// edgeReport is the local edge and its demo.
type edgeReport struct {
	API          string // the host API's base URL
	Proxy        string // the secrets proxy's address; "" when it is down
	Probe        string // Fleet's first probe's status
	SecretsProxy bool   // as that probe found it
	Agents       []string
	DataDir      string
	Config       string // edge.json
	TaskDirs     string
	// SameUser: tasks run as the stack's own user (runner.insecureSameUser).
	SameUser bool
	// The demo: the upstream's URL and address, its CA, the secrets file,
	// the demo caller's token file.
	Upstream, UpstreamAddr, UpstreamCA, SecretsFile, CallerTokenFile string
	// The demo caller's runfleet commands: DemoRun dispatches a run of the
	// demo agent using the secret and follows its output to its end;
	// Dispatch dispatches the same run alone, Stream follows a run.
	Dispatch, Stream, DemoRun string
}

// report is what the stack says of the local edge, its commands against
// Fleet at base run by the CLI cli (runfleetCommand).
func (e *localEdge) report(base, cli string) *edgeReport {
	caller := cliEnv(base, `"$(cat `+shellQuote(e.files.caller)+`)"`) + cli
	demoRun := " --agent " + demo.Agent + " --secret " + demo.SecretsRef + "=" + e.upstream.Domain() + " -- hello"
	return &edgeReport{
		API: e.baseURL, Proxy: e.host.ProxyAddr(), Probe: e.probe.Status, SecretsProxy: e.probe.Features.SecretsProxy,
		Agents: e.probe.Agents, DataDir: e.files.dataDir, Config: e.files.config, TaskDirs: e.workDir, SameUser: e.sameUser,
		Upstream: e.upstream.URL(), UpstreamAddr: e.upstream.Addr(), UpstreamCA: e.files.upstreamCA,
		SecretsFile: e.files.secrets, CallerTokenFile: e.files.caller,
		DemoRun:  caller + " run" + demoRun,
		Dispatch: caller + " run --detach" + demoRun,
		Stream:   caller + " runs follow <fleetRunId>",
	}
}

// cliEnv is the environment a runfleet command line starts with: Fleet's
// base URL and a token as the shell expands ref (a token's file read at
// the moment, never the token itself: the ready record is a log line).
func cliEnv(base, ref string) string {
	return "RUNFLEET_API=" + base + " RUNFLEET_TOKEN=" + ref + " "
}

// tasksRunAs is the tasks' user as the log says it.
func (e *edgeReport) tasksRunAs() string {
	if e.SameUser {
		return "uid " + strconv.Itoa(os.Getuid())
	}
	return "nobody"
}

// tryCommands are the commands that read Fleet with the admin token, run
// by the CLI cli: the hosts, the runs, a run's output.
func tryCommands(base, adminTokenFile, cli string) []string {
	ref := `"$` + config.EnvAdminToken + `"`
	if adminTokenFile != "" {
		ref = `"$(cat ` + shellQuote(adminTokenFile) + `)"`
	}
	admin := cliEnv(base, ref) + cli
	return []string{admin + " hosts list", admin + " runs list", admin + " runs follow <fleetRunId>"}
}

// log writes the "ready" record: the banner's facts and commands as fields
// (the README's local stack section names them), without the admin token.
func (r report) log(log *slog.Logger) {
	attrs := []any{"fleet", r.Fleet, "store", r.Store, "credentials", r.Credentials}
	if r.AdminTokenFile != "" {
		attrs = append(attrs, "adminTokenFile", r.AdminTokenFile)
	}
	attrs = append(attrs, "probeEvery", r.ProbeEvery.String(), "sweepEvery", r.SweepEvery.String())
	if e := r.Edge; e != nil {
		attrs = append(attrs,
			slog.Group("edge", "id", localEdgeID, "api", e.API, "proxy", e.Proxy, "probe", e.Probe, "secretsProxy", e.SecretsProxy,
				"agents", e.Agents, "dataDir", e.DataDir, "config", e.Config, "taskDirs", e.TaskDirs, "tasksRunAs", e.tasksRunAs()),
			slog.Group("demo", "upstream", e.Upstream, "upstreamAddr", e.UpstreamAddr, "upstreamCA", e.UpstreamCA,
				"secret", demo.SecretsRef, "secretsFile", e.SecretsFile, "caller", demoOwner, "callerTokenFile", e.CallerTokenFile,
				"dispatch", e.Dispatch, "stream", e.Stream, "demoRun", e.DemoRun))
	}
	if e := r.SecondEdge; e != nil {
		attrs = append(attrs, slog.Group("secondEdge", "id", e.ID, "config", e.Config, "api", e.API, "credentialRef", e.CredentialRef))
	}
	attrs = append(attrs, "try", r.Try)
	log.Info("ready", attrs...)
}

// print writes the banner: the same report, for a person.
func (r report) print(w io.Writer) {
	token := "(from " + config.EnvAdminToken + ")"
	if r.AdminTokenFile != "" {
		token = r.adminToken + " (kept in " + r.AdminTokenFile + ")"
	}
	fmt.Fprintf(w, "runfleet local stack listening on %s\n", r.Fleet)
	fmt.Fprintf(w, "  store:       %s\n", r.Store)
	fmt.Fprintf(w, "  credentials: %s (host credentialRef -> secret)\n", r.Credentials)
	fmt.Fprintf(w, "  admin token: %s\n", token)
	fmt.Fprintf(w, "  probe every %s, sweep every %s; the log, JSON lines, is on stdout\n", r.ProbeEvery, r.SweepEvery)
	if e := r.Edge; e != nil {
		proxy := e.Proxy
		if proxy == "" {
			proxy = "down (" + killSwitchEnv + "=off)"
		}
		fmt.Fprintf(w, "edge host %s: API %s, secrets proxy %s, probe %s (secretsProxy %t, agents %s)\n",
			localEdgeID, e.API, proxy, e.Probe, e.SecretsProxy, strings.Join(e.Agents, ", "))
		fmt.Fprintf(w, "  data dir:    %s (edge.json: %s)\n", e.DataDir, e.Config)
		fmt.Fprintf(w, "  tasks' dirs: %s\n", e.TaskDirs)
		if e.SameUser {
			fmt.Fprintf(w, "  tasks run as you (uid %d): runner.insecureSameUser is set because this user cannot switch users; for this local stack only, never on a real host\n", os.Getuid())
		} else {
			fmt.Fprintln(w, "  tasks run as nobody")
		}
		fmt.Fprintf(w, "demo upstream %s (%s, %s; its own CA in %s, trusted by the proxy)\n", e.Upstream, e.UpstreamAddr, EnvDemoUpstreamAddr, e.UpstreamCA)
		fmt.Fprintf(w, "  answers {\"authorized\": true} only to the real value of the secret %s, which is in %s; tasks get a placeholder\n", demo.SecretsRef, e.SecretsFile)
		fmt.Fprintf(w, "  caller %q (hosts: %s; projects: %s), token kept in %s\n", demoOwner, localEdgeID, demo.Project, e.CallerTokenFile)
		fmt.Fprintln(w, "run the demo agent using the secret, its output followed to its end (exits 0 once the run succeeded):")
		fmt.Fprintf(w, "  %s\n", e.DemoRun)
		fmt.Fprintln(w, "or dispatch it alone, then follow it (its fleetRunId is in the first one's answer):")
		fmt.Fprintf(w, "  %s\n  %s\n", e.Dispatch, e.Stream)
	}
	if e := r.SecondEdge; e != nil {
		fmt.Fprintf(w, "another host, %s, to register yourself (README: The local stack): edge serve --config %s (API %s, credentialRef %s)\n",
			e.ID, shellQuote(e.Config), e.API, e.CredentialRef)
	}
	if r.cliMissing {
		fmt.Fprintf(w, "(runfleet is not beside this program: the commands run the one on your PATH; make build-cli puts it in build/)\n")
	}
	fmt.Fprintln(w, "try:")
	for _, c := range r.Try {
		fmt.Fprintf(w, "  %s\n", c)
	}
	fmt.Fprintln(w, "ready")
}
