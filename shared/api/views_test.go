package api

import (
	"encoding/json"
	"testing"

	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/storetest"
)

// TestHostViewJSONIsUnchanged pins the host answer's bytes with every
// probe field set: the probe's record and the answer's shape are apart,
// and a deployed client reads these names.
func TestHostViewJSONIsUnchanged(t *testing.T) {
	const want = `{"id":"h-stored","baseUrl":"https://h-stored.example.test:7070","credentialRef":"cred-h-stored",` +
		`"labels":{"gpu":"a100","zone":"eu"},"localPaths":["/srv/work/h-stored","/srv/other"],` +
		`"caPem":"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n","enabled":true,"createdAt":"2026-05-04T03:02:01.123456789Z",` +
		`"probe":{"status":"ok","at":"2026-05-04T03:02:02.123456789Z","latencyMs":42,"version":"1.2.3","agents":["claude","shell"],` +
		`"features":{"secretsProxy":true,"execRequire":true},` +
		`"ca":{"notAfter":"2027-05-04T03:02:01.123456789Z","successorNotAfter":"2026-08-02T03:02:01.123456789Z"},` +
		`"draining":true,"idle":true,"storage":{"freeBytes":3221225472,"minFreeBytes":1073741824,"low":true},` +
		`"limits":{"enforced":"cgroup2","memoryBytes":2147483648,"pids":512,"cpu":1.5,"detail":"per task"},"detail":"ok after 1 retry"}}`
	got, err := json.Marshal(toHostView(storetest.StoredFormHost(), true))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("host answer:\n got  %s\n want %s", got, want)
	}
}

// TestEventPageCursor: nextCursor is there on every page but one past the
// run's last event, where no page continues.
func TestEventPageCursor(t *testing.T) {
	for _, c := range []struct {
		page fleet.EventsPage
		want string
	}{
		{fleet.EventsPage{Events: []hostproto.Event{}, NextCursor: 0}, `{"events":[],"hasMore":false,"live":true,"nextCursor":0}`},
		{fleet.EventsPage{Events: []hostproto.Event{}, NextCursor: 7}, `{"events":[],"hasMore":false,"live":true,"nextCursor":7}`},
		{fleet.EventsPage{Events: []hostproto.Event{}, NextCursor: 100, PastEnd: true}, `{"events":[],"hasMore":false,"live":true}`},
	} {
		if b, _ := json.Marshal(toEventPage(c.page, true)); string(b) != c.want {
			t.Errorf("%+v: %s, want %s", c.page, b, c.want)
		}
	}
}
