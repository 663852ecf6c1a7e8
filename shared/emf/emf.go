// Package emf writes Fleet's metrics as CloudWatch Embedded Metric Format
// lines: each metric one JSON document on one line of the function's
// stdout, which CloudWatch Logs turns into a metric of namespace Runfleet
// (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html).
// The sweep's lag and the broker's counts go through one Writer per
// process, so lines written by concurrent goroutines never interleave.
package emf

import (
	"encoding/json"
	"io"
	"slices"
	"sync"
	"time"
)

// Namespace is every runfleet metric's; template.yaml's alarms read it.
const Namespace = "Runfleet"

// Units Fleet's metrics use.
const (
	UnitCount   = "Count"
	UnitSeconds = "Seconds"
)

// Metric is one value of one metric. Dimensions name it further (each a
// dimension of the metric and a root member of the document); none: the
// metric is published under its namespace and name alone.
type Metric struct {
	Name       string
	Unit       string
	Value      float64
	Dimensions map[string]string
}

// Writer writes metrics as EMF lines on one io.Writer. A nil *Writer
// writes nothing (no metrics configured). Safe for concurrent use.
type Writer struct {
	mu sync.Mutex
	w  io.Writer
}

// New is a Writer of w; nil w is a nil Writer (nothing written).
func New(w io.Writer) *Writer {
	if w == nil {
		return nil
	}
	return &Writer{w: w}
}

// meta is the "_aws" member of an EMF document. A directive whose
// Dimensions is [[]], one empty dimension set, publishes the metric under
// its namespace and name alone.
type meta struct {
	// Timestamp is epoch milliseconds.
	Timestamp         int64       `json:"Timestamp"`
	CloudWatchMetrics []directive `json:"CloudWatchMetrics"`
}

type directive struct {
	Namespace  string     `json:"Namespace"`
	Dimensions [][]string `json:"Dimensions"`
	Metrics    []metric   `json:"Metrics"`
}

type metric struct {
	Name string `json:"Name"`
	Unit string `json:"Unit"`
}

// Write writes m, at at, as one line: the whole line is the JSON document
// (CloudWatch Logs takes a log event as EMF only when its message is
// exactly one JSON object). The value is the root member named as the
// metric, each dimension's value the root member named as the dimension.
func (w *Writer) Write(at time.Time, m Metric) error {
	if w == nil {
		return nil
	}
	dims := make([]string, 0, len(m.Dimensions))
	doc := map[string]any{m.Name: m.Value}
	for k, v := range m.Dimensions {
		dims = append(dims, k)
		doc[k] = v
	}
	slices.Sort(dims)
	doc["_aws"] = meta{
		Timestamp: at.UnixMilli(),
		CloudWatchMetrics: []directive{{
			Namespace: Namespace, Dimensions: [][]string{dims}, Metrics: []metric{{Name: m.Name, Unit: m.Unit}},
		}},
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, err = w.w.Write(append(b, '\n'))
	return err
}
