// Package emf writes Fleet's metrics as CloudWatch Embedded Metric Format
// lines: each JSON document (one metric, or several sharing dimensions) on
// one line of the function's stdout, which CloudWatch Logs turns into
// metrics of namespace Runfleet
// (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html).
// The sweep's lag, the broker's counts and the probe's capacity figures go
// through one Writer per process, so lines written by concurrent
// goroutines never interleave.
package emf

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
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

// Write writes ms, at at, as one line: the whole line is the JSON
// document (CloudWatch Logs takes a log event as EMF only when its message
// is exactly one JSON object). Each value is the root member named as its
// metric, each dimension's value the root member named as the dimension.
// Metrics written together share one directive, so they must share their
// dimensions (the first's; a metric naming others is an error): one line
// per class carries a class's every figure.
func (w *Writer) Write(at time.Time, ms ...Metric) error {
	if w == nil || len(ms) == 0 {
		return nil
	}
	first := ms[0].Dimensions
	dims := make([]string, 0, len(first))
	doc := map[string]any{}
	for k, v := range first {
		dims = append(dims, k)
		doc[k] = v
	}
	slices.Sort(dims)
	metrics := make([]metric, len(ms))
	for i, m := range ms {
		if !maps.Equal(m.Dimensions, first) {
			return fmt.Errorf("emf: metric %s has other dimensions than %s, written with it", m.Name, ms[0].Name)
		}
		if _, taken := doc[m.Name]; taken {
			return fmt.Errorf("emf: metric %s is named twice (or as a dimension) in one line", m.Name)
		}
		doc[m.Name] = m.Value
		metrics[i] = metric{Name: m.Name, Unit: m.Unit}
	}
	doc["_aws"] = meta{
		Timestamp: at.UnixMilli(),
		CloudWatchMetrics: []directive{{
			Namespace: Namespace, Dimensions: [][]string{dims}, Metrics: metrics,
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
