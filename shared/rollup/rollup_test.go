package rollup

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

const hostA = `# HELP edge_tasks_live Tasks with a live attempt.
# TYPE edge_tasks_live gauge
edge_tasks_live 2
# HELP edge_admissions_total Admission decisions.
# TYPE edge_admissions_total counter
edge_admissions_total{outcome="admitted"} 7
edge_admissions_total{outcome="refused"} 1
# TYPE clash_type counter
clash_type 1
# HELP clash_help One meaning.
# TYPE clash_help gauge
clash_help 1
# TYPE has_host_label gauge
has_host_label{host="inner"} 3
# HELP runfleet_rollup_up A host pretending to be the rollup.
# TYPE runfleet_rollup_up gauge
runfleet_rollup_up 1
`

const hostB = `# HELP edge_tasks_live Tasks with a live attempt.
# TYPE edge_tasks_live gauge
edge_tasks_live 5
# TYPE edge_admissions_total counter
edge_admissions_total{outcome="admitted"} 4
# TYPE clash_type gauge
clash_type 2
# HELP clash_help Another meaning.
# TYPE clash_help gauge
clash_help 2
# HELP only_b Seen on b alone.
# TYPE only_b histogram
only_b_bucket{le="1"} 1
only_b_bucket{le="+Inf"} 2
only_b_sum 3
only_b_count 2
`

// parse reads a rollup back as a scraper would.
func parse(t *testing.T, text []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		t.Fatalf("the rollup does not parse as text format 0.0.4: %v\n%s", err, text)
	}
	return fams
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.Label {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func TestMergeKeepsAgreeingFamiliesLabelsHostsAndDropsConflicts(t *testing.T) {
	res := Merge([]Scrape{{Host: "b", Text: []byte(hostB)}, {Host: "a", Text: []byte(hostA)}})
	text, err := res.Text()
	if err != nil {
		t.Fatal(err)
	}
	fams := parse(t, text)

	// Every series carries its host, the rollup's own included.
	for name, mf := range fams {
		for _, m := range mf.Metric {
			if labels(m)[HostLabel] == "" {
				t.Errorf("%s: a series without the host label: %v", name, m)
			}
		}
	}
	live := fams["edge_tasks_live"]
	if live == nil || live.GetType() != dto.MetricType_GAUGE || live.GetHelp() != "Tasks with a live attempt." || len(live.Metric) != 2 {
		t.Fatalf("edge_tasks_live = %v", live)
	}
	got := map[string]float64{}
	for _, m := range live.Metric {
		got[labels(m)[HostLabel]] = m.GetGauge().GetValue()
	}
	if got["a"] != 2 || got["b"] != 5 {
		t.Errorf("edge_tasks_live by host = %v", got)
	}
	// Help given by one host only is no conflict.
	if adm := fams["edge_admissions_total"]; adm == nil || len(adm.Metric) != 3 || adm.GetHelp() != "Admission decisions." {
		t.Errorf("edge_admissions_total = %v", adm)
	}
	if h := fams["only_b"]; h == nil || h.GetType() != dto.MetricType_HISTOGRAM || labels(h.Metric[0])[HostLabel] != "b" {
		t.Errorf("only_b = %v", h)
	}
	// A scraped host label is kept as exported_host.
	if hl := fams["has_host_label"]; hl == nil || labels(hl.Metric[0])["exported_host"] != "inner" || labels(hl.Metric[0])[HostLabel] != "a" {
		t.Errorf("has_host_label = %v", hl)
	}

	// Conflicts are dropped, whole, and said.
	for _, name := range []string{"clash_type", "clash_help", "runfleet_rollup_up"} {
		if name != UpFamily && fams[name] != nil {
			t.Errorf("%s was kept: %v", name, fams[name])
		}
	}
	dropped := map[string]Drop{}
	for _, d := range res.Dropped {
		dropped[d.Family] = d
	}
	if d := dropped["clash_type"]; !strings.Contains(d.Reason, "type differs") || strings.Join(d.Hosts, ",") != "a,b" {
		t.Errorf("clash_type drop = %+v", d)
	}
	if d := dropped["clash_help"]; !strings.Contains(d.Reason, "help differs") {
		t.Errorf("clash_help drop = %+v", d)
	}
	if d := dropped["runfleet_rollup_up"]; !strings.Contains(d.Reason, "namespace") {
		t.Errorf("a host's runfleet_rollup_up drop = %+v", d)
	}
	if len(res.Dropped) != 3 {
		t.Errorf("dropped = %+v, want 3", res.Dropped)
	}
	// Per host: a's clash_type, clash_help and its runfleet_rollup_up, b's
	// clash_type and clash_help.
	droppedOf := map[string]float64{}
	for _, m := range fams[DroppedFamily].Metric {
		droppedOf[labels(m)[HostLabel]] = m.GetGauge().GetValue()
	}
	if droppedOf["a"] != 3 || droppedOf["b"] != 2 || len(droppedOf) != 2 {
		t.Errorf("%s by host = %v, want a 3, b 2", DroppedFamily, droppedOf)
	}
	up := map[string]float64{}
	for _, m := range fams[UpFamily].Metric {
		up[labels(m)[HostLabel]] = m.GetGauge().GetValue()
	}
	if up["a"] != 1 || up["b"] != 1 || len(up) != 2 {
		t.Errorf("up = %v", up)
	}
	if len(res.Failed) != 0 {
		t.Errorf("failed = %v", res.Failed)
	}
}

func TestMergeReportsFailedAndUnparseableHosts(t *testing.T) {
	res := Merge([]Scrape{
		{Host: "a", Text: []byte(hostA)},
		{Host: "down", Err: errors.New("the host did not answer in time")},
		{Host: "garbled", Text: []byte("# TYPE x counter\nx{ 1\n")},
	})
	fams := parse(t, mustText(t, res))
	up := map[string]float64{}
	for _, m := range fams[UpFamily].Metric {
		up[labels(m)[HostLabel]] = m.GetGauge().GetValue()
	}
	if up["a"] != 1 || up["down"] != 0 || up["garbled"] != 0 {
		t.Errorf("up = %v", up)
	}
	if len(res.Failed) != 2 || res.Failed[0].Host != "down" || !strings.Contains(res.Failed[1].Reason, "unparseable") {
		t.Errorf("failed = %+v", res.Failed)
	}
	// A family only one host has, with conflicts on none, is kept.
	if fams["clash_type"] == nil || fams["x"] != nil {
		t.Errorf("families = %v", fams)
	}
}

func TestMergeDropsNamesTextFormatCannotCarry(t *testing.T) {
	utf8 := "# TYPE \"http.requests\" counter\n{\"http.requests\"} 1\n# TYPE ok_total counter\nok_total 1\n"
	res := Merge([]Scrape{{Host: "a", Text: []byte(utf8)}})
	fams := parse(t, mustText(t, res))
	if fams["ok_total"] == nil || len(res.Dropped) != 1 || res.Dropped[0].Family != "http.requests" {
		t.Fatalf("families %v, dropped %+v", fams, res.Dropped)
	}
}

func TestMergeOfNoHostsIsEmpty(t *testing.T) {
	if text := mustText(t, Merge(nil)); len(text) != 0 {
		t.Fatalf("a rollup of no host: %q", text)
	}
}

func mustText(t *testing.T, r Result) []byte {
	t.Helper()
	b, err := r.Text()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzMerge: whatever two hosts answer, the rollup is valid text format
// 0.0.4 and every host series in it carries its host.
func FuzzMerge(f *testing.F) {
	f.Add(hostA, hostB)
	f.Add("# TYPE x counter\nx 1\n", "# TYPE x gauge\nx 2\n")
	f.Add("x{host=\"a\",exported_host=\"b\"} 1\n", "")
	f.Fuzz(func(t *testing.T, a, b string) {
		res := Merge([]Scrape{{Host: "a", Text: []byte(a)}, {Host: "b", Text: []byte(b)}})
		fams := parse(t, mustText(t, res))
		for name, mf := range fams {
			for _, m := range mf.Metric {
				if h := labels(m)[HostLabel]; h != "a" && h != "b" {
					t.Fatalf("%s: series without its host: %v", name, m)
				}
			}
		}
	})
}
