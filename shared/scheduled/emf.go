package scheduled

import (
	"encoding/json"
	"io"
	"time"
)

// The sweep's lag metric: CloudWatch Logs extracts it from the EMF line the
// sweep writes once per invocation. The alarm in template.yaml reads
// exactly this namespace and name, with no dimensions.
const (
	MetricNamespace       = "Runfleet"
	MetricSweepLagSeconds = "SweepLagSeconds"
)

// emfMeta is the "_aws" member of an EMF document. A directive of one
// metric with "Dimensions": [[]], one empty dimension set, publishes the
// metric under its namespace and name alone.
type emfMeta struct {
	// Timestamp is epoch milliseconds.
	Timestamp         int64          `json:"Timestamp"`
	CloudWatchMetrics []emfDirective `json:"CloudWatchMetrics"`
}

type emfDirective struct {
	Namespace  string      `json:"Namespace"`
	Dimensions [][]string  `json:"Dimensions"`
	Metrics    []emfMetric `json:"Metrics"`
}

type emfMetric struct {
	Name string `json:"Name"`
	Unit string `json:"Unit"`
}

// writeEMF writes one metric as one EMF line on w: the whole line is the
// JSON document (CloudWatch Logs takes a log event as EMF only when its
// message is exactly one JSON object), which in Lambda is a line on
// stdout. The metric's value is the root member named as the metric.
func writeEMF(w io.Writer, at time.Time, name, unit string, value float64) error {
	doc, err := json.Marshal(map[string]any{
		"_aws": emfMeta{
			Timestamp: at.UnixMilli(),
			CloudWatchMetrics: []emfDirective{{
				Namespace: MetricNamespace, Dimensions: [][]string{{}}, Metrics: []emfMetric{{Name: name, Unit: unit}},
			}},
		},
		name: value,
	})
	if err != nil {
		return err
	}
	_, err = w.Write(append(doc, '\n'))
	return err
}
