package audit

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/runfleet/runfleet/shared/egress"
)

// metrics are the proxy's Prometheus series, labelled by action (or alert
// kind) only, so their cardinality stays fixed whatever tasks and hosts
// come and go.
type metrics struct {
	decisions *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	upstream  prometheus.Histogram
	bytes     *prometheus.CounterVec
	alerts    *prometheus.CounterVec

	// Resolved once, so a decision costs no label lookup: by action (in
	// the order of actions), and the byte counters.
	byAction          [len(actions)]atomic.Pointer[actionMetrics]
	bytesIn, bytesOut prometheus.Counter
	// byAlert is alerts' series, by kind (in the order of alertKinds).
	byAlert [len(alertKinds)]prometheus.Counter
}

// alertKinds are the alert kinds the proxy raises (Entry.Alert); each
// series exists from the start at zero, so an alerting rule sees the
// first alert as an increase.
var alertKinds = [...]string{egress.AlertForeignPlaceholder, egress.AlertUngrantedDomain, egress.AlertRealValue}

// actions are the known actions; others are counted too, looked up each time.
var actions = [...]Action{Substituted, Forwarded, Blocked, Withheld, Tunnelled, Denied}

type actionMetrics struct {
	decisions prometheus.Counter
	duration  prometheus.Observer
}

func newMetrics() *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edge_proxy_decisions_total",
			Help: "Secrets proxy decisions, by action (substituted, forwarded, blocked, withheld, tunnelled, denied).",
		}, []string{"action"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "edge_proxy_request_duration_seconds",
			Help:    "Time from a request's (or tunnel's) start to its end, by action.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"action"}),
		upstream: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "edge_proxy_upstream_duration_seconds",
			Help:    "Time waiting for an upstream's response head.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edge_proxy_bytes_total",
			Help: "Bytes through the proxy: in = from tasks, out = to tasks.",
		}, []string{"direction"}),
		alerts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edge_egress_alerts_total",
			Help: "Decisions that show a key escaping its bounds, by kind: foreign_placeholder (another run's placeholder), ungranted_domain (a run's placeholder toward a domain its key does not reach), real_value_from_task (a real value sent by a task, blocked).",
		}, []string{"kind"}),
	}
	m.bytesIn, m.bytesOut = m.bytes.WithLabelValues("in"), m.bytes.WithLabelValues("out")
	for i, k := range alertKinds {
		m.byAlert[i] = m.alerts.WithLabelValues(k)
	}
	return m
}

// register registers the metrics with reg (none when nil) as one
// collector whose scrape first has l take in what it has recorded
// (Log.Flush), so that a scrape counts every decision recorded before it
// although decisions are counted by the flush, off the request's path.
func (m *metrics) register(reg prometheus.Registerer, l *Log) error {
	if reg == nil {
		return nil
	}
	err := reg.Register(scrape{l, []prometheus.Collector{m.decisions, m.duration, m.upstream, m.bytes, m.alerts}})
	var already prometheus.AlreadyRegisteredError
	if err != nil && !errors.As(err, &already) {
		return fmt.Errorf("audit: registering metrics: %w", err)
	}
	return nil
}

// scrape collects the metrics once l has counted what it recorded.
type scrape struct {
	l  *Log
	cs []prometheus.Collector
}

func (s scrape) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range s.cs {
		c.Describe(ch)
	}
}

func (s scrape) Collect(ch chan<- prometheus.Metric) {
	s.l.Flush()
	for _, c := range s.cs {
		c.Collect(ch)
	}
}

// observeBatch counts a batch of decisions: a counter is added to once per
// batch, and each decision's durations go to the histograms. The flush
// calls it, on one goroutine, so the series' atomics are not contended by
// every request's goroutine as they were when each request counted its
// own (issue 27's profile at 64 connections).
func (m *metrics) observeBatch(batch []Entry) {
	var counts [len(actions)]int
	var alerts [len(alertKinds)]int
	var in, out int64
	for i := range batch {
		e := &batch[i]
		if e.ledgerOnly {
			continue
		}
		j := slices.Index(actions[:], e.Action)
		am := m.forAction(e.Action)
		if j >= 0 {
			counts[j]++
		} else {
			am.decisions.Inc()
		}
		am.duration.Observe(e.Duration.Seconds())
		if e.Upstream > 0 {
			m.upstream.Observe(e.Upstream.Seconds())
		}
		in += e.BytesIn
		out += e.BytesOut
		if e.Alert != "" {
			if k := slices.Index(alertKinds[:], e.Alert); k >= 0 {
				alerts[k]++
			} else {
				m.alerts.WithLabelValues(e.Alert).Inc()
			}
		}
	}
	for k, n := range alerts {
		if n > 0 {
			m.byAlert[k].Add(float64(n))
		}
	}
	for j, n := range counts {
		if n > 0 {
			m.forAction(actions[j]).decisions.Add(float64(n))
		}
	}
	if in != 0 {
		m.bytesIn.Add(float64(in))
	}
	if out != 0 {
		m.bytesOut.Add(float64(out))
	}
}

// forAction returns an action's series, resolved on its first use (so no
// series appears before its first decision).
func (m *metrics) forAction(a Action) *actionMetrics {
	i := slices.Index(actions[:], a)
	if i >= 0 {
		if am := m.byAction[i].Load(); am != nil {
			return am
		}
	}
	am := &actionMetrics{m.decisions.WithLabelValues(string(a)), m.duration.WithLabelValues(string(a))}
	if i >= 0 {
		// A racing store resolves the same series.
		m.byAction[i].Store(am)
	}
	return am
}
