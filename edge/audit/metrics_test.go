package audit

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/egress"
)

// alertCounts scrapes reg's edge_egress_alerts_total by kind.
func alertCounts(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, fam := range families {
		if fam.GetName() != "edge_egress_alerts_total" {
			continue
		}
		for _, m := range fam.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	return got
}

// Every alert kind has its series from the start, at zero; each decision
// with an alert counts once under its kind, whatever its action.
func TestAlertsAreCountedByKind(t *testing.T) {
	reg := prometheus.NewRegistry()
	l, err := Open(Config{Dir: t.TempDir(), Registerer: reg, Clock: clock.NewFake(time.Unix(1_800_000_000, 0)),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	want := map[string]float64{egress.AlertForeignPlaceholder: 0, egress.AlertUngrantedDomain: 0, egress.AlertRealValue: 0}
	if got := alertCounts(t, reg); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("before any alert: %v, want %v", got, want)
	}
	l.Record(Entry{Action: Blocked, Host: "a.test:443", Alert: egress.AlertRealValue})
	l.Record(Entry{Action: Blocked, Host: "a.test:443", Alert: egress.AlertRealValue})
	l.Record(Entry{Action: Blocked, Host: "a.test:443", Alert: egress.AlertForeignPlaceholder})
	l.Record(Entry{Action: Blocked, Host: "b.test:443", Alert: egress.AlertUngrantedDomain})
	l.Record(Entry{Action: Blocked, Host: "b.test:443"})
	l.Record(Entry{Action: Substituted, Host: "b.test:443"})
	want = map[string]float64{egress.AlertForeignPlaceholder: 1, egress.AlertUngrantedDomain: 1, egress.AlertRealValue: 2}
	if got := alertCounts(t, reg); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after four alerts: %v, want %v", got, want)
	}
}
