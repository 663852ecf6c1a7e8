package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/ssetest"
)

// watchCost is what following one run costs, per watched minute.
type watchCost struct {
	rcu, wcu, ddbCalls, hostCalls float64
	// lambdaRequests and apiRequests count invocations and API Gateway
	// requests; lambdaSeconds is the billed duration.
	lambdaRequests, apiRequests, lambdaSeconds float64
	memoryMB                                   int
}

func (c watchCost) dollars() (lambda, api, ddb float64) {
	p := dynamostore.OnDemandUSEast1
	ddb = (c.rcu*p.ReadPerMillion + c.wcu*p.WritePerMillion) / 1e6
	return lambdaDollars(c.lambdaRequests, c.lambdaSeconds, c.memoryMB), c.apiRequests * priceHTTPAPIRequest, ddb
}

func (c watchCost) report(b *testing.B) {
	b.ReportMetric(c.rcu, "RCU/min")
	b.ReportMetric(c.wcu, "WCU/min")
	b.ReportMetric(c.ddbCalls, "ddbcalls/min")
	b.ReportMetric(c.hostCalls, "hostcalls/min")
	b.ReportMetric(c.lambdaRequests, "invokes/min")
	b.ReportMetric(c.lambdaSeconds*float64(c.memoryMB)/1024, "GBs/min")
	lambda, api, ddb := c.dollars()
	// Dollars per million watched run-minutes.
	b.ReportMetric(lambda*1e6, "$lambda/Mmin")
	b.ReportMetric(api*1e6, "$apigw/Mmin")
	b.ReportMetric(ddb*1e6, "$ddb/Mmin")
	b.ReportMetric((lambda+api+ddb)*1e6, "$/Mmin")
}

// functionMemoryMB reads a function's MemorySize from template.yaml.
func functionMemoryMB(b *testing.B, fn string) int { return functionInt(b, fn, "MemorySize") }

// functionInt reads a function's integer property (MemorySize, Timeout)
// from template.yaml.
func functionInt(b *testing.B, fn, property string) int {
	raw, _ := templates(b)
	n, err := strconv.Atoi(fmt.Sprint(jsonObj(raw, "Resources", fn, "Properties")[property]))
	if err != nil {
		b.Fatalf("%s %s: %v", fn, property, err)
	}
	return n
}

// BenchmarkWatchCost reports what it costs to follow one live run for a
// minute, each of three ways, on DynamoDB (moto_server, priced by
// dynamostore.Meter) with the stack's fake clock; one iteration is one
// watched minute. "active": the run prints a line every 10 s; "quiet":
// nothing (a run thinking, or a client watching a stalled run).
//
//   - stream: one SSE stream (the stream function), polling each second;
//     it holds its Lambda the whole minute (billed 60 s at the stream's
//     memory), reopened when it ends (its lease and first reads included);
//     after an idle end the client waits the retry hint (30 s, unbilled)
//     before reconnecting, as EventSource does.
//   - longpoll: GET events?after=N&wait=20 (the api function) in a loop;
//     each answer comes with the next event (here within 10 s); the Lambda
//     is held for the wait (billed at the api's memory), one API Gateway
//     request each.
//   - poll5s: GET events?after=N every 5 s (the api function): one quick
//     read of the mirror each, billed its measured duration; the mirror is
//     as fresh as the sweep (a minute), whose cost is every live run's
//     whether watched or not, so it is left out.
func BenchmarkWatchCost(b *testing.B) {
	for _, activity := range []string{"active", "quiet"} {
		for _, way := range []string{"stream", "longpoll", "poll5s"} {
			b.Run(activity+"/"+way, func(b *testing.B) { benchWatch(b, way, activity == "active") })
		}
	}
}

func benchWatch(b *testing.B, way string, active bool) {
	meter := &dynamostore.Meter{}
	s := newStack(b, "dynamodb", stackOptions{meter: meter})
	host := s.addHost(b, "h1", fakehost.Config{}, nil)
	s.probe(b, "h1")
	alice := s.mint(b, "alice", "*", "*")
	a := s.must(b, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
	id, child := a.str("fleetRunId"), a.str("childRunId")
	s.sweep(b)
	var c watchCost
	var u dynamostore.Usage
	out := func(sec int) {
		if active && sec%10 == 0 {
			host.AppendOutput(child, fmt.Sprintf("line %d\n", sec))
		}
	}
	host.ResetRequests()
	meter.Reset()
	b.ResetTimer()
	switch way {
	case "stream":
		c, u = watchByStream(b, s, out, id, alice)
	case "longpoll":
		c, u = watchByLongPoll(b, s, out, id, alice)
	case "poll5s":
		c, u = watchByPolling(b, s, host, out, id, alice)
	}
	b.StopTimer()
	n := float64(b.N)
	c.rcu, c.wcu, c.ddbCalls = u.TotalRCU()/n, u.TotalWCU()/n, float64(u.TotalCalls())/n
	hostCalls := sumRequests(host)
	// A way may have counted the sweep's host calls apart (negative).
	c.hostCalls = (c.hostCalls + float64(hostCalls)) / n
	c.lambdaRequests, c.apiRequests, c.lambdaSeconds = c.lambdaRequests/n, c.apiRequests/n, c.lambdaSeconds/n
	c.report(b)
	b.Logf("%s per watched minute: %s", way, perMinute(u, n))
}

func perMinute(u dynamostore.Usage, n float64) string {
	out := ""
	for k, v := range u.Calls {
		out += fmt.Sprintf("%s=%.1f ", k, float64(v)/n)
	}
	for k, v := range u.RCU {
		out += fmt.Sprintf("RCU[%s]=%.2f ", k, v/n)
	}
	for k, v := range u.WCU {
		out += fmt.Sprintf("WCU[%s]=%.2f ", k, v/n)
	}
	return out
}

// watchByStream follows the run with one stream at a time; out(sec) is
// called at each second of watching.
func watchByStream(b *testing.B, s *stack, out func(sec int), id, token string) (watchCost, dynamostore.Usage) {
	c := watchCost{memoryMB: functionMemoryMB(b, "StreamFunction")}
	var ch <-chan ssetest.Message
	var body io.Closer
	cursor := "0"
	open := func() {
		req, _ := http.NewRequest("GET", s.srv.URL+"/fleet/runs/"+id+"/stream", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Last-Event-ID", cursor)
		resp, err := s.srv.Client().Do(req)
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("stream: %v %v", resp, err)
		}
		body, ch = resp.Body, ssetest.Read(resp.Body)
		c.lambdaRequests++
	}
	open()
	defer func() { body.Close() }()
	retry := 0
	for sec := 0; sec < 60*b.N; {
		select {
		case m, ok := <-ch:
			if !ok { // a planned (14 min) or idle end: reconnect after the hint
				body.Close()
				for i := 0; i < retry/1000; i++ {
					sec++
					out(sec)
					s.clk.Advance(time.Second)
				}
				open()
				continue
			}
			if m.ID != "" {
				cursor = m.ID
			}
			if m.Retry != "" {
				retry, _ = strconv.Atoi(m.Retry)
			}
		case <-s.parked:
			// The stream holds its Lambda every second it is open.
			sec++
			c.lambdaSeconds++
			out(sec)
			s.clk.Advance(time.Second)
		case <-time.After(20 * time.Second):
			b.Fatal("the stream stalled")
		}
	}
	return c, s.meter.Snapshot()
}

func watchByLongPoll(b *testing.B, s *stack, out func(sec int), id, token string) (watchCost, dynamostore.Usage) {
	c := watchCost{memoryMB: functionMemoryMB(b, "ApiFunction")}
	cursor := int64(0)
	sec := 0
	for sec < 60*b.N {
		type result struct {
			body   map[string]any
			status int
		}
		done := make(chan result, 1)
		path := fmt.Sprintf("%s/fleet/runs/%s/events?after=%d&wait=20", s.srv.URL, id, cursor)
		began := s.clk.Now()
		go func() {
			req, _ := http.NewRequest("GET", path, nil)
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := s.srv.Client().Do(req)
			if err != nil {
				done <- result{status: -1}
				return
			}
			defer resp.Body.Close()
			var body map[string]any
			json.NewDecoder(resp.Body).Decode(&body)
			done <- result{body, resp.StatusCode}
		}()
		var r result
	wait:
		for {
			select {
			case r = <-done:
				break wait
			case <-s.parked:
				sec++
				out(sec)
				s.clk.Advance(time.Second)
			case <-time.After(20 * time.Second):
				b.Fatal("the long-poll stalled")
			}
		}
		if r.status != 200 {
			b.Fatalf("long-poll: %d", r.status)
		}
		cursor = int64(r.body["nextCursor"].(float64))
		c.apiRequests++
		c.lambdaRequests++
		// Billed: the wait (the fake clock's, the real one in AWS); the
		// polls inside it take milliseconds.
		c.lambdaSeconds += max(s.clk.Now().Sub(began).Seconds(), 0.001)
	}
	return c, s.meter.Snapshot()
}

func watchByPolling(b *testing.B, s *stack, host *fakehost.Host, out func(sec int), id, token string) (watchCost, dynamostore.Usage) {
	c := watchCost{memoryMB: functionMemoryMB(b, "ApiFunction")}
	cursor := int64(0)
	var sweeps dynamostore.Usage
	for sec := 5; sec <= 60*b.N; sec += 5 {
		s.clk.Advance(5 * time.Second)
		out(sec)
		if sec%60 == 0 {
			// The minute's sweep mirrors the new lines (its cost is the
			// live run's, watched or not: counted apart).
			before, hostBefore := s.meter.Snapshot(), sumRequests(host)
			s.sweep(b)
			after := s.meter.Snapshot()
			c.hostCalls -= float64(sumRequests(host) - hostBefore)
			sweeps.Calls = addCounts(sweeps.Calls, diffCounts(after.Calls, before.Calls))
			sweeps.RCU = addUnits(sweeps.RCU, diffUnits(after.RCU, before.RCU))
			sweeps.WCU = addUnits(sweeps.WCU, diffUnits(after.WCU, before.WCU))
		}
		began := time.Now()
		a := s.must(b, http.StatusOK, "GET", fmt.Sprintf("/fleet/runs/%s/events?after=%d", id, cursor), token, "")
		c.lambdaSeconds += time.Since(began).Seconds()
		cursor = int64(a.body["nextCursor"].(float64))
		c.apiRequests++
		c.lambdaRequests++
	}
	u := s.meter.Snapshot()
	u.Calls = diffCounts(u.Calls, sweeps.Calls)
	u.RCU, u.WCU = diffUnits(u.RCU, sweeps.RCU), diffUnits(u.WCU, sweeps.WCU)
	return c, u
}

func sumRequests(h *fakehost.Host) int {
	n := 0
	for _, k := range h.Requests() {
		n += k
	}
	return n
}

func diffCounts(a, b map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range a {
		if d := v - b[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

func diffUnits(a, b map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range a {
		if d := v - b[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}
