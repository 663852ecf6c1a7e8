package proxy

import (
	"io"
	"net/http"
	"testing"
)

// An answer is scrubbed of the value of every key the run holds, one no
// request of the run ever used included (stored upstream by another run, or
// by anyone), whichever granted host answers.
func TestAnswerIsScrubbedOfAKeyTheRunNeverUsed(t *testing.T) {
	f := newFixture(t, "open")
	f.up.handler = func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "stored: "+realB+".")
	}
	res, body := f.get(t, "https://"+f.api+"/notes/1", nil)
	if res.StatusCode != 200 || body != "stored: "+f.phB+"." {
		t.Fatalf("%d, %d bytes; holds B's value: %v", res.StatusCode, len(body), body != "stored: "+f.phB+".")
	}
	line := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/notes/1" })
	if line["scrubbed"] != float64(1) || line["keys"] != nil {
		t.Errorf("audit %v", line)
	}
}

// A key's value rotated while the run goes on: the old value, which an
// upstream may have kept, stays scrubbed, and the new one is scrubbed
// from the first request after the rotation.
func TestARotatedValueStaysScrubbed(t *testing.T) {
	const newA = "rotated-A-2222-zQ8wXk3LmN5pR7tV"
	f := newFixture(t, "open")
	t.Cleanup(func() { f.assertNoLeak(newA) })
	f.up.handler = func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "you sent "+r.Header.Get("Authorization")+"; kept: "+realA+" and "+newA)
	}
	res, body := f.get(t, "https://"+f.api+"/before", http.Header{"Authorization": {"Bearer " + f.phA}})
	want := "you sent Bearer " + f.phA + "; kept: " + f.phA + " and " + newA
	if res.StatusCode != 200 || body != want {
		t.Fatalf("before the rotation: %d, %d bytes, want %d", res.StatusCode, len(body), len(want))
	}
	f.secrets["acme/A"] = newA
	f.writeSecrets()
	res, body = f.get(t, "https://"+f.api+"/after", nil)
	want = "you sent ; kept: " + f.phA + " and " + f.phA
	if res.StatusCode != 200 || body != want {
		t.Fatalf("after the rotation: %d, %d bytes, want %d", res.StatusCode, len(body), len(want))
	}
	if got := f.up.requests(); got[0].Header.Get("Authorization") != "Bearer "+realA {
		t.Fatal("the first request did not carry the value before the rotation")
	}
}
