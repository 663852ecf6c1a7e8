package emf

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// TestAMetricIsOneEMFDocumentOnOneLine: the document CloudWatch reads, its
// dimensions both in the directive and as root members; without
// dimensions, one empty dimension set.
func TestAMetricIsOneEMFDocumentOnOneLine(t *testing.T) {
	var buf syncbuf.Buffer
	w := New(&buf)
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	if err := w.Write(at, Metric{Name: "BrokerMints", Unit: UnitCount, Value: 1, Dimensions: map[string]string{"Kind": "githubApp"}}); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(at, Metric{Name: "SweepLagSeconds", Unit: UnitSeconds, Value: 2.5}); err != nil {
		t.Fatal(err)
	}
	want := `{"BrokerMints":1,"Kind":"githubApp","_aws":{"Timestamp":1772366400000,"CloudWatchMetrics":[{"Namespace":"Runfleet","Dimensions":[["Kind"]],"Metrics":[{"Name":"BrokerMints","Unit":"Count"}]}]}}` + "\n" +
		`{"SweepLagSeconds":2.5,"_aws":{"Timestamp":1772366400000,"CloudWatchMetrics":[{"Namespace":"Runfleet","Dimensions":[[]],"Metrics":[{"Name":"SweepLagSeconds","Unit":"Seconds"}]}]}}` + "\n"
	if got := buf.String(); got != want {
		t.Fatalf("lines:\n%s\nwant\n%s", got, want)
	}
}

// TestConcurrentMetricsNeverInterleave: the sweep's goroutines write
// through one Writer onto one stream that is not safe for concurrent use
// (the race detector sees any overlap); each line stays one document.
func TestConcurrentMetricsNeverInterleave(t *testing.T) {
	var buf bytes.Buffer
	w := New(&buf)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			w.Write(time.Now(), Metric{Name: "BrokerRevocations", Unit: UnitCount, Value: 1, Dimensions: map[string]string{"Kind": "githubApp"}})
		})
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 50 {
		t.Fatalf("%d lines, want 50", len(lines))
	}
	for _, l := range lines {
		if !json.Valid([]byte(l)) {
			t.Fatalf("line %q is not one document", l)
		}
	}
}

// TestANilWriterWritesNothing: no metrics configured.
func TestANilWriterWritesNothing(t *testing.T) {
	if w := New(nil); w != nil || w.Write(time.Now(), Metric{Name: "X"}) != nil {
		t.Fatal("a nil writer")
	}
}

// TestMetricsSharingDimensionsAreOneLine: a class's figures are one
// document, one directive listing each metric in order; metrics of other
// dimensions, or a name given twice, are refused and nothing is written.
func TestMetricsSharingDimensionsAreOneLine(t *testing.T) {
	var buf syncbuf.Buffer
	w := New(&buf)
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	dims := map[string]string{"RoutingClass": "shell?pool=ci"}
	if err := w.Write(at,
		Metric{Name: "QueuedRuns", Unit: UnitCount, Value: 3, Dimensions: dims},
		Metric{Name: "OldestQueuedWaitSeconds", Unit: UnitSeconds, Value: 90, Dimensions: dims},
	); err != nil {
		t.Fatal(err)
	}
	want := `{"OldestQueuedWaitSeconds":90,"QueuedRuns":3,"RoutingClass":"shell?pool=ci","_aws":{"Timestamp":1772366400000,"CloudWatchMetrics":[{"Namespace":"Runfleet","Dimensions":[["RoutingClass"]],"Metrics":[{"Name":"QueuedRuns","Unit":"Count"},{"Name":"OldestQueuedWaitSeconds","Unit":"Seconds"}]}]}}` + "\n"
	if got := buf.String(); got != want {
		t.Fatalf("line:\n%s\nwant\n%s", got, want)
	}
	if err := w.Write(at, Metric{Name: "A", Dimensions: dims}, Metric{Name: "B"}); err == nil {
		t.Fatal("metrics of other dimensions were written as one line")
	}
	if err := w.Write(at, Metric{Name: "A"}, Metric{Name: "A"}); err == nil {
		t.Fatal("a metric named twice was written")
	}
	if buf.String() != want {
		t.Fatalf("a refused line was written: %s", buf.String())
	}
}
