// Package scheduled owns Fleet's scheduled work as Lambda handlers: the
// probe of every enabled host (with the fleet's capacity metrics) and the
// sweep of live runs, each within a time budget taken from its
// invocation's deadline. functions/probe and
// functions/sweep start them (EventBridge Scheduler); the local stack calls
// the very same handlers on timers.
package scheduled

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/emf"
	"github.com/runfleet/runfleet/shared/fleet"
)

// MetricSweepLagSeconds is the sweep's lag metric (namespace emf.Namespace,
// no dimensions): CloudWatch Logs extracts it from the EMF line the sweep
// writes once per invocation, and the alarm in template.yaml reads exactly
// this name.
const MetricSweepLagSeconds = "SweepLagSeconds"

// The probe's capacity metrics (namespace emf.Namespace), one EMF line per
// routing class and pass, dimension DimensionRoutingClass (the class,
// fleet.ClassOf's form): fleet.ClassCapacity's figures, which GET
// /fleet/capacity answers too. An autoscaler's policy reads them (README.md,
// section "Capacity and autoscaling").
const (
	MetricQueuedRuns              = "QueuedRuns"
	MetricOldestQueuedWaitSeconds = "OldestQueuedWaitSeconds"
	MetricFreeSlots               = "FreeSlots"
	MetricBusySlots               = "BusySlots"
	MetricDrainingHosts           = "DrainingHosts"
	MetricRoutableHosts           = "RoutableHosts"
	DimensionRoutingClass         = "RoutingClass"
)

// Defaults for Config's zero values.
const (
	// DefaultProbeMargin is kept free before the deadline for the last
	// probes' records. (A probe itself is not started unless it can end,
	// ProbeTimeout, before the budget does.)
	DefaultProbeMargin = 3 * time.Second
	// DefaultSweepMargin is kept free before the deadline: a run started
	// just before the budget ends may still need a host call and its
	// writes (the host timeout plus this margin).
	DefaultSweepMargin = 5 * time.Second
	// DefaultBudget applies when the context has no deadline.
	DefaultBudget = 50 * time.Second
)

// Log field names of the jobs' lines.
const (
	logProbed       = "probed"
	logWritten      = "written"
	logWakes        = "wakes"
	logClasses      = "classes"
	logStatus       = "status"
	logSkipped      = "skipped"
	logSkippedHosts = "skippedHosts"
	logReport       = "report"
	logBudget       = "budgetMs"
	logDuration     = "durationMs"
	logErr          = "err"
)

// Config configures the jobs.
type Config struct {
	// Fleet does the work. Required.
	Fleet *fleet.Fleet
	// Logger gets one line per job. Required.
	Logger *slog.Logger
	// Clock reads the time for the budgets; nil is the wall clock.
	Clock clock.Clock
	// ProbeMargin: see DefaultProbeMargin; zero is the default.
	ProbeMargin time.Duration
	// SweepMargin is added to the host timeout and kept free before the
	// deadline; zero is DefaultSweepMargin.
	SweepMargin time.Duration
	// DefaultBudget bounds a job whose context has no deadline; zero is
	// DefaultBudget.
	DefaultBudget time.Duration
	// Metrics receives the jobs' CloudWatch Embedded Metric Format lines
	// (the sweep's SweepLagSeconds, once per invocation; the probe's
	// capacity figures, a line per class and invocation): stdout in
	// Lambda, where CloudWatch Logs extracts them. Nil: none written.
	Metrics *emf.Writer
}

// Validate reports a missing required field.
func (c Config) Validate() error {
	var errs []error
	if c.Fleet == nil {
		errs = append(errs, errors.New("scheduled: Config.Fleet is required"))
	}
	if c.Logger == nil {
		errs = append(errs, errors.New("scheduled: Config.Logger is required"))
	}
	return errors.Join(errs...)
}

// Jobs are the scheduled handlers. Safe for concurrent use.
type Jobs struct {
	cfg   Config
	log   *slog.Logger
	clock clock.Clock
}

// New checks cfg, fills its defaults and returns the jobs.
func New(cfg Config) (*Jobs, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.ProbeMargin <= 0 {
		cfg.ProbeMargin = DefaultProbeMargin
	}
	if cfg.SweepMargin <= 0 {
		cfg.SweepMargin = DefaultSweepMargin
	}
	if cfg.DefaultBudget <= 0 {
		cfg.DefaultBudget = DefaultBudget
	}
	return &Jobs{cfg: cfg, log: cfg.Logger, clock: cfg.Clock}, nil
}

// ProbeSummary is the probe job's answer (and its log line).
type ProbeSummary struct {
	Probed int            `json:"probed"`
	Status map[string]int `json:"status"`
	// Written counts the probes recorded (the others changed nothing
	// material and their records are fresh enough).
	Written int      `json:"written"`
	Skipped []string `json:"skipped,omitempty"`
	// Wakes counts the hosts woken for waiting runs.
	Wakes int `json:"wakes"`
	// Classes counts the routing classes whose capacity was reported.
	Classes int `json:"classes"`
}

// Probe probes every enabled host within the invocation's budget, records
// the probes that changed (fleet.ProbeEnabled), and writes each routing
// class's capacity figures as one EMF line on Metrics. It fails only when
// the hosts cannot be listed or a probe cannot be recorded (the
// scheduler's retry then applies).
func (j *Jobs) Probe(ctx context.Context, _ events.EventBridgeEvent) (ProbeSummary, error) {
	begun := j.clock.Now()
	until := j.budget(ctx, j.cfg.ProbeMargin)
	rep, err := j.cfg.Fleet.ProbeEnabled(ctx, until)
	sum := ProbeSummary{Probed: len(rep.Probed), Status: map[string]int{}, Written: rep.Written,
		Skipped: rep.Skipped, Wakes: len(rep.Wakes), Classes: len(rep.Capacity)}
	for _, p := range rep.Probed {
		sum.Status[p.Probe.Status]++
	}
	j.writeCapacity(ctx, rep.Capacity)
	attrs := []any{logProbed, sum.Probed, logStatus, sum.Status, logWritten, sum.Written, logSkipped, len(sum.Skipped),
		logWakes, sum.Wakes, logClasses, sum.Classes,
		logBudget, until.Sub(begun).Milliseconds(), logDuration, j.clock.Now().Sub(begun).Milliseconds()}
	if err != nil {
		if ctx.Err() != nil {
			// Stopped from outside (the invocation's end, the local
			// stack's shutdown): not a fault; the next pass probes again.
			j.log.InfoContext(ctx, "scheduled probe stopped", append(attrs, logErr, err.Error())...)
			return sum, err
		}
		j.log.ErrorContext(ctx, "scheduled probe failed", append(attrs, logErr, err.Error())...)
		return sum, err
	}
	if len(sum.Skipped) > 0 {
		j.log.WarnContext(ctx, "scheduled probe ran out of budget", append(attrs, logSkippedHosts, sum.Skipped)...)
	} else {
		// A pass is routine: the hosts whose condition changed are logged
		// by the probe itself, at WARN or INFO.
		j.log.DebugContext(ctx, "scheduled probe", attrs...)
	}
	return sum, nil
}

// writeCapacity writes each class's figures as one EMF line: every
// figure every pass, zeros included, so that a policy's metric math
// never sees a gap while the class is reported.
func (j *Jobs) writeCapacity(ctx context.Context, classes []fleet.ClassCapacity) {
	if j.cfg.Metrics == nil {
		return
	}
	at := j.clock.Now()
	for _, c := range classes {
		dims := map[string]string{DimensionRoutingClass: c.Class}
		err := j.cfg.Metrics.Write(at,
			emf.Metric{Name: MetricQueuedRuns, Unit: emf.UnitCount, Value: float64(c.Queued), Dimensions: dims},
			emf.Metric{Name: MetricOldestQueuedWaitSeconds, Unit: emf.UnitSeconds, Value: float64(int64(c.OldestWait / time.Second)), Dimensions: dims},
			emf.Metric{Name: MetricFreeSlots, Unit: emf.UnitCount, Value: float64(c.FreeSlots), Dimensions: dims},
			emf.Metric{Name: MetricBusySlots, Unit: emf.UnitCount, Value: float64(c.BusySlots), Dimensions: dims},
			emf.Metric{Name: MetricDrainingHosts, Unit: emf.UnitCount, Value: float64(c.DrainingHosts), Dimensions: dims},
			emf.Metric{Name: MetricRoutableHosts, Unit: emf.UnitCount, Value: float64(c.Hosts), Dimensions: dims},
		)
		if err != nil {
			j.log.ErrorContext(ctx, "scheduled probe: writing the capacity metrics", logErr, err.Error())
			return
		}
	}
}

// Sweep sweeps the live runs within the invocation's budget: the deadline
// less the host timeout and SweepMargin. No host call starts past the
// budget and each is bounded by the host timeout, so the last one ends by
// the deadline less SweepMargin, which is left for the last writes. The
// sweep continues from the cursor the previous one left (fleet.Sweep). It
// writes the sweep lag once per invocation as an EMF line on Metrics
// whenever the cursor could be read (another sweep holding it included),
// and fails only when the cursor or the live index cannot be read.
func (j *Jobs) Sweep(ctx context.Context, _ events.EventBridgeEvent) (fleet.SweepReport, error) {
	begun := j.clock.Now()
	until := j.budget(ctx, j.cfg.Fleet.HostTimeout()+j.cfg.SweepMargin)
	rep, err := j.cfg.Fleet.Sweep(ctx, fleet.SweepOptions{Until: until})
	attrs := []any{logReport, rep, logBudget, until.Sub(begun).Milliseconds(),
		logDuration, j.clock.Now().Sub(begun).Milliseconds()}
	if rep.Lap > 0 && j.cfg.Metrics != nil {
		lag := emf.Metric{Name: MetricSweepLagSeconds, Unit: emf.UnitSeconds, Value: rep.LagSeconds}
		if merr := j.cfg.Metrics.Write(j.clock.Now(), lag); merr != nil {
			j.log.ErrorContext(ctx, "scheduled sweep: writing the lag metric", logErr, merr.Error())
		}
	}
	switch {
	case err != nil:
		j.log.ErrorContext(ctx, "scheduled sweep failed", append(attrs, logErr, err.Error())...)
		return rep, err
	case rep.Busy:
		j.log.InfoContext(ctx, "scheduled sweep: another sweep holds the cursor; nothing done", attrs...)
	case rep.BudgetExhausted:
		j.log.WarnContext(ctx, "scheduled sweep ran out of budget; the next sweep continues from the cursor", attrs...)
	case rep.Live == 0:
		// Nothing live: a quiet fleet's log stays quiet.
		j.log.DebugContext(ctx, "scheduled sweep", attrs...)
	default:
		j.log.InfoContext(ctx, "scheduled sweep", attrs...)
	}
	return rep, nil
}

// budget is when a job stops starting work: the context's deadline (the
// invocation's, on the wall clock) less margin, read on the job's clock.
// A deadline closer than the margin leaves no budget: the job starts
// nothing.
func (j *Jobs) budget(ctx context.Context, margin time.Duration) time.Time {
	now := j.clock.Now()
	deadline, ok := ctx.Deadline()
	if !ok {
		return now.Add(j.cfg.DefaultBudget)
	}
	return now.Add(max(time.Until(deadline)-margin, 0))
}
