package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

func TestMetricsRollupLogsWhatItDrops(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	logs := &syncbuf.Buffer{}
	e.f.log = newJSONLogger(logs)
	e.addHost(t, "h1", fakehost.Config{}).SetMetrics("# TYPE jobs gauge\njobs 1\n# TYPE up_total counter\nup_total 1\n")
	e.addHost(t, "h2", fakehost.Config{}).SetMetrics("# TYPE jobs counter\njobs 7\n# TYPE up_total counter\nup_total 2\n")
	res, err := e.f.MetricsRollup(context.Background(), caller("ops"), MetricsQuery{})
	if err != nil || len(res.Dropped) != 1 || res.Dropped[0].Family != "jobs" {
		t.Fatalf("rollup = %+v, %v", res, err)
	}
	line := logs.String()
	if !strings.Contains(line, `"msg":"metrics rollup dropped families"`) || !strings.Contains(line, `"family":"jobs"`) ||
		!strings.Contains(line, "type differs") {
		t.Fatalf("log: %s", line)
	}
	// A caller limited to h1 scrapes h1 alone: nothing conflicts.
	res, _ = e.f.MetricsRollup(context.Background(), caller("ops", "h1"), MetricsQuery{})
	if len(res.Dropped) != 0 || len(res.Failed) != 0 {
		t.Fatalf("h1 only: %+v", res)
	}
}
