package lambdatest

import (
	"testing"
	"time"

	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

func TestReportsParsesTheEmulatorsLines(t *testing.T) {
	f := &Function{output: &syncbuf.Buffer{}}
	if _, ok := f.Init(); ok {
		t.Fatal("an init before any INIT REPORT line")
	}
	f.output.Write([]byte("30 Nov 2026 10:50:35,019 [INFO] (rapid) INIT REPORT(durationMs: 6.271000)\n" +
		"START RequestId: a Version: $LATEST\n" +
		"REPORT RequestId: a\tInit Duration: 22.50 ms\tDuration: 7.22 ms\tBilled Duration: 8 ms\tMemory Size: 3008 MB\tMax Memory Used: 31 MB\t\n" +
		"REPORT RequestId: b\tDuration: 5.00 ms\tBilled Duration: 5 ms\tMemory Size: 3008 MB\tMax Memory Used: 32 MB\t\n"))
	got := f.Reports()
	if len(got) != 2 || got[0].RequestID != "a" || got[0].InitDuration != 22500*time.Microsecond || got[0].Duration != 7220*time.Microsecond ||
		got[0].MaxMemoryMB != 31 || got[1].InitDuration != 0 || got[1].Duration != 5*time.Millisecond {
		t.Fatalf("reports = %+v", got)
	}
	if d, ok := f.Init(); !ok || d != 6271*time.Microsecond {
		t.Fatalf("init %v %v", d, ok)
	}
}

func TestStreamedResponseSplitsPreludeAndBody(t *testing.T) {
	wire := append([]byte(`{"statusCode":200,"headers":{"content-type":"text/event-stream"}}`), make([]byte, 8)...)
	wire = append(wire, "event: done\ndata: {}\n\n"...)
	p, body, err := StreamedResponse(wire)
	if err != nil || p.StatusCode != 200 || p.Headers["content-type"] != "text/event-stream" || string(body) != "event: done\ndata: {}\n\n" {
		t.Fatalf("%+v %q %v", p, body, err)
	}
	if _, _, err := StreamedResponse([]byte(`{"statusCode":200}`)); err == nil {
		t.Fatal("a buffered answer passed for a streamed one")
	}
}
