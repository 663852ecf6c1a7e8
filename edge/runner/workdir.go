package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/runfleet/runfleet/edge/internal/atomicfile"
	"github.com/runfleet/runfleet/edge/sandbox"
)

// A task's files, under <workDir>/<runId>:
//
//	<runId>/        edge:<run's group> 0750  the barrier: only this run's group may enter
//	  trust/        edge 0755, files 0644     written by edge alone (atomic renames);
//	                                          trust.pem is also the task's system trust store
//	  etc/          edge 0755, files 0644     the task's /etc/resolv.conf and /etc/hosts
//	  home/         task user:<run's group> 2770
//	  work/         task user:<run's group> 2770  (a clone, or fresh; unused with localPath)
//	  tmp/          task user:<run's group> 1777  the task's /tmp, fresh for each attempt
//	  var-tmp/      task user:<run's group> 1777  the task's /var/tmp, likewise
//
// Every run gets its own group id (see taskIdentity), so tasks that share
// runner.user's uid still cannot enter each other's directories, and since the
// kernel's ptrace access check compares groups too, they cannot read each
// other's /proc/<pid>/environ (placeholders, proxy password) or cwd either.
// A sandboxed task (edge is root) also has its own PID, mount and IPC
// namespaces: it sees and signals its own processes alone, its tmp dirs
// are mounted on /tmp and /var/tmp, and, for a task with secrets, the
// system trust store files (/etc/ssl/certs/ca-certificates.crt and the
// other distributions') read as its trust.pem, whichever edge renamed in
// last (see package sandbox).
type taskDirs struct {
	Run    string
	Trust  string
	Etc    string
	Home   string
	Work   string
	Tmp    string
	VarTmp string
}

const (
	trustFileName    = "trust.pem"
	caBundleFileName = "ca-bundle.pem"
)

func (d taskDirs) trustFile() string { return filepath.Join(d.Trust, trustFileName) }
func (d taskDirs) caBundle() string  { return filepath.Join(d.Trust, caBundleFileName) }

func (r *Runner) dirsFor(runID string, localPath string) taskDirs {
	run := filepath.Join(r.cfg.WorkDir, runID)
	d := taskDirs{Run: run, Trust: filepath.Join(run, "trust"), Etc: filepath.Join(run, "etc"), Home: filepath.Join(run, "home"), Work: filepath.Join(run, "work"),
		Tmp: filepath.Join(run, "tmp"), VarTmp: filepath.Join(run, "var-tmp")}
	if localPath != "" {
		d.Work = localPath
	}
	return d
}

// taskIdentity is who a task runs as.
type taskIdentity struct {
	User string
	UID  uint32
	// GID is the run's own group when Switch is set, edge's own otherwise.
	GID uint32
	// Switch: edge runs tasks under UID/GID (edge is root). Unset only with
	// runner.insecureSameUser, where tasks run as edge itself.
	Switch bool
}

// resolveIdentity decides who tasks run as, once at New. err is not nil when
// tasks cannot run at all (admission then refuses every run, saying why).
func resolveIdentity(cfg Config) (base taskIdentity, sameUser bool, err error) {
	if os.Geteuid() != 0 {
		if !cfg.InsecureSameUser {
			return taskIdentity{}, false, fmt.Errorf("edge runs as uid %d and cannot switch to runner.user %q; it refuses runs unless runner.insecureSameUser is set", os.Geteuid(), cfg.User)
		}
		me, err := user.Current()
		name := strconv.Itoa(os.Getuid())
		if err == nil {
			name = me.Username
		}
		return taskIdentity{User: name, UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}, true, nil
	}
	u, err := user.Lookup(cfg.User)
	if err != nil {
		return taskIdentity{}, false, fmt.Errorf("runner.user %q: %w", cfg.User, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return taskIdentity{}, false, fmt.Errorf("runner.user %q has uid %q", cfg.User, u.Uid)
	}
	if uid == 0 || int(uid) == os.Geteuid() {
		return taskIdentity{}, false, fmt.Errorf("runner.user %q is edge's own uid %d; tasks must never run as edge", cfg.User, uid)
	}
	return taskIdentity{User: cfg.User, UID: uint32(uid), Switch: true}, false, nil
}

// identityFor is the run's identity: runner.user with the run's own group.
// Serials are unique in one run log, so no two runs an edge keeps share a
// group until TaskGroups.Count runs later; the log's instance number
// offsets them, so two edges on one machine (or two tests) do not either.
func (r *Runner) identityFor(serial uint64) (taskIdentity, error) {
	id := r.ident
	if !id.Switch {
		return id, nil
	}
	id.GID = r.taskGroup(serial)
	if g, err := user.LookupGroupId(strconv.FormatUint(uint64(id.GID), 10)); err == nil {
		return taskIdentity{}, fmt.Errorf("the run's group id %d belongs to group %q; move runner task groups elsewhere", id.GID, g.Name)
	}
	return id, nil
}

func (r *Runner) taskGroup(serial uint64) uint32 {
	return r.cfg.TaskGroups.First + uint32((r.log.Instance()+serial-1)%uint64(r.cfg.TaskGroups.Count))
}

// prepareDirs creates the run's directories (again for a retry) with the
// ownership and modes above.
func prepareDirs(d taskDirs, id taskIdentity, fresh bool) error {
	type dir struct {
		path     string
		uid, gid int
		mode     os.FileMode
	}
	me, myGroup := os.Geteuid(), os.Getegid()
	// os.FileMode spells setgid ModeSetgid (its 0o2000 bit is no mode).
	shared := os.ModeSetgid | 0o770
	dirs := []dir{{d.Run, me, int(id.GID), 0o750}, {d.Trust, me, myGroup, 0o755}, {d.Etc, me, myGroup, 0o755}, {d.Home, int(id.UID), int(id.GID), shared}}
	if fresh {
		dirs = append(dirs, dir{d.Work, int(id.UID), int(id.GID), shared})
	}
	if !id.Switch {
		for i := range dirs {
			dirs[i].uid, dirs[i].gid, dirs[i].mode = me, myGroup, 0o700
		}
	}
	for _, x := range dirs {
		if err := os.Mkdir(x.path, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("creating %s: %w", x.path, err)
		}
		// Lchown/Chmod on a path a task could have swapped for a link: the
		// run dir and trust dir are edge's and the task cannot write the run
		// dir, so the names below it are edge's to decide.
		if err := os.Lchown(x.path, x.uid, x.gid); err != nil {
			return fmt.Errorf("owning %s: %w", x.path, err)
		}
		if err := os.Chmod(x.path, x.mode); err != nil {
			return fmt.Errorf("setting the mode of %s: %w", x.path, err)
		}
	}
	return nil
}

// resetPrivateTmp makes the run's tmp dirs afresh for an attempt: nothing
// an earlier attempt left there remains, and the sandbox's init, which
// works in them as root before the task starts, finds them empty.
func resetPrivateTmp(d taskDirs, id taskIdentity) error {
	uid, gid, mode := int(id.UID), int(id.GID), os.ModeSticky|0o777
	if !id.Switch {
		uid, gid, mode = os.Geteuid(), os.Getegid(), 0o700
	}
	for _, dir := range []string{d.Tmp, d.VarTmp} {
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("clearing %s: %w", dir, err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", dir, err)
		}
		if err := os.Lchown(dir, uid, gid); err != nil {
			return fmt.Errorf("owning %s: %w", dir, err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			return fmt.Errorf("setting the mode of %s: %w", dir, err)
		}
	}
	return nil
}

// writeTrustFiles replaces the task's trust file (system roots, then the CA
// bundle) and CA bundle atomically, so a task reading either never sees half
// of one.
func writeTrustFiles(d taskDirs, systemRoots, bundle []byte) error {
	trust := make([]byte, 0, len(systemRoots)+len(bundle)+1)
	trust = append(trust, systemRoots...)
	if len(trust) > 0 && trust[len(trust)-1] != '\n' {
		trust = append(trust, '\n')
	}
	trust = append(trust, bundle...)
	if err := atomicfile.Write(d.caBundle(), bundle, 0o644); err != nil {
		return err
	}
	return atomicfile.Write(d.trustFile(), trust, 0o644)
}

// clone makes the task's work dir a shallow clone of rawURL, running git as
// the task (its user, its group, its env, in its network, so an HTTPS clone
// goes through the proxy and verifies with the trust file). A work dir that already holds a
// clone (a retry's) is kept.
func (r *Runner) clone(ctx context.Context, t *task, rawURL string, env []string) error {
	if _, err := os.Lstat(filepath.Join(t.dirs.Work, ".git")); err == nil {
		return nil
	}
	if err := os.RemoveAll(t.dirs.Work); err != nil {
		return fmt.Errorf("clearing the work dir: %w", err)
	}
	if err := prepareDirs(t.dirs, t.ident, true); err != nil {
		return err
	}
	git, err := lookPath("git", taskPath)
	if err != nil {
		return err
	}
	argv := []string{git, "clone", "--depth", "1", "--quiet", "--", rawURL, t.dirs.Work}
	cmd := &exec.Cmd{Path: git, Args: argv, Env: append(env, "GIT_TERMINAL_PROMPT=0"), Dir: t.dirs.Home}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &limitedWriter{w: &stderr, n: 4 << 10}
	// Where edge can switch users, git runs in the task's sandbox, as the
	// agent will: its user, its network, its resolver files and trust
	// store, its private directories.
	var box *sandbox.Launch
	if t.ident.Switch {
		if err := resetPrivateTmp(t.dirs, t.ident); err != nil {
			return err
		}
		spec := r.sandboxSpec(t, git, argv)
		spec.Dir, spec.NoTerminal = t.dirs.Home, true
		if box, err = sandbox.Prepare(cmd, r.cfg.TaskInit, spec); err != nil {
			return err
		}
		defer box.Close()
	}
	if err = t.startIn(cmd.Start); err != nil {
		return err
	}
	if box == nil {
		r.joinGroup(t, cmd.Process.Pid)
	}
	stop := context.AfterFunc(ctx, func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	if box != nil {
		if err := box.Started(); err != nil {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			cmd.Wait()
			stop()
			return err
		}
	}
	err = cmd.Wait()
	stop()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		msg := gitError(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return errors.New("git clone " + redactURL(rawURL) + ": " + redactIn(msg, rawURL))
	}
	return nil
}

// redactURL drops credentials a clone URL may carry, which must reach
// neither a log nor an event.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	return u.Redacted()
}

func redactIn(msg, raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return msg
	}
	msg = strings.ReplaceAll(msg, raw, u.Redacted())
	if p, ok := u.User.Password(); ok && p != "" {
		msg = strings.ReplaceAll(msg, p, "xxxxx")
	}
	return msg
}

// gitError is the line of git's stderr that says what went wrong: the first
// "fatal:" line, else the last line.
func gitError(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for _, l := range lines {
		if strings.HasPrefix(l, "fatal:") {
			return strings.TrimSpace(l)
		}
	}
	return strings.TrimSpace(lines[len(lines)-1])
}

type limitedWriter struct {
	w *bytes.Buffer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if room := l.n - l.w.Len(); room > 0 {
		l.w.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// The task's resolver files: every name is asked of edge's DNS in its
// network (nothing else answers there), and the hosts file knows the
// loopback alone, never what the host's lists.
const (
	taskResolvConf = "nameserver 127.0.0.1\n"
	taskHosts      = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
)

// networkFiles writes the task's resolver files and, when it has ssh keys,
// its /etc/ssh/ssh_known_hosts (edge's host key under each of their
// domains, so the task's ssh trusts edge there and nowhere else), and
// returns how its sandbox mounts them.
func networkFiles(d taskDirs, sshKnownHosts []byte) ([]sandbox.Mount, error) {
	files := []struct {
		target, content string
		make            bool
	}{{"/etc/resolv.conf", taskResolvConf, false}, {"/etc/hosts", taskHosts, false}}
	if len(sshKnownHosts) > 0 {
		files = append(files, struct {
			target, content string
			make            bool
		}{"/etc/ssh/ssh_known_hosts", string(sshKnownHosts), true})
	}
	var mounts []sandbox.Mount
	for _, f := range files {
		src := filepath.Join(d.Etc, filepath.Base(f.target))
		if err := atomicfile.Write(src, []byte(f.content), 0o644); err != nil {
			return nil, err
		}
		mounts = append(mounts, sandbox.Mount{Target: f.target, Source: src, Make: f.make})
	}
	return mounts, nil
}
