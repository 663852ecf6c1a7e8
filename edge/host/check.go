package host

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/runfleet/runfleet/edge/ca"
	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy"
	"github.com/runfleet/runfleet/edge/runner"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/edge/upstream"
)

// Report is what Check found.
type Report struct {
	// Problems are the reasons Open refuses the config, each at its field.
	Problems config.Problems
	// Notes are true things about the start that do not stop it: what
	// Open will make (the data dir, the seal key) and a part that will not
	// work as configured (an agent whose binary is missing).
	Notes config.Problems
	// Policy is the config's policy compiled, nil when it does not compile.
	Policy *policy.Policy
}

// Check finds every reason Open would refuse o that can be found without
// changing anything: the policy, the secrets source, and the files and
// directories the config names (present, private where they must be, of
// the right content). It makes no directory, writes no file, binds no
// port and calls no AWS API (it loads edge's AWS configuration, as Open
// does, which reads files only).
//
// o.Config is required; it may be one config.Read found problems in, and
// a field it leaves empty is not checked here (config.Read names it).
// Open runs Check first and refuses on any problem, before it writes
// anything. What only doing it can tell is left to Open: binding the
// listeners, opening the run log and the sealed CA and SSH host key, and
// the runner's making of a task's network and of control groups.
func Check(ctx context.Context, o Options) Report {
	o = withDefaults(o)
	c := &checker{ctx: ctx, o: o, cfg: o.Config}
	c.policy()
	c.dirs()
	c.files()
	c.secretsSource()
	c.sealer()
	c.agents()
	c.runner()
	return c.report
}

// runner asks the runner what it would refuse at start on this host
// (runner.Precheck): its egress as configured here, its system roots.
func (c *checker) runner() {
	for _, err := range runner.Precheck(runnerConfig(c.cfg)) {
		c.problem("runner", "%v", err)
	}
}

type checker struct {
	ctx    context.Context
	o      Options
	cfg    *config.Config
	report Report
	// dataDirRefused: what lies inside the data dir is not checked apart.
	dataDirRefused bool
	// awsLoaded: edge's AWS configuration was loaded, failing with awsErr.
	awsLoaded bool
	awsErr    error
}

func (c *checker) problem(field, format string, args ...any) {
	c.report.Problems = append(c.report.Problems, config.Problem{Path: field, Msg: fmt.Sprintf(format, args...)})
}

func (c *checker) note(field, format string, args ...any) {
	c.report.Notes = append(c.report.Notes, config.Problem{Path: field, Msg: fmt.Sprintf(format, args...)})
}

// policy compiles the policy as the watcher Open starts does.
func (c *checker) policy() {
	p, err := policy.Compile(c.cfg.Policy)
	var ps config.Problems
	switch {
	case errors.As(err, &ps):
		c.report.Problems = append(c.report.Problems, ps...)
	case err != nil:
		c.problem("policy", "%v", err)
	}
	c.report.Policy = p
}

// dirs checks the directories Open and the runner make where they are
// missing and give their modes.
func (c *checker) dirs() {
	if c.cfg.DataDir != "" {
		c.dataDirRefused = !c.dir("dataDir", c.cfg.DataDir, dataDirMode(c.cfg))
	}
	if w := c.cfg.Runner.WorkDir; w != "" && !c.inRefusedDataDir(w) {
		c.dir("runner.workDir", w, runnerWorkDirMode)
	}
	for i, root := range c.cfg.Runner.Roots {
		if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
			c.note(config.Path{"runner", "roots"}.Index(i).String(), "%s is not a directory: no localPath under it can be used", root)
		}
	}
}

// runnerWorkDirMode is the mode runner.New gives the work dir.
const runnerWorkDirMode = 0o711

// inRefusedDataDir reports whether path lies in a data dir already
// refused, which names the problem once.
func (c *checker) inRefusedDataDir(path string) bool {
	return c.dataDirRefused && within(c.cfg.DataDir, path)
}

// within reports whether path is dir or lies under it.
func within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// dir checks a directory that serve makes (with its parents) when missing
// and then sets to mode; ok is false when it is refused.
func (c *checker) dir(field, path string, mode os.FileMode) (ok bool) {
	fi, err := os.Stat(path)
	switch {
	case err == nil && !fi.IsDir():
		c.problem(field, "%s is not a directory", path)
	case err == nil && !writable(path):
		c.problem(field, "%s is not writable by edge (uid %d)", path, os.Geteuid())
	case err == nil && fi.Mode().Perm() != mode:
		c.note(field, "%s has mode %04o: edge serve sets it to %04o", path, fi.Mode().Perm(), mode)
		return true
	case err == nil:
		return true
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		// MkdirAll starts from the nearest entry that exists.
		parent := filepath.Dir(path)
		for parent != filepath.Dir(parent) {
			if _, err := os.Lstat(parent); err == nil {
				break
			}
			parent = filepath.Dir(parent)
		}
		if pi, err := os.Stat(parent); err != nil || !pi.IsDir() || !writable(parent) {
			c.problem(field, "%s does not exist and cannot be made: %s is not a directory edge (uid %d) may write in", path, parent, os.Geteuid())
			return false
		}
		c.note(field, "%s does not exist: edge serve makes it (mode %04o)", path, mode)
		return true
	default:
		c.problem(field, "%v", err)
	}
	return false
}

// writable reports whether edge may create entries in the directory dir.
func writable(dir string) bool { return unix.Access(dir, unix.W_OK|unix.X_OK) == nil }

// files checks the files Open reads at start: the host token, the host
// API's TLS pair and the upstream roots. The token and the TLS key, like
// the secrets file (secretsSource), must be private: in a task's hands
// they are the host's API and the host's identity toward Fleet.
func (c *checker) files() {
	if f := c.cfg.API.TokenFile; f != "" && c.private("api.tokenFile", f) {
		if _, err := readToken(f); err != nil {
			c.problem("api.tokenFile", "%v", err)
		}
	}
	if t := c.cfg.API.TLS; t.Enabled() {
		certErr := exists(t.CertFile)
		if certErr != nil {
			c.problem("api.tls.certFile", "%v", certErr)
		}
		if c.private("api.tls.keyFile", t.KeyFile) && certErr == nil {
			if _, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
				c.problem("api.tls", "the certificate and key do not load as a pair: %v", err)
			}
		}
	}
	if roots := c.cfg.Proxy.Upstream.ExtraRootsFile; roots != "" {
		if err := exists(roots); err != nil {
			c.problem("proxy.upstream.extraRootsFile", "%v", err)
		} else if _, err := upstream.ClientTLSConfig(roots); err != nil {
			c.problem("proxy.upstream.extraRootsFile", "%v", err)
		}
	}
}

// private checks a file tasks must not read (checkPrivate); ok is false
// when it is refused, at field.
func (c *checker) private(field, path string) (ok bool) {
	if err := checkPrivate(path); err != nil {
		c.problem(field, "%v", err)
		return false
	}
	return true
}

// exists says, in the operator's words, why path cannot be read.
func exists(path string) error {
	_, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s does not exist", path)
	}
	return err
}

// secretsSource checks the source the proxy reads real values from, as
// Open makes it; with the kill switch on, Open makes none. The secrets
// file must be private either way: it holds every real value.
func (c *checker) secretsSource() {
	s := c.cfg.Secrets
	switch {
	case s.File != "":
		if !c.private("secrets.file", s.File) || c.o.KillSwitch {
			break
		}
		src, err := secrets.NewFileSource(s.File)
		if err != nil {
			c.problem("secrets.file", "%v", err)
			break
		}
		src.Close()
	case c.o.KillSwitch:
	case s.AWSSecretsManager != nil:
		if err := c.loadAWS(); err != nil {
			c.problem("secrets.awsSecretsManager", "loading edge's AWS configuration: %v", err)
		}
	default:
		c.problem("secrets", "%s", noSecretsSource)
	}
	if p := c.report.Policy; p != nil && slices.ContainsFunc(p.Keys(), func(k *policy.Key) bool { return k.AWS != nil && k.AWS.AssumeRole != nil }) {
		if err := c.loadAWS(); err != nil {
			c.note("policy", "aws keys with aws.assumeRole cannot be used: loading edge's AWS configuration failed: %v", err)
		}
	}
}

// noSecretsSource is why Open refuses a config with no secrets source.
const noSecretsSource = "set secrets.file or secrets.awsSecretsManager, or keep the secrets proxy down with " + proxy.KillSwitchEnv + "=off"

// sealer checks what seals the CA's keys: edge's AWS configuration for
// KMS, else the seal key file when there is one (Open makes it when
// there is not).
func (c *checker) sealer() {
	if c.cfg.CA.KMSKeyID != "" {
		if err := c.loadAWS(); err != nil {
			c.problem("ca.kmsKeyId", "loading edge's AWS configuration: %v", err)
		}
		return
	}
	path := c.cfg.CA.SealKeyFile
	if path == "" || c.inRefusedDataDir(path) {
		return
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		c.note("ca.sealKeyFile", "%s does not exist: edge serve makes a new seal key there (mode 0600)", path)
		return
	}
	if _, err := ca.NewFileSealer(path, nil); err != nil {
		c.problem("ca.sealKeyFile", "%v", err)
	}
}

// agents notes an agent whose binary, named by its path, is not there: edge
// starts, and each run of that agent fails. A bare name is looked up on the
// task's PATH at each run.
func (c *checker) agents() {
	for _, name := range slices.Sorted(maps.Keys(c.cfg.Agents)) {
		argv := c.cfg.Agents[name].Argv
		if len(argv) == 0 || !filepath.IsAbs(argv[0]) {
			continue
		}
		fi, err := os.Stat(argv[0])
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			c.note(config.Path{"agents", name, "argv"}.Index(0).String(), "%s is not an executable file: every run of agent %q fails until it is", argv[0], name)
		}
	}
}

// loadAWS loads edge's AWS configuration once, as Open does.
func (c *checker) loadAWS() error {
	if !c.awsLoaded {
		_, c.awsErr = c.o.AWS(c.ctx)
		c.awsLoaded = true
	}
	return c.awsErr
}

// checkPrivate refuses a file every user may read: tasks run as another
// user (with no supplementary group), so only its "other" bits would let
// them.
func checkPrivate(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return exists(path)
	}
	if fi.Mode().Perm()&0o004 != 0 {
		return fmt.Errorf("%s is readable by every user (mode %04o), tasks included; make it private (chmod o-rwx)", path, fi.Mode().Perm())
	}
	return nil
}
