package sandbox

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// InitArg is the first argument that makes a binary act as a task's init:
// edge's hidden subcommand `edge task-init`. A binary that runs tasks in
// their sandbox (edge, and a test binary through its TestMain) must hand
// control to Main when its first argument is InitArg.
const InitArg = "task-init"

// mqueueDir is where Linux systems mount the POSIX message queue file
// system.
const mqueueDir = "/dev/mqueue"

// The init's inherited file descriptors (exec.Cmd.ExtraFiles): the spec,
// read to its end, and the reports, written as JSON lines.
const (
	specFD   = 3
	reportFD = 4
)

// Spec is what a task's init needs to start the agent. Edge sends it; the
// agent's env is the init's own.
type Spec struct {
	// UID and GID are the task's user and its run's own group; the agent
	// gets no supplementary group.
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	// Private are the directories the task gets a private copy of: each
	// Source (a directory of the run's, fresh) is mounted over its Target
	// (/tmp, /var/tmp).
	Private []Mount `json:"private"`
	// Hide are directories of the host's the task sees empty: a fresh
	// tmpfs, root's, mode 0755, nosuid and nodev, on each that is a
	// directory (not a link), under every other mount. /run is one: the
	// host's services listen on Unix sockets there (its resolver, the
	// system bus, the journal, a database), and a Unix socket is a way
	// around the task's network namespace. What the task must still find
	// under one (a Tmpfs, a Keep path, a Files target) is made there
	// afresh.
	Hide []string `json:"hide,omitempty"`
	// Tmpfs are the shared world-writable directories (/dev/shm,
	// /run/lock) the task gets an empty one of its own: a fresh tmpfs,
	// mode 1777, nosuid and nodev, of Bytes, on each Target that exists
	// (or lies under a Hide directory).
	Tmpfs []Tmpfs `json:"tmpfs"`
	// Keep are directories the task must reach at their own paths though
	// they lie under a private directory (a run dir under /tmp): each is
	// bound back in place. Absolute, without symbolic links.
	Keep []string `json:"keep"`
	// Trust, when set, makes the system trust store read through to the
	// task's trust file, kept current by edge; nil leaves the host's.
	Trust *Trust `json:"trust,omitempty"`
	// Files are files of edge's (the task's /etc/resolv.conf and
	// /etc/hosts), each Source mounted read-only over its Target where the
	// Target exists (through its links: a resolv.conf linking to a stub's
	// file is replaced where it lies, made afresh where that is under a
	// Hide directory). A Make file is also mounted where the host has none
	// but has its directory: that directory is rebuilt as a trust store's
	// is (rebuildDir), with the file added (/etc/ssh/ssh_known_hosts).
	Files []Mount `json:"files,omitempty"`
	// Dir is the agent's working dir.
	Dir string `json:"dir"`
	// Path is the agent's executable, Argv its arguments.
	Path string   `json:"path"`
	Argv []string `json:"argv"`
	// Cgroups are the cgroup.procs files of the task's control group, one
	// per hierarchy: the init joins it first, so the agent and all it
	// starts are bounded by its limits. Empty: no group.
	Cgroups []string `json:"cgroups,omitempty"`
	// NoTerminal: the agent's descriptors 0-2 are no terminal (a clone's
	// pipes), so it is not made the terminal's foreground.
	NoTerminal bool `json:"noTerminal,omitempty"`
}

// Mount is a directory or file mounted over another.
type Mount struct {
	Target string `json:"target"`
	Source string `json:"source"`
	// Make: for a file of Files, made where the host has none.
	Make bool `json:"make,omitempty"`
}

// Tmpfs is a private tmpfs mounted over a shared directory.
type Tmpfs struct {
	Target string `json:"target"`
	Bytes  int64  `json:"bytes"`
}

// Trust is how a task's system trust store follows its trust file.
type Trust struct {
	// File is the task's trust file (system roots, then the proxy's CA
	// bundle), which edge replaces by renaming a new one over it. It must
	// stay reachable at its path in the task (under Keep, or outside every
	// private directory).
	File string `json:"file"`
	// Replace are the trust store paths programs read on their own (the
	// distributions' bundle files); those absent on the host are ignored.
	// Each, resolved through its links, reads as File in the task.
	Replace []string `json:"replace"`
}

// Report is what the init tells edge: first that the agent started, or
// why it did not (Error); then how the agent ended.
type Report struct {
	Started bool   `json:"started,omitempty"`
	Error   string `json:"error,omitempty"`
	// Exited: the agent ended, with Code, or killed by Signal.
	Exited bool `json:"exited,omitempty"`
	Code   int  `json:"code,omitempty"`
	Signal int  `json:"signal,omitempty"`
}

// Launch is the edge side of one task's init: Prepare it on the command
// that starts the init, Start the command, then Started; after the
// command's Wait, Ended; Close in any case.
type Launch struct {
	spec    *os.File // the child's fd 3
	reportW *os.File // the child's fd 4
	reportR *os.File
	reports *bufio.Reader
}

// Prepare sets cmd up to start initPath as the task's init with spec: in
// new PID, mount and IPC namespaces, as root (the init drops to the task's
// user itself), its spec and reports on inherited descriptors. cmd's
// SysProcAttr, if set, keeps its other fields.
func Prepare(cmd *exec.Cmd, initPath string, spec Spec) (*Launch, error) {
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("sandbox: encoding the spec: %w", err)
	}
	// A memory file rather than a pipe: the spec may outgrow a pipe's
	// buffer, and the init reads it whenever it is ready.
	fd, err := unix.MemfdCreate("runfleet-task-spec", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("sandbox: creating the spec file: %w", err)
	}
	l := &Launch{spec: os.NewFile(uintptr(fd), "task-spec")}
	if _, err := l.spec.Write(data); err != nil {
		l.Close()
		return nil, fmt.Errorf("sandbox: writing the spec: %w", err)
	}
	if _, err := l.spec.Seek(0, io.SeekStart); err != nil {
		l.Close()
		return nil, fmt.Errorf("sandbox: writing the spec: %w", err)
	}
	if l.reportR, l.reportW, err = os.Pipe(); err != nil {
		l.Close()
		return nil, fmt.Errorf("sandbox: creating the report pipe: %w", err)
	}
	l.reports = bufio.NewReader(l.reportR)
	cmd.Path = initPath
	cmd.Args = []string{initPath, InitArg}
	cmd.ExtraFiles = []*os.File{l.spec, l.reportW}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// An IPC namespace of its own: System V IPC objects and POSIX message
	// queues are otherwise one set shared by every task.
	cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC
	cmd.SysProcAttr.Credential = nil
	return l, nil
}

// Started closes the parent's copies of the child's descriptors and waits
// for the init's first report: nil once the agent runs, else why it does
// not (the init then exits by itself).
func (l *Launch) Started() error {
	l.spec.Close()
	l.reportW.Close()
	r, err := l.next()
	switch {
	case err != nil:
		return fmt.Errorf("sandbox: the task's init ended without starting the agent (does this binary dispatch %q?): %w", InitArg, err)
	case r.Error != "":
		return errors.New("sandbox: task init: " + r.Error)
	case !r.Started:
		return errors.New("sandbox: the task's init sent no start report")
	}
	return nil
}

// Ended returns the init's report of how the agent ended, once the init
// has exited; ok is false when it sent none (it was killed).
func (l *Launch) Ended() (Report, bool) {
	r, err := l.next()
	return r, err == nil && r.Exited
}

// Close releases the edge side's descriptors.
func (l *Launch) Close() {
	for _, f := range []*os.File{l.spec, l.reportW, l.reportR} {
		if f != nil {
			f.Close()
		}
	}
}

func (l *Launch) next() (Report, error) {
	line, err := l.reports.ReadBytes('\n')
	if err != nil {
		return Report{}, err
	}
	var r Report
	if err := json.Unmarshal(line, &r); err != nil {
		return Report{}, fmt.Errorf("reading a report: %w", err)
	}
	return r, nil
}

// Main is a task's init, PID 1 of the task's own PID namespace (with mount
// and IPC namespaces of its own): as root it makes every mount private,
// hides the host's directories of sockets (/run) under empty ones, mounts
// the private directories, a fresh tmpfs on each shared world-writable
// directory (/dev/shm, /run/lock), a fresh mqueue file
// system and a /proc of its namespaces, and points the system trust store
// at the task's trust file (Spec.Trust); then it drops to the task's user
// for good, starts the agent on the terminal as its child (its own process
// group, in the foreground, with descriptors 0-2 alone), forwards SIGTERM,
// SIGINT and SIGHUP to that group, reaps every orphan, and exits with the
// agent's status (128+signal when a signal killed it). Its exit ends every
// process left in the namespace. It returns the exit code.
func Main() int {
	// no_new_privs and the parent-death signal belong to a thread, and a
	// child inherits its forking thread's: everything from here to the
	// agent's fork happens on this one.
	runtime.LockOSThread()
	reports := os.NewFile(reportFD, "reports")
	report := func(r Report) {
		b, _ := json.Marshal(r)
		reports.Write(append(b, '\n'))
	}
	fail := func(err error) int {
		report(Report{Error: err.Error()})
		return 1
	}
	// Installed before anything else: as PID 1 the init gets only the
	// signals it handles, and SIGTTOU and SIGTTIN must not stop it once
	// the agent holds the terminal.
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGTTOU, syscall.SIGTTIN)

	spec, err := readSpec(os.NewFile(specFD, "spec"))
	if err != nil {
		return fail(err)
	}
	// "0" is the writer itself, with all its threads.
	for _, procs := range spec.Cgroups {
		if err := os.WriteFile(procs, []byte("0"), 0); err != nil {
			return fail(fmt.Errorf("joining the task's control group: %w", err))
		}
	}
	if err := isolate(spec); err != nil {
		return fail(err)
	}
	if err := dropPrivileges(spec.UID, spec.GID); err != nil {
		return fail(err)
	}
	if err := stayBoundToEdge(reportFD); err != nil {
		return fail(err)
	}
	select {
	case sig := <-signals:
		if stopping(sig) {
			return fail(fmt.Errorf("%v before the agent started", sig))
		}
	default:
	}
	// The agent gets the terminal on 0-2 and nothing else: neither the
	// init's own descriptors nor any edge's parent passed down.
	if err := CloseExtraFilesOnExec(); err != nil {
		return fail(err)
	}
	// Last, on this thread, which forks the agent: the agent and all it
	// starts run under the filter.
	if err := installSeccomp(); err != nil {
		return fail(err)
	}
	// Its own process group, in the terminal's foreground: it reads the
	// terminal, and ^C typed as input reaches it alone.
	sys := &syscall.SysProcAttr{Setpgid: true, Foreground: true, Ctty: 0}
	if spec.NoTerminal {
		sys = &syscall.SysProcAttr{Setpgid: true}
	}
	pid, err := syscall.ForkExec(spec.Path, spec.Argv, &syscall.ProcAttr{
		Env:   os.Environ(),
		Files: []uintptr{0, 1, 2},
		Sys:   sys,
	})
	if err != nil {
		return fail(fmt.Errorf("starting %s: %w", spec.Path, err))
	}
	report(Report{Started: true})

	reaped := make(chan syscall.WaitStatus)
	go reap(pid, reaped)
	for {
		select {
		case sig := <-signals:
			if stopping(sig) {
				s := sig.(syscall.Signal)
				if err := syscall.Kill(-pid, s); errors.Is(err, syscall.ESRCH) {
					syscall.Kill(pid, s) // it left its group
				}
			}
		case ws := <-reaped:
			end := Report{Exited: true, Code: ws.ExitStatus()}
			if ws.Signaled() {
				end.Code, end.Signal = 128+int(ws.Signal()), int(ws.Signal())
			}
			report(end)
			return end.Code
		}
	}
}

func stopping(sig os.Signal) bool {
	return sig == syscall.SIGTERM || sig == syscall.SIGINT || sig == syscall.SIGHUP
}

// reap waits for every child the init gets (the agent, and each orphan of
// the namespace) and delivers the agent's status.
func reap(agent int, agentEnded chan<- syscall.WaitStatus) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return
		}
		if pid == agent {
			agentEnded <- ws
			return
		}
	}
}

func readSpec(f *os.File) (Spec, error) {
	defer f.Close()
	var spec Spec
	if err := json.NewDecoder(f).Decode(&spec); err != nil {
		return Spec{}, fmt.Errorf("reading the spec: %w", err)
	}
	if spec.UID == 0 || spec.GID == 0 {
		return Spec{}, errors.New("the spec would run the agent as root")
	}
	if spec.Path == "" || len(spec.Argv) == 0 || !filepath.IsAbs(spec.Dir) {
		return Spec{}, errors.New("the spec names no agent or working dir")
	}
	paths := append(append([]string{spec.Dir}, spec.Keep...), spec.Hide...)
	for _, m := range spec.Tmpfs {
		if m.Bytes <= 0 {
			return Spec{}, fmt.Errorf("the spec's tmpfs on %q has no size", m.Target)
		}
		paths = append(paths, m.Target)
	}
	if spec.Trust != nil {
		paths = append(append(paths, spec.Trust.File), spec.Trust.Replace...)
	}
	for _, p := range spec.Cgroups {
		if filepath.Base(p) != "cgroup.procs" {
			return Spec{}, fmt.Errorf("the spec's control group file %q is not a cgroup.procs", p)
		}
	}
	paths = append(paths, spec.Cgroups...)
	for _, p := range paths {
		if !clean(p) {
			return Spec{}, fmt.Errorf("the spec's path %q is not absolute and clean", p)
		}
	}
	for _, m := range spec.Files {
		if !clean(m.Target) || !filepath.IsAbs(m.Source) {
			return Spec{}, fmt.Errorf("the spec's file %q is not absolute and clean", m.Target)
		}
		if m.Make && filepath.Dir(m.Target) == "/" {
			return Spec{}, fmt.Errorf("the spec's file %q would be made in /, which cannot be rebuilt", m.Target)
		}
	}
	for _, m := range spec.Private {
		if !clean(m.Target) || !filepath.IsAbs(m.Source) {
			return Spec{}, fmt.Errorf("the spec's private dir %q is not absolute and clean", m.Target)
		}
	}
	return spec, nil
}

func clean(path string) bool { return filepath.IsAbs(path) && filepath.Clean(path) == path }

// isolate sets up the task's mount namespace, as root: nothing mounted
// here reaches edge's namespace; empty directories hide the host's
// sockets; the private directories and tmpfs replace the shared ones;
// what must stay reachable is bound back (or made afresh); the
// trust store reads through to the trust file; /dev/mqueue and /proc show
// this IPC and PID namespace alone.
func isolate(spec Spec) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the mounts private: %w", err)
	}
	// Everything mounted from is opened first: a source under a target
	// (a run dir under /tmp) is hidden once the target is mounted over.
	open := func(path string) (int, error) {
		fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("opening %s: %w", path, err)
		}
		return fd, nil
	}
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	sources := make([]int, len(spec.Private))
	for i, m := range spec.Private {
		fd, err := open(m.Source)
		if err != nil {
			return err
		}
		sources[i] = fd
		fds = append(fds, fd)
	}
	files := make([]int, len(spec.Files))
	// Where each file's Target leads on the host, "" where nowhere:
	// resolved before a Hide directory hides where its links go.
	fileTargets := make([]string, len(spec.Files))
	// made[i]: file i's target is new, in a directory rebuilt to hold it.
	made := make([]bool, len(spec.Files))
	for i, m := range spec.Files {
		fd, err := unix.Open(m.Source, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening %s: %w", m.Source, err)
		}
		files[i] = fd
		fds = append(fds, fd)
		real, err := filepath.EvalSymlinks(m.Target)
		if errors.Is(err, fs.ErrNotExist) && m.Make {
			if dir, derr := filepath.EvalSymlinks(filepath.Dir(m.Target)); derr == nil {
				fileTargets[i] = filepath.Join(dir, filepath.Base(m.Target))
				made[i] = true
			}
			continue
		}
		if errors.Is(err, fs.ErrNotExist) {
			continue // nothing of the host's to replace
		}
		if err != nil {
			return fmt.Errorf("resolving %s: %w", m.Target, err)
		}
		fileTargets[i] = real
	}
	keep := make([]int, len(spec.Keep))
	for i, p := range spec.Keep {
		fd, err := open(p)
		if err != nil {
			return err
		}
		keep[i] = fd
		fds = append(fds, fd)
	}
	const private = unix.MS_NOSUID | unix.MS_NODEV
	// Every directory mounted afresh: what lies under one is made there.
	var targets []string
	for _, dir := range spec.Hide {
		// A link (/var/run, to /run) is hidden where it leads, if that is
		// listed too.
		if fi, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) || err == nil && !fi.IsDir() {
			continue
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", private, "mode=0755,size=1m"); err != nil {
			return fmt.Errorf("hiding %s: %w", dir, err)
		}
		targets = append(targets, dir)
	}
	for i, m := range spec.Private {
		if err := bindFD(sources[i], m.Target, private); err != nil {
			return err
		}
		targets = append(targets, m.Target)
	}
	for _, m := range spec.Tmpfs {
		if underAny(m.Target, targets) {
			if err := mkdirAllNoFollow(m.Target); err != nil {
				return fmt.Errorf("making %s: %w", m.Target, err)
			}
		} else if _, err := os.Stat(m.Target); errors.Is(err, os.ErrNotExist) {
			// A directory this host lacks is no channel between tasks.
			continue
		}
		if err := unix.Mount("tmpfs", m.Target, "tmpfs", private, "mode=1777,size="+strconv.FormatInt(m.Bytes, 10)); err != nil {
			return fmt.Errorf("mounting %s: %w", m.Target, err)
		}
		targets = append(targets, m.Target)
	}
	for i, p := range spec.Keep {
		if !underAny(p, targets) {
			continue
		}
		// The mount point is made in the fresh private directory, before
		// any process of the task exists.
		if err := mkdirAllNoFollow(p); err != nil {
			return fmt.Errorf("keeping %s reachable: %w", p, err)
		}
		if err := bindFD(keep[i], p, 0); err != nil {
			return err
		}
	}
	if spec.Trust != nil {
		if err := replaceTrustStore(*spec.Trust); err != nil {
			return err
		}
	}
	for i := range spec.Files {
		target := fileTargets[i]
		if target == "" {
			continue
		}
		switch {
		case underAny(target, targets):
			if err := mkfileNoFollow(target); err != nil {
				return fmt.Errorf("making %s: %w", target, err)
			}
		case made[i]:
			if err := rebuildDir(filepath.Dir(target), nil, []string{filepath.Base(target)}); err != nil {
				return err
			}
		}
		if err := bindFD(files[i], target, private|unix.MS_RDONLY); err != nil {
			return err
		}
	}
	// The mqueue file system mounted where the host has one shows the
	// host's IPC namespace's queues, not this one's.
	if _, err := os.Stat(mqueueDir); err == nil {
		if err := unix.Mount("mqueue", mqueueDir, "mqueue", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("mounting %s: %w", mqueueDir, err)
		}
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	if err := unix.Chdir(spec.Dir); err != nil {
		return fmt.Errorf("entering the working dir: %w", err)
	}
	return nil
}

// CloseExtraFilesOnExec marks every descriptor but 0-2 close-on-exec, so
// a program started from then on inherits only the descriptors it is
// handed (exec.Cmd's Stdin, Stdout, Stderr and ExtraFiles). Go opens its
// own close-on-exec; this is for those inherited without the flag. Where
// close_range(2) cannot set the flag (Linux before 5.11, or a seccomp
// filter older than the call, as systemd's, refusing it with EPERM) it sets
// it on each descriptor open.
func CloseExtraFilesOnExec() error { return closeExtraFilesOnExec(unix.CloseRange) }

func closeExtraFilesOnExec(closeRange func(first, last, flags uint) error) error {
	err := closeRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("marking the descriptors close-on-exec: %w", err)
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("listing the open descriptors: %w", err)
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
	return nil
}

// bindFD mounts the directory open as fd on target with flags (nosuid,
// nodev) on top of the bind's.
func bindFD(fd int, target string, flags uintptr) error {
	source := "/proc/self/fd/" + strconv.Itoa(fd)
	if err := unix.Mount(source, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("mounting over %s: %w", target, err)
	}
	if flags != 0 {
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|flags, ""); err != nil {
			return fmt.Errorf("restricting %s: %w", target, err)
		}
	}
	return nil
}

func underAny(path string, dirs []string) bool {
	for _, d := range dirs {
		if strings.HasPrefix(path, d+"/") {
			return true
		}
	}
	return false
}

// mkdirAllNoFollow makes path's directories (root's, 0711: they can be
// passed through, not listed), refusing any component that is a symbolic
// link.
func mkdirAllNoFollow(path string) error {
	dir, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer func() { unix.Close(dir) }()
	for _, name := range strings.Split(strings.Trim(path, "/"), "/") {
		if name == "" || name == "." || name == ".." {
			return fmt.Errorf("%q is not a clean path", path)
		}
		if err := unix.Mkdirat(dir, name, 0o711); err == nil {
			// The umask (edge's) may have narrowed it.
			if err := unix.Fchmodat(dir, name, 0o711, 0); err != nil {
				return err
			}
		} else if !errors.Is(err, unix.EEXIST) {
			return err
		}
		next, err := unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		unix.Close(dir)
		dir = next
	}
	return nil
}

// mkfileNoFollow makes path an empty file (root's, 0644) to mount a file
// on, with its directories as mkdirAllNoFollow makes them; one already
// there is kept.
func mkfileNoFollow(path string) error {
	dir := filepath.Dir(path)
	if err := mkdirAllNoFollow(dir); err != nil {
		return err
	}
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, filepath.Base(path), unix.O_CREAT|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// dropPrivileges makes the init the task's user for good: no new
// privileges on this thread, which forks the agent (setuid and file
// capabilities stay inert), no supplementary groups, the run's group, the
// task's uid (on every thread); then it checks that root cannot be had
// back and no capability is left.
func dropPrivileges(uid, gid uint32) error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
	if err := syscall.Setgroups([]int{}); err != nil {
		return fmt.Errorf("dropping supplementary groups: %w", err)
	}
	if err := syscall.Setgid(int(gid)); err != nil {
		return fmt.Errorf("setting the group: %w", err)
	}
	if err := syscall.Setuid(int(uid)); err != nil {
		return fmt.Errorf("setting the user: %w", err)
	}
	if syscall.Setuid(0) == nil || syscall.Setgid(0) == nil {
		return errors.New("the task's user could become root again")
	}
	if os.Getuid() != int(uid) || os.Geteuid() != int(uid) || os.Getgid() != int(gid) || os.Getegid() != int(gid) {
		return errors.New("the task's user and group did not take")
	}
	if groups, err := syscall.Getgroups(); err != nil || len(groups) != 0 {
		return fmt.Errorf("supplementary groups left: %v %v", groups, err)
	}
	status, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(status), "\n") {
		for _, field := range []string{"CapPrm:", "CapEff:", "CapAmb:"} {
			if v, ok := strings.CutPrefix(line, field); ok && strings.Trim(strings.TrimSpace(v), "0") != "" {
				return fmt.Errorf("capabilities left: %s", line)
			}
		}
		if v, ok := strings.CutPrefix(line, "NoNewPrivs:"); ok && strings.TrimSpace(v) != "1" {
			return errors.New("no_new_privs did not take")
		}
	}
	return nil
}

// stayBoundToEdge makes the init die with edge. The kernel clears the
// parent-death signal edge set when the init's user changes, so it is set
// again; edge dying in between is seen on the report pipe, whose reading
// end only edge holds.
func stayBoundToEdge(reports int) error {
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("setting the parent-death signal: %w", err)
	}
	fds := []unix.PollFd{{Fd: int32(reports)}}
	if n, err := unix.Poll(fds, 0); err == nil && n > 0 && fds[0].Revents&unix.POLLERR != 0 {
		return errors.New("edge is gone")
	}
	return nil
}
