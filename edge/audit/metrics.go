package audit

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the proxy's Prometheus series, labelled by action only, so
// their cardinality stays fixed whatever tasks and hosts come and go.
type metrics struct {
	decisions *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	upstream  prometheus.Histogram
	bytes     *prometheus.CounterVec
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

func (m *metrics) observe(e Entry) {
	a := string(e.Action)
	m.decisions.WithLabelValues(a).Inc()
	m.duration.WithLabelValues(a).Observe(e.Duration.Seconds())
	if e.Upstream > 0 {
		m.upstream.Observe(e.Upstream.Seconds())
	}
	m.bytes.WithLabelValues("in").Add(float64(e.BytesIn))
	m.bytes.WithLabelValues("out").Add(float64(e.BytesOut))
}
