package runner

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/runfleet/runfleet/edge/runlog"
)

// metrics are the runner's Prometheus collectors.
type metrics struct {
	admissions *prometheus.CounterVec
	started    prometheus.Counter
	tickets    prometheus.Gauge
	live       prometheus.GaugeFunc
	runs       *runsCollector
	// purgePasses counts purge passes that could list the runs, once the
	// next pass is scheduled (unless the runner is closing), so a reader
	// that sees it move knows the next hour's pass is armed, and a flat
	// line means the purge is not doing its work.
	purgePasses prometheus.Counter
	purged      prometheus.Counter
	// limitsReached counts the limit events said (once per attempt and
	// limit), freeBytes reads the data dir's free space at each scrape.
	limitsReached *prometheus.CounterVec
	freeBytes     prometheus.GaugeFunc
}

func newMetrics(r *Runner) *metrics {
	return &metrics{
		admissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edge_admissions_total",
			Help: "Admission decisions on attempts, by verdict (admit, refuse) and refusal reason.",
		}, []string{"verdict", "reason"}),
		started: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edge_task_processes_started_total",
			Help: "Task processes the runner started.",
		}),
		tickets: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edge_admission_tickets",
			Help: "Admitted attempts whose start has not ended yet.",
		}),
		live: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edge_tasks_live",
			Help: "Attempts holding a concurrency slot (admitted, starting or running).",
		}, func() float64 {
			r.mu.Lock()
			defer r.mu.Unlock()
			return float64(r.slots)
		}),
		purgePasses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edge_purge_passes_total",
			Help: "Passes of the purge of runs past runner.retention that could list the runs.",
		}),
		purged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edge_runs_purged_total",
			Help: "Runs removed (events, placeholders, directories) past runner.retention.",
		}),
		limitsReached: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edge_limits_reached_total",
			Help: "Attempts that reached a limit, by limit: memory (ended oom_killed), pids (forks refused), storage (output not recorded, ended storage_full).",
		}, []string{"limit"}),
		freeBytes: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edge_storage_free_bytes",
			Help: "Free space where runs are recorded (the data dir and runner.workDir, the least); under runner.minFreeBytes runs are refused host_storage_low.",
		}, func() float64 {
			free, err := r.cfg.Disk.FreeBytes()
			if err != nil {
				return 0
			}
			return float64(free)
		}),
		runs: &runsCollector{log: r.log, desc: prometheus.NewDesc("edge_runs", "Runs edge keeps, by status.", []string{"status"}, nil)},
	}
}

func (m *metrics) admission(d Decision) {
	switch d.Verdict {
	case Admit:
		m.admissions.WithLabelValues("admit", "").Inc()
	case Refuse:
		m.admissions.WithLabelValues("refuse", d.Reason).Inc()
	}
}

// Collectors are the runner's metrics, for the host's registry.
func (r *Runner) Collectors() []prometheus.Collector {
	return []prometheus.Collector{r.metrics.admissions, r.metrics.started, r.metrics.tickets, r.metrics.live, r.metrics.runs, r.metrics.purgePasses, r.metrics.purged,
		r.metrics.limitsReached, r.metrics.freeBytes}
}

// runsCollector counts the stored runs by status at each scrape, so the
// figure is right across restarts and purges.
type runsCollector struct {
	log  *runlog.Log
	desc *prometheus.Desc
}

func (c *runsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *runsCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[string]int{}
	if err := c.log.Records(func(rec runlog.Record) bool {
		counts[rec.Status]++
		return true
	}); err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for status, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), status)
	}
}
