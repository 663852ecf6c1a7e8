package tests

import (
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

const metricsH1 = `# HELP edge_tasks_live Tasks with a live attempt.
# TYPE edge_tasks_live gauge
edge_tasks_live 3
# HELP edge_admissions_total Admission decisions.
# TYPE edge_admissions_total counter
edge_admissions_total{outcome="admitted"} 10
# HELP edge_queue_depth Runs waiting.
# TYPE edge_queue_depth gauge
edge_queue_depth 4
`

// h2 runs an edge whose edge_queue_depth is a counter: the families conflict.
const metricsH2 = `# HELP edge_tasks_live Tasks with a live attempt.
# TYPE edge_tasks_live gauge
edge_tasks_live 1
# HELP edge_admissions_total Admission decisions.
# TYPE edge_admissions_total counter
edge_admissions_total{outcome="admitted"} 2
edge_admissions_total{outcome="refused"} 1
# HELP edge_queue_depth Runs ever queued.
# TYPE edge_queue_depth counter
edge_queue_depth 90
`

func TestMetricsRollup(t *testing.T) {
	s := newStack(t, "dynamodb", stackOptions{})
	h1 := s.addHost(t, "h1", fakehost.Config{}, nil)
	h2 := s.addHost(t, "h2", fakehost.Config{}, nil)
	h1.SetMetrics(metricsH1)
	h2.SetMetrics(metricsH2)
	onlyH1 := s.mint(t, "ops-h1", []string{"h1"}, "*")

	scrape := func(token string) map[string]*dto.MetricFamily {
		t.Helper()
		req, _ := http.NewRequest("GET", s.srv.URL+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := s.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/plain; version=0.0.4; charset=utf-8" {
			t.Fatalf("GET /metrics: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		p := expfmt.NewTextParser(model.LegacyValidation)
		fams, err := p.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatalf("the rollup does not parse: %v", err)
		}
		return fams
	}
	hostsOf := func(mf *dto.MetricFamily) string {
		var hs []string
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "host" {
					hs = append(hs, l.GetValue())
				}
			}
		}
		return strings.Join(hs, ",")
	}

	all := scrape(adminToken)
	if mf := all["edge_tasks_live"]; mf == nil || hostsOf(mf) != "h1,h2" {
		t.Fatalf("edge_tasks_live = %v", mf)
	}
	if mf := all["edge_admissions_total"]; mf == nil || len(mf.Metric) != 3 || hostsOf(mf) != "h1,h2,h2" {
		t.Fatalf("edge_admissions_total = %v", mf)
	}
	if all["edge_queue_depth"] != nil {
		t.Fatalf("the conflicting family was kept: %v", all["edge_queue_depth"])
	}
	// The drop counts on each host whose family it was.
	dropped := map[string]float64{}
	for _, m := range all["runfleet_rollup_dropped_families"].GetMetric() {
		dropped[hostsOf(&dto.MetricFamily{Metric: []*dto.Metric{m}})] = m.GetGauge().GetValue()
	}
	if len(dropped) != 2 || dropped["h1"] != 1 || dropped["h2"] != 1 {
		t.Fatalf("the drop is not reported per host: %v", dropped)
	}
	// A host label on every series, the rollup's own included.
	for name, mf := range all {
		for _, m := range mf.Metric {
			if !strings.Contains(hostsOf(&dto.MetricFamily{Metric: []*dto.Metric{m}}), "h") {
				t.Fatalf("%s has a series without its host: %v", name, m)
			}
		}
	}

	// A caller limited to h1 sees h1 alone: no conflict to drop, nothing of h2.
	mine := scrape(onlyH1)
	if mf := mine["edge_queue_depth"]; mf == nil || hostsOf(mf) != "h1" || mf.GetType() != dto.MetricType_GAUGE {
		t.Fatalf("edge_queue_depth for the h1 caller = %v", mf)
	}
	for name, mf := range mine {
		if strings.Contains(hostsOf(mf), "h2") {
			t.Fatalf("the h1 caller sees h2 in %s", name)
		}
	}
	if d := mine["runfleet_rollup_dropped_families"]; len(d.GetMetric()) != 1 || hostsOf(d) != "h1" || d.Metric[0].GetGauge().GetValue() != 0 {
		t.Fatalf("dropped for the h1 caller: %v", d)
	}

	// A host that fails its scrape is reported down, the rest still rolled up.
	h2.Close()
	after := scrape(adminToken)
	up := map[string]float64{}
	for _, m := range after["runfleet_rollup_up"].Metric {
		up[hostsOf(&dto.MetricFamily{Metric: []*dto.Metric{m}})] = m.GetGauge().GetValue()
	}
	if up["h1"] != 1 || up["h2"] != 0 || after["edge_queue_depth"] == nil {
		t.Fatalf("with h2 down: up %v, families %v", up, after)
	}
}

// TestMetricsRollupIsBounded: one GET /metrics scrapes at most 50 hosts
// and, while hosts may remain, says where the next page starts (Link
// rel="next"); following the links rolls up every host once; ?host= rolls
// up one host; a caller limited to some hosts pages through those alone
// and is refused another. On both stores: an admin's pages follow the
// store's order of the registry (DynamoDB's is not sorted).
func TestMetricsRollupIsBounded(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { testMetricsRollupIsBounded(t, kind) })
	}
}

func testMetricsRollupIsBounded(t *testing.T, kind string) {
	const n = fleet.MaxMetricsHosts + 3
	s := newStack(t, kind, stackOptions{})
	hosts := map[string]*fakehost.Host{}
	var ids []string
	for i := range n {
		id := fmt.Sprintf("m%02d", i)
		hosts[id] = s.addHost(t, id, fakehost.Config{}, nil)
		hosts[id].SetMetrics("# TYPE edge_tasks_live gauge\nedge_tasks_live 1\n")
		ids = append(ids, id)
	}
	scoped := s.mint(t, "ops", []string{"m52", "m01", "m51", "gone"}, "*")

	// get rolls up path and returns the hosts rolled up (sorted), those
	// whose /metrics was called, and the next page's path.
	get := func(token, path string) (up, called []string, next string) {
		t.Helper()
		for _, h := range hosts {
			h.ResetRequests()
		}
		req, _ := http.NewRequest("GET", s.srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := s.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", path, resp.StatusCode)
		}
		parser := expfmt.NewTextParser(model.LegacyValidation)
		fams, err := parser.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range fams["runfleet_rollup_up"].GetMetric() {
			for _, l := range m.Label {
				if l.GetName() == "host" && m.GetGauge().GetValue() == 1 {
					up = append(up, l.GetValue())
				}
			}
		}
		for _, id := range ids {
			if hosts[id].Requests()["GET /metrics"] > 0 {
				called = append(called, id)
			}
		}
		sort.Strings(up)
		if link := resp.Header.Get("Link"); link != "" {
			target, ok := strings.CutPrefix(link, "<"+s.srv.URL)
			target, ok2 := strings.CutSuffix(target, `>; rel="next"`)
			if !ok || !ok2 {
				t.Fatalf("Link %q", link)
			}
			next = target
		}
		return up, called, next
	}

	// An admin follows the links: every host once, at most 50 a call.
	var all []string
	path, pages := "/metrics", 0
	for path != "" {
		if pages++; pages > n {
			t.Fatal("the pages never end")
		}
		up, called, next := get(adminToken, path)
		if len(up) > fleet.MaxMetricsHosts || !slices.Equal(called, up) {
			t.Fatalf("GET %s: rolled up %d hosts %v, called %v", path, len(up), up, called)
		}
		all = append(all, up...)
		path = next
	}
	sort.Strings(all)
	if !slices.Equal(all, ids) || pages < 2 {
		t.Fatalf("%d pages rolled up %v; want every host once, in at least 2 pages", pages, all)
	}

	up, called, next := get(adminToken, "/metrics?host=m07")
	if !slices.Equal(up, []string{"m07"}) || !slices.Equal(called, up) || next != "" {
		t.Fatalf("?host=m07: rolled up %v, called %v, next %q", up, called, next)
	}

	// The scoped caller: its own hosts, by id; "gone" is in its scope but
	// not registered, and simply absent.
	up, called, next = get(scoped, "/metrics")
	if !slices.Equal(up, []string{"m01", "m51", "m52"}) || !slices.Equal(called, up) || next != "" {
		t.Fatalf("the scoped caller: rolled up %v, called %v, next %q", up, called, next)
	}
	if up, _, _ = get(scoped, "/metrics?after=m01"); !slices.Equal(up, []string{"m51", "m52"}) {
		t.Fatalf("the scoped caller after m01: %v", up)
	}
	if a := s.must(t, http.StatusForbidden, "GET", "/metrics?host=m02", scoped, ""); !strings.Contains(a.errorText(), "m02") {
		t.Fatalf("a host out of scope: %s", a.raw)
	}
	s.must(t, http.StatusForbidden, "GET", "/metrics?host=nope", scoped, "")
	s.must(t, http.StatusNotFound, "GET", "/metrics?host=nope", adminToken, "")
	s.must(t, http.StatusBadRequest, "GET", "/metrics?host=m01&after=m00", adminToken, "")
	s.must(t, http.StatusBadRequest, "GET", "/metrics?after=a%20b", adminToken, "")
}
