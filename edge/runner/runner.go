// Package runner owns the harness runner: it admits each attempt of a run
// (admission, behind the secrets broker for a run that declares secrets),
// starts the agent's process in a pseudo-terminal as an unprivileged user in
// its own working dir and process group with an env built from scratch (in
// a sandbox and a network of its own whose one way out is edge, where edge
// can: package sandbox), turns its output into events, and cancels,
// retries, limits, drains and purges runs. What it keeps lives in a
// runlog.Log.
//
// Its API is its own (Spec, Run); the host API maps the host protocol to
// it. The events it records are served to Fleet as stored, so their data is
// written in the protocol's shapes (hostproto.StateChange, LimitReached) with
// the protocol's statuses, reasons and event types: that vocabulary is the
// protocol itself, and the one part of hostproto the runner uses.
package runner

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runfleet/runfleet/edge/cgroups"
	"github.com/runfleet/runfleet/edge/internal/throttle"
	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/edge/sandbox"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// GroupRange is where the runner takes each run's own group id from. The ids
// need no /etc/group entry; they must not belong to any real group.
type GroupRange struct {
	First uint32
	Count uint32
}

// Defaults of Config.
const (
	DefaultUser           = "nobody"
	DefaultEgress         = TaskEgressConfined
	DefaultMaxConcurrent  = 8
	DefaultMaxDuration    = 2 * time.Hour
	DefaultMaxOutputBytes = 64 << 20
	DefaultCancelGrace    = 10 * time.Second
	DefaultRetention      = 168 * time.Hour
	DefaultTaskInit       = "/proc/self/exe"
	// DefaultTaskGroupFirst starts a range far above the ids distributions
	// and container tools hand out (subordinate ids end well below 2^30).
	DefaultTaskGroupFirst = 0x70000000
	DefaultTaskGroupCount = 1 << 24
	// DefaultEventPage and MaxEventPage bound an events page.
	DefaultEventPage = 100
	MaxEventPage     = 1000
)

// Task egress modes (Config.Egress, runner.egress): where a task's own
// sockets may go.
const (
	// TaskEgressConfined: each task has a network of its own whose one way
	// off its loopback is edge (its DNS, its redirected connections, its
	// explicit proxy). Needs root and nftables. The default.
	TaskEgressConfined = "confined"
	// TaskEgressInsecureOpen: tasks reach the network directly, the cloud
	// metadata service (and an instance role's credentials) included.
	TaskEgressInsecureOpen = "insecureOpen"
)

// Storage reserve bounds (Config.MinFreeBytes, runner.minFreeBytes).
const (
	// DefaultMinFreeBytes: what the runs a host admits at its defaults can
	// write into the run log, twice over: DefaultMaxConcurrent (8) runs at
	// DefaultMaxOutputBytes (64 MiB) of output each is 512 MiB, and the run
	// log (bbolt: copy-on-write pages, JSON-escaped events) takes up to
	// about twice what it stores. Buildkite's elastic stack refuses jobs
	// under 5 GB free, for builds and images; our tasks' work dirs are
	// shallow clones, so this is a floor to raise for heavy repositories.
	DefaultMinFreeBytes = 1 << 30
	// MinMinFreeBytes: a smaller reserve cannot hold the space kept for
	// recording runs' ends (a part of the reserve: endReserveBytes).
	MinMinFreeBytes = 1 << 20
)

// DefaultDrainTimeout is how long Shutdown waits for idle before it cancels
// what still runs, unless runner.drainTimeout says otherwise. Shutdown takes
// the wait as its argument (zero cancels at once), so Config has no field
// for it: edge/config fills runner.drainTimeout with this.
const DefaultDrainTimeout = 5 * time.Minute

// Agent is one entry of the agent table: how to start an agent.
type Agent struct {
	// Argv starts the agent; an element "{prompt}" becomes the prompt, as
	// one argument. Required.
	Argv []string
	// Env adds fixed variables to the task's env; nil adds none.
	Env map[string]string
}

// Limits bound each task attempt's resources through a control group of
// its own (runner.limits).
type Limits struct {
	// None makes no control groups: tasks are bounded only by the host
	// (runner.limits "none"). Off by default.
	None bool
	// MemoryBytes per task; zero sets no memory limit.
	MemoryBytes int64
	// Pids: processes and threads per task at once; zero sets no limit.
	Pids int64
	// CPU per task, in cores; zero sets no limit.
	CPU float64
}

// LimitsNone is how runner.limits is written to set Limits.None.
const LimitsNone = "none"

// Each task's limits unless runner.limits says otherwise: edge.json's
// defaults (edge/config fills them), not Config's, whose zero Limits sets
// none. Sized like a hosted CI runner's share (GitHub's Linux runners have
// 4 cores): room for a build, while DefaultMaxConcurrent of them cannot
// take a host down. Operators size them to their hosts.
const (
	DefaultLimitMemoryBytes = 4 << 30
	DefaultLimitPids        = 4096
	DefaultLimitCPU         = 4
)

// Config configures a Runner. New fills zero values with the defaults named.
type Config struct {
	// Agents is the agent table; a run names one. Empty: no run can start.
	Agents map[string]Agent
	// User runs tasks; default DefaultUser. Never edge's own uid.
	User string
	// InsecureSameUser lets tasks run as edge itself where edge cannot switch
	// users (it is not root). Ignored where edge can switch. Off by default.
	InsecureSameUser bool
	// Egress is runner.egress: TaskEgressConfined (DefaultEgress: New
	// installs the Confiner, and fails where it cannot) or
	// TaskEgressInsecureOpen.
	Egress string
	// Confiner confines tasks' egress; default sandbox.NFTables with a
	// table named for WorkDir. Shutdown removes it.
	Confiner EgressConfiner
	// NFT is the nft executable that sets up each task's network (and the
	// default Confiner); default sandbox.DefaultNFT.
	NFT string
	// Roots are the directories a localPath must lie under; empty: no localPath.
	Roots []string
	// WorkDir holds each run's directories. Required. It is made 0711 (enter,
	// not list), so it may lie in a data dir that tasks otherwise cannot read.
	WorkDir string
	// MaxConcurrent attempts starting or running at once; default
	// DefaultMaxConcurrent.
	MaxConcurrent int
	// MaxDuration of an attempt's process (timed_out); default
	// DefaultMaxDuration.
	MaxDuration time.Duration
	// MaxOutputBytes of an attempt's output (output_limit); default
	// DefaultMaxOutputBytes.
	MaxOutputBytes int64
	// CancelGrace between SIGTERM and SIGKILL; default DefaultCancelGrace.
	CancelGrace time.Duration
	// Retention: a run is purged this long after it ends; default
	// DefaultRetention.
	Retention time.Duration
	// MinFreeBytes is the reserve of free space where runs are recorded
	// (runner.minFreeBytes): under it admission refuses host_storage_low,
	// and under the part of it kept for ends a run's output stops being
	// recorded and the run ends storage_full (see storage.go). Default
	// DefaultMinFreeBytes; negative is invalid.
	MinFreeBytes int64
	// Limits bound each task's resources through a control group of its
	// own per attempt (runner.limits): a zero field sets no such limit;
	// None makes no groups. Where groups cannot be made, and None is not
	// set, the runner refuses every run.
	Limits Limits
	// Disk reads that free space; default StatFS of the run log's
	// directory and WorkDir (output is then weighed against the run log's
	// filesystem alone).
	Disk Disk
	// SystemRootsFile is the PEM file of system roots that starts each trust
	// file; default the first of the distributions' usual paths that exists.
	SystemRootsFile string
	// TaskGroups is the range of per-run group ids; default
	// DefaultTaskGroupFirst and DefaultTaskGroupCount.
	TaskGroups GroupRange
	// TaskInit is the executable started as each task's init where edge
	// can switch users (package sandbox): a binary that hands control to
	// sandbox.Main when its first argument is sandbox.InitArg. Default
	// DefaultTaskInit, the binary running the runner: edge dispatches it,
	// and so must any other program (or test binary) that runs tasks.
	TaskInit string

	// Clock; default the real clock.
	Clock clock.Clock
	// Rand makes run ids; default crypto/rand.
	Rand io.Reader
	// Logger; default discards.
	Logger *slog.Logger

	// AttemptEnded, when set, is called with the run id once for each
	// attempt's end, on the goroutine ending it, after the attempt's proxy
	// access is revoked and its slot given back and before its end is
	// recorded, so whoever sees the run ended sees what it did (edge seals
	// the run's egress ledger there); and, from New, for each attempt a
	// crash left live, before it is marked host_restarted. It may block
	// while it writes (an audit flush, a run log transaction).
	AttemptEnded func(runID string)

	// BeforeExec, when set, is called with the run id on the attempt's start
	// goroutine after admission has issued the ticket and the process is
	// fully prepared (work dir, env, trust file), just before the ticket's
	// final check and the exec. It may cancel the run or drain the host (the
	// check then refuses and no process starts); it must not block on the
	// attempt's own start. Tests use it to land a race in that window.
	BeforeExec func(runID string)
}

func (c *Config) defaults() {
	if c.User == "" {
		c.User = DefaultUser
	}
	if c.Egress == "" {
		c.Egress = DefaultEgress
	}
	if c.TaskInit == "" {
		c.TaskInit = DefaultTaskInit
	}
	if c.NFT == "" {
		c.NFT = sandbox.DefaultNFT
	}
	if c.Confiner == nil {
		c.Confiner = sandbox.NFTables{Table: egressTable(c.WorkDir), NFT: c.NFT}
	}
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = DefaultMaxConcurrent
	}
	if c.MaxDuration == 0 {
		c.MaxDuration = DefaultMaxDuration
	}
	if c.MaxOutputBytes == 0 {
		c.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if c.CancelGrace == 0 {
		c.CancelGrace = DefaultCancelGrace
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.MinFreeBytes == 0 {
		c.MinFreeBytes = DefaultMinFreeBytes
	}
	if c.TaskGroups == (GroupRange{}) {
		c.TaskGroups = GroupRange{First: DefaultTaskGroupFirst, Count: DefaultTaskGroupCount}
	}
	if c.SystemRootsFile == "" {
		for _, p := range sandbox.TrustStoreFiles {
			if _, err := os.Stat(p); err == nil {
				c.SystemRootsFile = p
				break
			}
		}
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate checks a defaulted Config, naming the field at fault.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("runner: %s: %s", field, fmt.Sprintf(format, args...)))
	}
	if c.Egress != TaskEgressConfined && c.Egress != TaskEgressInsecureOpen {
		bad("Egress", "must be %q or %q, not %q", TaskEgressConfined, TaskEgressInsecureOpen, c.Egress)
	}
	if !filepath.IsAbs(c.TaskInit) {
		bad("TaskInit", "must be an absolute path, not %q", c.TaskInit)
	}
	if c.WorkDir == "" || !filepath.IsAbs(c.WorkDir) {
		bad("WorkDir", "must be an absolute path, not %q", c.WorkDir)
	}
	for name, a := range c.Agents {
		if len(a.Argv) == 0 {
			bad("Agents", "agent %q has no argv", name)
		}
	}
	if c.MaxConcurrent < 0 || c.MaxOutputBytes < 0 || c.MaxDuration < 0 || c.CancelGrace < 0 || c.Retention < 0 || c.MinFreeBytes < 0 {
		bad("limits", "must not be negative")
	}
	if c.SystemRootsFile == "" {
		bad("SystemRootsFile", "no system roots file found; set one")
	}
	if c.TaskGroups.Count == 0 || uint64(c.TaskGroups.First)+uint64(c.TaskGroups.Count) > 1<<32-1 {
		bad("TaskGroups", "range %d+%d is empty or past the largest group id", c.TaskGroups.First, c.TaskGroups.Count)
	}
	return errors.Join(errs...)
}

// Runner runs tasks. It is safe for concurrent use.
type Runner struct {
	cfg    Config
	log    *runlog.Log
	broker Broker
	trust  TrustSource
	logger *slog.Logger
	clock  clock.Clock
	// logs rate-limits lines about conditions that repeat (throttle).
	logs *throttle.Log
	// ballast holds space for recording runs' ends (storage.go).
	ballast *ballast
	// logDisk is the free space of the run log's filesystem alone (where
	// cfg.Disk was not given): whether output can be recorded depends on
	// it, not on the work dirs', which tasks fill with files of their own.
	logDisk Disk

	// cgroups is where tasks' control groups are made; nil where limits
	// are "none" or cannot be enforced (limitsErr says why: every run is
	// then refused).
	cgroups   *cgroups.Hierarchy
	limitsErr error

	ident          taskIdentity
	sameUser       bool
	identityErr    error
	egressConfined atomic.Bool // read by /healthz while Shutdown lifts it
	systemRoots    []byte
	metrics        *metrics

	mu       sync.Mutex
	live     map[string]*task // live attempts: being admitted, starting or running
	slots    int              // concurrency slots held (runner.maxConcurrent)
	draining bool
	closed   bool

	purgeTimer clock.Timer
	wg         sync.WaitGroup

	// beforePurgeRemoves, set by tests before the purge runs, is called on
	// the purge's goroutine once it has decided to remove a run, before it
	// removes anything.
	beforePurgeRemoves func(runID string)
	// afterEndRecorded, set by tests before a run starts, is called on the
	// ending attempt's goroutine once its end is recorded, while the task
	// is still in the live set.
	afterEndRecorded func(runID string)
}

// New returns a runner over the run log. broker and trust serve runs that
// declare secrets; with either nil such runs are refused broker_not_ready.
// New confines tasks' egress (runner.egress), or fails where it cannot;
// it marks runs a crash left live as failed (host_restarted) and purges
// runs past retention.
func New(cfg Config, runs *runlog.Log, broker Broker, trust TrustSource) (_ *Runner, err error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	roots, err := os.ReadFile(cfg.SystemRootsFile)
	if err != nil {
		return nil, fmt.Errorf("runner: reading the system roots: %w", err)
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o711); err != nil {
		return nil, fmt.Errorf("runner: creating the work dir: %w", err)
	}
	if err := os.Chmod(cfg.WorkDir, 0o711); err != nil {
		return nil, fmt.Errorf("runner: setting the work dir's mode: %w", err)
	}
	// Every path of a task's derives from it: without links, a sandbox
	// can bind them back in place (see sandbox.Spec.Keep).
	if cfg.WorkDir, err = filepath.EvalSymlinks(cfg.WorkDir); err != nil {
		return nil, fmt.Errorf("runner: resolving the work dir: %w", err)
	}
	r := &Runner{
		cfg:         cfg,
		log:         runs,
		broker:      broker,
		trust:       trust,
		logger:      cfg.Logger,
		clock:       cfg.Clock,
		systemRoots: roots,
		live:        map[string]*task{},
		logs:        throttle.New(cfg.Logger, cfg.Clock, logInterval),
	}
	r.logDisk = r.cfg.Disk
	if r.cfg.Disk == nil {
		r.cfg.Disk = StatFS{Paths: []string{filepath.Dir(runs.Path()), cfg.WorkDir}}
		r.logDisk = StatFS{Paths: []string{filepath.Dir(runs.Path())}}
	}
	r.ballast = &ballast{path: filepath.Join(filepath.Dir(runs.Path()), ballastName), size: ballastBytes(cfg.MinFreeBytes)}
	// A ballast a previous edge left is taken up again (its blocks are
	// allocated already, so this needs no space); else one is made where
	// there is room.
	if _, err := os.Stat(r.ballast.path); err == nil {
		if err := r.ballast.fill(); err != nil {
			r.logs.Error(condBallast, "taking up the storage ballast", fieldError, err.Error())
		}
	}
	r.freeBytes()
	r.ident, r.sameUser, r.identityErr = resolveIdentity(cfg)
	if r.identityErr != nil {
		r.logger.Warn("runner refuses every run", "error", r.identityErr.Error())
	}
	r.openLimits()
	defer func() {
		// A runner that does not start leaves no control group behind.
		if err != nil && r.cgroups != nil {
			r.cgroups.Close()
		}
	}()
	if err := r.confineEgress(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			r.liftEgress()
		}
	}()
	r.metrics = newMetrics(r)
	if err := r.recover(); err != nil {
		return nil, err
	}
	r.purge()
	r.schedulePurge()
	return r, nil
}

// Agents lists the agent table's names, sorted.
func (r *Runner) Agents() []string {
	names := make([]string, 0, len(r.cfg.Agents))
	for n := range r.cfg.Agents {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// InsecureSameUser reports whether tasks run as edge's own user.
func (r *Runner) InsecureSameUser() bool { return r.sameUser }

// EgressConfined reports whether each task runs in a network of its own
// (runner.egress confined, in force).
func (r *Runner) EgressConfined() bool { return r.egressConfined.Load() }

// Usable returns nil when the runner can run tasks: as runner.user, or as
// edge itself where runner.insecureSameUser allows it, each in a control
// group with runner.limits unless they are "none"; else why not (every run
// is then refused host_unavailable).
func (r *Runner) Usable() error {
	if r.identityErr != nil {
		return r.identityErr
	}
	return r.limitsErr
}

// Draining reports whether the host admits nothing new.
func (r *Runner) Draining() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.draining || r.closed
}

// Drain stops admitting: new starts and retries are refused, and an attempt
// admitted but not yet started is refused at its ticket's check.
func (r *Runner) Drain() {
	r.mu.Lock()
	r.draining = true
	r.mu.Unlock()
}

// Resume admits again after Drain. Once Shutdown has begun the runner stays
// draining whatever Resume does (Draining reports it so).
func (r *Runner) Resume() {
	r.mu.Lock()
	r.draining = false
	r.mu.Unlock()
}

// Load reports the attempts starting or running, each holding a slot, and
// runner.maxConcurrent: what admission compares for host_busy, at one
// moment.
func (r *Runner) Load() (active, maxConcurrent int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.slots, r.cfg.MaxConcurrent
}

// Idle reports whether no attempt is starting or running.
func (r *Runner) Idle() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.live) == 0
}

// Start starts a run, idempotently on req.ClientToken: a known token returns
// its run with Reused set, whatever else the request says. A start arriving
// after req.Deadline is refused (*Refusal deadline_passed) and stored
// nowhere; a draining host refuses with ErrDraining. Otherwise the run is
// stored and admitted at once: the answer carries admission's refusal as the
// run's state, or status admitted while its process starts in the background.
func (r *Runner) Start(req Spec) (Run, error) {
	declared, err := r.validateStart(req)
	if err != nil {
		return Run{}, err
	}
	if rec, found, err := r.log.ByClientToken(req.ClientToken); err != nil {
		return Run{}, err
	} else if found {
		// A known token answers its run, whatever the values this start
		// carries: they never replace the run's (PUT /runs/{id}/credentials
		// does).
		run := r.view(rec)
		run.Reused = true
		return run, nil
	}
	now := r.clock.Now()
	if req.Deadline != nil && now.After(*req.Deadline) {
		return Run{}, refuse(hostproto.ReasonDeadlinePassed, "the start arrived %s after its deadline", now.Sub(*req.Deadline).Round(time.Millisecond))
	}
	if r.Draining() {
		return Run{}, ErrDraining
	}
	id, err := r.newRunID()
	if err != nil {
		return Run{}, err
	}
	rec := runlog.Record{
		RunID: id, ClientToken: req.ClientToken, Status: hostproto.StatusPending, Attempt: 1,
		Request: req.stored(), CreatedAt: now, UpdatedAt: now,
	}
	// The attempt is live before the record exists, so a stored run is never
	// pending without a live attempt behind it.
	t, err := r.reserve(rec)
	if err != nil {
		return Run{}, err
	}
	t.declared = declared
	t.credentials, t.credentialsComplete = req.Credentials, true
	rec, created, err := r.log.Create(rec, queuedEntries(now, req.Queued)...)
	if err != nil || !created {
		r.unreserve(t)
		if err != nil {
			return Run{}, err
		}
		// The run that won keeps its own values: a reused start's are
		// dropped here.
		run := r.view(rec)
		run.Reused = true
		return run, nil
	}
	t.rec = rec
	t.markRecorded(true)
	r.logger.Info("run created", fieldRun, id, fieldAgent, req.Agent, fieldSecrets, len(req.Secrets))
	return r.begin(t), nil
}

// queuedEntries is a start's first event when the run waited in Fleet's
// queue (none when it did not), created with the run so that it is the
// run's event 1 and a reused start adds nothing.
func queuedEntries(ts time.Time, q *hostproto.Queued) []runlog.Entry {
	if q == nil {
		return nil
	}
	data, _ := json.Marshal(q)
	return []runlog.Entry{{Type: hostproto.EventQueued, Data: data, TS: ts}}
}

// Retry starts a new attempt of a run whose last attempt ended, on the same
// event sequence. A live attempt is ErrNotRetryable; a draining host
// ErrDraining.
func (r *Runner) Retry(runID string) (Run, error) {
	rec, err := r.get(runID)
	if err != nil {
		return Run{}, err
	}
	if r.Draining() {
		return Run{}, ErrDraining
	}
	next := rec
	next.Attempt++
	t, err := r.reserve(next)
	if err != nil {
		return Run{}, err
	}
	// A record stored before the run request's rules tightened may hold
	// what Start now refuses: admission refuses it (key_not_granted).
	t.declared, t.declareErr = t.spec.Declare()
	now := r.clock.Now()
	rec, err = r.log.Update(runID, func(rec *runlog.Record) error {
		// Another retry may have begun, and even ended, between the read
		// above and the reservation: this one lost to it.
		if !hostproto.TerminalStatus(rec.Status) || rec.Attempt != t.attempt-1 {
			return ErrNotRetryable
		}
		rec.Attempt = t.attempt
		rec.Status, rec.ExitCode, rec.Reason, rec.Detail, rec.EndedAt = hostproto.StatusPending, nil, "", "", nil
		rec.UpdatedAt = now
		return nil
	})
	if err != nil {
		r.unreserve(t)
		if errors.Is(err, runlog.ErrNotFound) {
			err = ErrNotFound // purged since it was read
		}
		return Run{}, err
	}
	t.rec = rec
	t.markRecorded(true)
	r.logger.Info("run retried", fieldRun, runID, fieldAttempt, rec.Attempt)
	return r.begin(t), nil
}

// Get returns the run, or ErrNotFound.
func (r *Runner) Get(runID string) (Run, error) {
	rec, err := r.get(runID)
	if err != nil {
		return Run{}, err
	}
	return r.view(rec), nil
}

// FindByClientToken returns the runs started with token: none or one.
func (r *Runner) FindByClientToken(token string) ([]Run, error) {
	rec, found, err := r.log.ByClientToken(token)
	if err != nil || !found {
		return []Run{}, err
	}
	return []Run{r.view(rec)}, nil
}

// Events returns up to limit events after the cursor (limit 0: the default
// page; above MaxEventPage: MaxEventPage).
func (r *Runner) Events(runID string, after int64, limit int) (runlog.Page, error) {
	if limit <= 0 {
		limit = DefaultEventPage
	}
	limit = min(limit, MaxEventPage)
	page, err := r.log.Page(runID, after, limit)
	if errors.Is(err, runlog.ErrNotFound) {
		return page, ErrNotFound
	}
	return page, err
}

// Input writes input to the running process's terminal: a JSON string as its
// text, any other JSON value as its JSON, then a newline; it is recorded as
// an input event. A run without a running process is ErrNotRunning.
func (r *Runner) Input(runID string, input json.RawMessage) (Run, error) {
	rec, err := r.get(runID)
	if err != nil {
		return Run{}, err
	}
	text, err := inputText(input)
	if err != nil {
		return Run{}, err
	}
	t := r.liveTask(runID)
	if t == nil {
		return Run{}, ErrNotRunning
	}
	if err := t.writeInput(r, text); err != nil {
		return Run{}, err
	}
	return r.view(rec), nil
}

// Cancel cancels the run's live attempt: no process starts if none has yet;
// a running one gets SIGTERM to its process group and SIGKILL after the
// grace. Its proxy access is revoked at once. A run without a live attempt is
// ErrNotRunning.
func (r *Runner) Cancel(runID string) (Run, error) {
	if _, err := r.get(runID); err != nil {
		return Run{}, err
	}
	t := r.liveTask(runID)
	if t == nil {
		return Run{}, ErrNotRunning
	}
	// A retry's attempt is live a moment before its record names it (one
	// write): until then the run as stored is the ended attempt, which no
	// cancel may be answered with.
	<-t.recorded
	if !t.recordedOK || r.cancel(t, hostproto.ReasonCanceled) {
		return Run{}, ErrNotRunning
	}
	return r.Get(runID)
}

// WaitForStart resolves once the run's current attempt has started its
// process, and returns the refusal (*Refusal) or failure when it ends
// without one; ctx bounds the wait.
func (r *Runner) WaitForStart(ctx context.Context, runID string) error {
	if t := r.liveTask(runID); t != nil {
		select {
		case <-t.startDone:
			return t.startErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	rec, err := r.get(runID)
	if err != nil {
		return err
	}
	switch {
	case rec.Status == hostproto.StatusRunning || rec.ExitCode != nil:
		return nil
	case isRefusalReason(rec.Reason) || rec.Reason == hostproto.ReasonHostShutdown:
		return &Refusal{Reason: rec.Reason, Detail: rec.Detail}
	}
	return fmt.Errorf("runner: run %s ended without starting (%s)", runID, rec.Status)
}

// Shutdown drains the runner: it admits nothing, waits until idle or until
// drainTimeout passes, then cancels what still runs (host_shutdown) and
// waits for those attempts to end (each within the cancel grace). It stops
// the purge. ctx bounds the whole wait.
func (r *Runner) Shutdown(ctx context.Context, drainTimeout time.Duration) error {
	r.Drain()
	r.mu.Lock()
	r.closed = true
	if r.purgeTimer != nil {
		r.purgeTimer.Stop()
	}
	r.mu.Unlock()
	if !r.waitIdle(ctx, drainTimeout) {
		for _, t := range r.liveTasks() {
			r.logger.Info("run canceled by shutdown", fieldRun, t.runID)
			r.cancel(t, hostproto.ReasonHostShutdown)
		}
	}
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
		// No task is left to confine or bound.
		var err error
		if r.cgroups != nil {
			err = r.cgroups.Close()
		}
		return errors.Join(r.liftEgress(), err)
	case <-ctx.Done():
		return fmt.Errorf("runner: shutdown: %w", ctx.Err())
	}
}

// waitIdle waits until no attempt is live, up to d on the runner's clock.
func (r *Runner) waitIdle(ctx context.Context, d time.Duration) bool {
	timer := r.clock.NewTimer(d)
	defer timer.Stop()
	for {
		tasks := r.liveTasks()
		if len(tasks) == 0 {
			return true
		}
		select {
		case <-tasks[0].done:
		case <-timer.C():
			return len(r.liveTasks()) == 0
		case <-ctx.Done():
			return false
		}
	}
}

func (r *Runner) get(runID string) (runlog.Record, error) {
	rec, err := r.log.Get(runID)
	if errors.Is(err, runlog.ErrNotFound) {
		return rec, ErrNotFound
	}
	return rec, err
}

// liveTask is the run's live attempt, or nil; a run being purged has none.
func (r *Runner) liveTask(runID string) *task {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t := r.live[runID]; t != nil && !t.purging {
		return t
	}
	return nil
}

func (r *Runner) liveTasks() []*task {
	r.mu.Lock()
	defer r.mu.Unlock()
	tasks := make([]*task, 0, len(r.live))
	for _, t := range r.live {
		tasks = append(tasks, t)
	}
	return tasks
}

func (r *Runner) newRunID() (string, error) {
	b := make([]byte, 12)
	if _, err := io.ReadFull(r.cfg.Rand, b); err != nil {
		return "", fmt.Errorf("runner: making a run id: %w", err)
	}
	return "run-" + hex.EncodeToString(b), nil
}

// inputText is what input writes to the terminal, before its newline.
func inputText(input json.RawMessage) (string, error) {
	if len(input) == 0 {
		return "null", nil
	}
	var s string
	if bytes.HasPrefix(bytes.TrimSpace(input), []byte(`"`)) && json.Unmarshal(input, &s) == nil {
		return s, nil
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, input); err != nil {
		return "", badRequest("input", "is not a JSON value")
	}
	return compact.String(), nil
}

// Log field names.
const (
	fieldRun     = "run"
	fieldAttempt = "attempt"
	fieldAgent   = "agent"
	fieldSecrets = "secrets"
	fieldKeys    = "keys"
	fieldReason  = "reason"
	fieldError   = "error"
	fieldStatus  = "status"
	fieldFree    = "freeBytes"
	fieldMinFree = "minFreeBytes"
)

// logInterval is how often a repeating condition is logged (throttle).
const logInterval = time.Minute
