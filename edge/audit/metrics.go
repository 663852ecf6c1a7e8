package audit

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the proxy's Prometheus series, labelled by action only, so
// their cardinality stays fixed whatever tasks and hosts come and go.
type metrics struct {
	decisions *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	upstream  prometheus.Histogram
	bytes     *prometheus.CounterVec

	// Resolved once, so a decision costs no label lookup: by action (in
	// the order of actions), and the byte counters.
	byAction          [len(actions)]atomic.Pointer[actionMetrics]
	bytesIn, bytesOut prometheus.Counter
}

// actions are the known actions; others are counted too, looked up each time.
var actions = [...]Action{Substituted, Forwarded, Blocked, Withheld, Tunnelled, Denied}

type actionMetrics struct {
	decisions prometheus.Counter
	duration  prometheus.Observer
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
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
	}
	m.bytesIn, m.bytesOut = m.bytes.WithLabelValues("in"), m.bytes.WithLabelValues("out")
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.decisions, m.duration, m.upstream, m.bytes} {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if errors.As(err, &already) {
				continue
			}
			return nil, fmt.Errorf("audit: registering metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) observe(e *Entry) {
	am := m.forAction(e.Action)
	am.decisions.Inc()
	am.duration.Observe(e.Duration.Seconds())
	if e.Upstream > 0 {
		m.upstream.Observe(e.Upstream.Seconds())
	}
	m.bytesIn.Add(float64(e.BytesIn))
	m.bytesOut.Add(float64(e.BytesOut))
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
