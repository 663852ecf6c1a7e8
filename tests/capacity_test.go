package tests

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/shared/fakehost"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
)

// Capacity targets for one dispatch on DynamoDB, by the documented rules
// (dynamostore.Meter), the caller lookup included and the host-registry
// read (which grows with the fleet) left out.
const (
	newDispatchMaxRCU      = 2
	newDispatchMaxTableWCU = 4
	reusedDispatchMaxRCU   = 2
)

// capacityStack is a DynamoDB stack with a meter and nHosts healthy hosts.
func capacityStack(tb testing.TB, nHosts int) (*stack, string) {
	meter := &dynamostore.Meter{}
	s := newStack(tb, "dynamodb", stackOptions{meter: meter})
	for i := 0; i < nHosts; i++ {
		id := fmt.Sprintf("h%02d", i)
		s.addHost(tb, id, fakehost.Config{}, map[string]any{"labels": map[string]string{"pool": "ci"}})
		s.probe(tb, id)
	}
	return s, s.mint(tb, "alice", "*", "*")
}

// withoutHosts splits a usage into the dispatch's own reads and the
// host-registry read.
func withoutHosts(u dynamostore.Usage) (rcu, hostsRCU float64) {
	return u.TotalRCU() - u.RCU["hosts"], u.RCU["hosts"]
}

func TestDispatchCapacityOnDynamoDB(t *testing.T) {
	s, token := capacityStack(t, 3)
	body := `{"agent":"shell","prompt":"make test","labels":{"pool":"ci"}}`

	s.meter.Reset()
	s.must(t, http.StatusCreated, "POST", "/fleet/runs", token, body, "Idempotency-Key", "cap-1")
	u := s.meter.Snapshot()
	rcu, hostsRCU := withoutHosts(u)
	t.Logf("new dispatch: %s", u)
	if rcu > newDispatchMaxRCU || u.TableWCU() > newDispatchMaxTableWCU {
		t.Errorf("new dispatch: %g RCU (want <= %d), %g table WCU (want <= %d)", rcu, newDispatchMaxRCU, u.TableWCU(), newDispatchMaxTableWCU)
	}
	if hostsRCU == 0 {
		t.Errorf("the host-registry read was not metered: %s", u)
	}

	s.meter.Reset()
	s.must(t, http.StatusOK, "POST", "/fleet/runs", token, body, "Idempotency-Key", "cap-1")
	u = s.meter.Snapshot()
	t.Logf("reused dispatch: %s", u)
	if u.TotalRCU() > reusedDispatchMaxRCU || u.TotalWCU() != 0 || u.RCU["hosts"] != 0 {
		t.Errorf("reused dispatch: %g RCU (want <= %d, no host read), %g WCU (want 0)", u.TotalRCU(), reusedDispatchMaxRCU, u.TotalWCU())
	}
}

// BenchmarkDispatchCapacity reports, per dispatch on DynamoDB (moto_server,
// priced by dynamostore.Meter): the calls, the read units without and with
// the host-registry read, and the write units on tables and on indexes.
func BenchmarkDispatchCapacity(b *testing.B) {
	body := `{"agent":"shell","prompt":"make test","labels":{"pool":"ci"}}`
	named := `{"host":"h00","agent":"shell","prompt":"make test"}`
	for _, hosts := range []int{1, 10} {
		b.Run(fmt.Sprintf("new/routed-over-%d-hosts", hosts), func(b *testing.B) {
			s, token := capacityStack(b, hosts)
			s.meter.Reset()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s.must(b, http.StatusCreated, "POST", "/fleet/runs", token, body, "Idempotency-Key", fmt.Sprintf("n-%d", i))
			}
			b.StopTimer()
			report(b, s.meter.Snapshot(), hosts)
		})
	}
	b.Run("new/named-host", func(b *testing.B) {
		s, token := capacityStack(b, 10)
		s.meter.Reset()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			s.must(b, http.StatusCreated, "POST", "/fleet/runs", token, named, "Idempotency-Key", fmt.Sprintf("n-%d", i))
		}
		b.StopTimer()
		report(b, s.meter.Snapshot(), 1)
	})
	b.Run("reused", func(b *testing.B) {
		s, token := capacityStack(b, 1)
		s.must(b, http.StatusCreated, "POST", "/fleet/runs", token, body, "Idempotency-Key", "r")
		s.meter.Reset()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			s.must(b, http.StatusOK, "POST", "/fleet/runs", token, body, "Idempotency-Key", "r")
		}
		b.StopTimer()
		report(b, s.meter.Snapshot(), 0)
	})
}

func report(b *testing.B, u dynamostore.Usage, hosts int) {
	n := float64(b.N)
	rcu, hostsRCU := withoutHosts(u)
	gsiWCU := u.TotalWCU() - u.TableWCU()
	b.ReportMetric(float64(u.TotalCalls())/n, "calls/op")
	b.ReportMetric(rcu/n, "RCU/op")
	b.ReportMetric(hostsRCU/n, "hostsRCU/op")
	if hosts > 0 {
		b.ReportMetric(hostsRCU/n/float64(hosts), "hostsRCU/host")
	}
	b.ReportMetric(u.TableWCU()/n, "tableWCU/op")
	b.ReportMetric(gsiWCU/n, "gsiWCU/op")
	var parts []string
	for k, v := range u.Calls {
		parts = append(parts, fmt.Sprintf("%s=%.2f", k, float64(v)/n))
	}
	for k, v := range u.RCU {
		parts = append(parts, fmt.Sprintf("RCU[%s]=%.2f", k, v/n))
	}
	for k, v := range u.WCU {
		parts = append(parts, fmt.Sprintf("WCU[%s]=%.2f", k, v/n))
	}
	b.Logf("per op: %s", strings.Join(parts, " "))
}
