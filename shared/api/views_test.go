package api

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
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
		`"limits":{"enforced":"cgroup2","memoryBytes":2147483648,"pids":512,"cpu":1.5,"detail":"per task"},"load":{"active":0,"maxConcurrent":4},"detail":"ok after 1 retry",` +
		`"ledgerKey":"ed25519:11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="}}`
	got, err := json.Marshal(toHostView(storetest.StoredFormHost(), true))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("host answer:\n got  %s\n want %s", got, want)
	}
}

// TestVerbOutcomesAnswerTheirStatus: a forwarded verb the host took is 200;
// one it refused, or that never reached it, is 409 and an error whose code
// is never empty (the host's, host_unavailable, host_refused) with what the
// host said kept; one whose outcome is unknown is 202 with its detail.
func TestVerbOutcomesAnswerTheirStatus(t *testing.T) {
	run := store.Run{FleetRunID: "fr-1", HostID: "h1", ChildRunID: "run-1", Status: hostproto.StatusSucceeded}
	l := linker{api: "https://api.example", stream: "https://stream.example"}
	for _, c := range []struct {
		name    string
		outcome hostproto.Outcome
		status  int
		want    string // the answer's JSON, less its run
	}{
		{"accepted", hostproto.Outcome{Accepted: hostproto.Accepted}, 200,
			`{"fleetRunId":"fr-1","accepted":true}`},
		{"refused", hostproto.Outcome{Accepted: hostproto.Refused, HostStatus: 409, Code: hostproto.CodeNotRunning, Detail: "the run has no live attempt"}, 409,
			`{"error":"host h1 refused the cancel of run fr-1 (not_running): the run has no live attempt","fleetRunId":"fr-1","accepted":false,"hostStatus":409,"code":"not_running","detail":"the run has no live attempt"}`},
		{"refused without a code", hostproto.Outcome{Accepted: hostproto.Refused, HostStatus: 403}, 409,
			`{"error":"host h1 refused the cancel of run fr-1 (host_refused)","fleetRunId":"fr-1","accepted":false,"hostStatus":403,"code":"host_refused"}`},
		{"never delivered", hostproto.OutcomeOf(&hostproto.TransportError{}), 409,
			`{"error":"host h1 could not be reached for the cancel of run fr-1 (host_unavailable): the host is unreachable; the request was not delivered","fleetRunId":"fr-1","accepted":false,"code":"host_unavailable","detail":"the host is unreachable; the request was not delivered"}`},
		{"unknown", hostproto.Outcome{Accepted: hostproto.Unknown, HostStatus: 500, Detail: "internal error"}, 202,
			`{"fleetRunId":"fr-1","accepted":"unknown","hostStatus":500,"detail":"internal error"}`},
	} {
		status, answer := toInteraction("cancel", fleet.Interaction{Outcome: c.outcome, Run: run}, l)
		b, err := json.Marshal(answer)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		json.Unmarshal(b, &m)
		if _, ok := m["run"]; !ok {
			t.Errorf("%s: no run in %s", c.name, b)
		}
		delete(m, "run")
		got, _ := json.Marshal(m)
		var want map[string]json.RawMessage
		json.Unmarshal([]byte(c.want), &want)
		wantJSON, _ := json.Marshal(want)
		if status != c.status || string(got) != string(wantJSON) {
			t.Errorf("%s: %d %s\nwant %d %s", c.name, status, got, c.status, wantJSON)
		}
	}
}

// TestRefusedDrainSaysWhatFleetRecorded: a drain the host did not take is
// a 409 that says Fleet recorded the drain all the same; a resume's does
// not (nothing changed).
func TestRefusedDrainSaysWhatFleetRecorded(t *testing.T) {
	never := hostproto.OutcomeOf(&hostproto.TransportError{})
	drained := store.Host{ID: "h1", Probe: &store.Probe{Status: "ok", Draining: true}}
	status, answer := toHostDrain("drain", fleet.HostDrain{Outcome: never, Host: drained})
	r, ok := answer.(fleetapi.HostDrainRefused)
	if status != 409 || !ok || r.Code != hostproto.ReasonHostUnavailable || !r.Draining || !strings.Contains(r.Error, "recorded the host draining") {
		t.Errorf("a drain never delivered: %d %+v", status, answer)
	}
	status, answer = toHostDrain("resume", fleet.HostDrain{Outcome: never, Host: store.Host{ID: "h1"}})
	if r, ok := answer.(fleetapi.HostDrainRefused); status != 409 || !ok || strings.Contains(r.Error, "recorded") {
		t.Errorf("a resume never delivered: %d %+v", status, answer)
	}
	idle := true
	status, answer = toHostDrain("drain", fleet.HostDrain{Outcome: hostproto.Outcome{Accepted: hostproto.Accepted},
		State: hostproto.DrainState{Draining: true, Idle: &idle}, Host: drained})
	if a, ok := answer.(fleetapi.HostDrain); status != 200 || !ok || !a.Draining || a.Idle == nil || !*a.Idle {
		t.Errorf("an accepted drain: %d %+v", status, answer)
	}
	status, _ = toHostDrain("drain", fleet.HostDrain{Outcome: hostproto.Outcome{Accepted: hostproto.Unknown}, Host: drained})
	if status != 202 {
		t.Errorf("a drain whose outcome is unknown: %d, want 202", status)
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

// sameShape fails unless a and b (struct types) have the same fields, in
// the same order, with the same JSON tags and field types' kinds: what
// keeps fleetapi's copy of a shared/egress type its JSON twin.
func sameShape(t *testing.T, a, b reflect.Type) {
	t.Helper()
	if a.NumField() != b.NumField() {
		t.Fatalf("%v has %d fields, %v %d", a, a.NumField(), b, b.NumField())
	}
	for i := range a.NumField() {
		fa, fb := a.Field(i), b.Field(i)
		if fa.Name != fb.Name || fa.Tag.Get("json") != fb.Tag.Get("json") || fa.Type.Kind() != fb.Type.Kind() {
			t.Errorf("field %d: %v %s `%s` vs %v %s `%s`", i, a, fa.Name, fa.Tag, b, fb.Name, fb.Tag)
		}
	}
}

// TestEgressTypesAreTheLedgersJSON: fleetapi's ledger record, summary and
// seal are shared/egress's, field for field, so a client hashes a record
// the API shows exactly as the host did; every field set, a record goes
// through the API's view to the very bytes egress.Record writes.
func TestEgressTypesAreTheLedgersJSON(t *testing.T) {
	sameShape(t, reflect.TypeFor[egress.Record](), reflect.TypeFor[fleetapi.EgressRecord]())
	sameShape(t, reflect.TypeFor[egress.Summary](), reflect.TypeFor[fleetapi.EgressSummary]())
	sameShape(t, reflect.TypeFor[egress.AuthoritySummary](), reflect.TypeFor[fleetapi.EgressAuthority]())
	sameShape(t, reflect.TypeFor[egress.Seal](), reflect.TypeFor[fleetapi.EgressSeal]())

	r := egress.Record{Seq: 3, TS: time.Date(2026, 5, 4, 3, 2, 1, 5, time.UTC), Via: egress.ViaSSH, Authority: "github.com:22",
		Method: "exec", Path: "/a?b=*&c=*", Command: "git-upload-pack 'acme/app.git'", Status: 200, BytesUp: 1, BytesDown: 2,
		DurationUs: 3, Keys: []string{"acme/GIT"}, Action: egress.Warned, Reason: "rule", Rule: "projects.acme.keys.GIT.rules[0]",
		Alert: egress.AlertForeignPlaceholder, Dropped: 4, Hash: strings.Repeat("ab", 32)}
	want, _ := json.Marshal(r)
	got, _ := json.Marshal(EgressRecordOf(r))
	if string(got) != string(want) {
		t.Fatalf("the API's record\n%s\nthe ledger's\n%s", got, want)
	}
	s := egress.Summary{Requests: 5, Blocked: 1, Warned: 1, BytesUp: 2, BytesDown: 3, Alerts: 1, Dropped: 1,
		Authorities: []egress.AuthoritySummary{{Authority: "github.com:22", Requests: 5, Blocked: 1, Keys: []string{"acme/GIT"}}}, OtherAuthorities: 2}
	want, _ = json.Marshal(s)
	got, _ = json.Marshal(toEgressSummary(&s))
	if string(got) != string(want) {
		t.Fatalf("the API's summary\n%s\nthe ledger's\n%s", got, want)
	}
	seal := egress.Seal{Count: 5, LastHash: "ab", Signature: "c2ln", PublicKey: "ed25519:x", SealedAt: r.TS}
	want, _ = json.Marshal(seal)
	got, _ = json.Marshal(toEgressSeal(&seal))
	if string(got) != string(want) {
		t.Fatalf("the API's seal\n%s\nthe ledger's\n%s", got, want)
	}
}

// TestEgressPageCursor: as an events page, nextCursor is there on every
// page but one past the mirror's end; summary and seal are null without a
// ledger, never left out.
func TestEgressPageCursor(t *testing.T) {
	for _, c := range []struct {
		page fleet.EgressPage
		want string
	}{
		{fleet.EgressPage{Records: []egress.Record{}, Live: true}, `{"records":[],"hasMore":false,"live":true,"nextCursor":0,"summary":null,"seal":null}`},
		{fleet.EgressPage{Records: []egress.Record{}, NextCursor: 9, PastEnd: true}, `{"records":[],"hasMore":false,"live":false,"summary":null,"seal":null}`},
	} {
		if b, _ := json.Marshal(toEgressPage(c.page)); string(b) != c.want {
			t.Errorf("%+v: %s, want %s", c.page, b, c.want)
		}
	}
}

// TestARunShowsItsBrokeredKeysNeverTheirTokens: GET of a run lists each
// brokered key with its kind, expiry and revocation; the sealed token the
// record keeps for the revocation is not in the answer, and the listing's
// runs carry no credentials.
func TestARunShowsItsBrokeredKeysNeverTheirTokens(t *testing.T) {
	exp := time.Date(2026, 3, 1, 13, 0, 0, 0, time.UTC)
	revoked := exp.Add(-30 * time.Minute)
	run := store.Run{FleetRunID: "fr-1", HostID: "h1", Status: hostproto.StatusSucceeded, Brokered: []store.BrokeredKey{
		{ProjectID: "acme", Key: "GITHUB_TOKEN", Kind: "githubApp", ExpiresAt: exp, Sealed: []byte("SEALED-TOKEN"), RevokedAt: &revoked},
		{ProjectID: "acme", Key: "SAAS_TOKEN", Kind: "oauth2", ExpiresAt: exp},
	}}
	l := linker{api: "https://api.example", stream: "https://stream.example"}
	b, err := json.Marshal(toRunAnswer(fleet.RunState{Run: run}, l))
	if err != nil {
		t.Fatal(err)
	}
	const want = `"credentials":[{"projectId":"acme","key":"GITHUB_TOKEN","kind":"githubApp","expiresAt":"2026-03-01T13:00:00Z","revokedAt":"2026-03-01T12:30:00Z"},` +
		`{"projectId":"acme","key":"SAAS_TOKEN","kind":"oauth2","expiresAt":"2026-03-01T13:00:00Z"}]`
	if !strings.Contains(string(b), want) || strings.Contains(string(b), "SEALED") || strings.Contains(string(b), "U0VBTEVE") {
		t.Fatalf("answer %s\nwant it to hold %s and no sealed token", b, want)
	}
	if page, _ := json.Marshal(toRunPage(store.RunPage{Runs: []store.Run{run}}, l)); strings.Contains(string(page), "credentials") {
		t.Fatalf("the listing shows credentials: %s", page)
	}
}

// TestCredentialUnavailableIsA409WithItsDetails: the refusal of a key
// Fleet could not mint answers 409, its code and the
// fleetapi.CredentialUnavailable details.
func TestCredentialUnavailableIsA409WithItsDetails(t *testing.T) {
	if fleet.CodeCredentialUnavailable != fleetapi.CodeCredentialUnavailable {
		t.Fatalf("fleet's code %q, the API's %q", fleet.CodeCredentialUnavailable, fleetapi.CodeCredentialUnavailable)
	}
	err := &fleet.Error{Kind: fleet.KindConflict, Code: fleet.CodeCredentialUnavailable, Message: "secrets[0]: Fleet could not mint acme/GH",
		Details: fleet.CredentialRefusal{ProjectID: "acme", Key: "GH", Kind: "githubApp", ProviderStatus: 404}}
	status, body, fault := ErrorStatus(err)
	if status != 409 || fault || body.Code != "credential_unavailable" ||
		string(body.Details) != `{"projectId":"acme","key":"GH","kind":"githubApp","providerStatus":404}` {
		t.Fatalf("%d %+v (details %s) fault %v", status, body, body.Details, fault)
	}
}

// TestRunQueueView: a run's wait as answers show it: its position only
// while it waits, its wait so far up to the request's time, until it
// started, or until it ended without starting; none on a run that never
// asked to wait.
func TestRunQueueView(t *testing.T) {
	since := time.Date(2026, 5, 4, 3, 0, 0, 0, time.UTC)
	q := store.QueueInfo{Class: "shell?pool=a", Priority: 5, Since: since, Timeout: 30 * time.Minute, Until: since.Add(30 * time.Minute)}
	now := since.Add(90 * time.Second)
	view := func(r store.Run, position int) string {
		b, err := json.Marshal(toRunQueue(r, position, now))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	const head = `{"class":"shell?pool=a",`
	const times = `"since":"2026-05-04T03:00:00Z","timeout":"30m0s","until":"2026-05-04T03:30:00Z"`
	waiting := store.Run{FleetRunID: "fr-1", Status: store.StatusQueued, Queue: &q}
	if got, want := view(waiting, 3), head+`"position":3,"priority":5,`+times+`,"waitedSeconds":90}`; got != want {
		t.Errorf("waiting:\n got  %s\n want %s", got, want)
	}
	started := waiting
	sq := q
	at := since.Add(40 * time.Second)
	sq.StartedAt, sq.StartedOn = &at, "h2"
	started.Status, started.HostID, started.Queue = hostproto.StatusRunning, "h2", &sq
	if got, want := view(started, 3), head+`"priority":5,`+times+`,"startedAt":"2026-05-04T03:00:40Z","startedOn":"h2","waitedSeconds":40}`; got != want {
		t.Errorf("started:\n got  %s\n want %s", got, want)
	}
	canceled := waiting
	end := since.Add(10 * time.Second)
	canceled.Status, canceled.EndedAt, canceled.Drained = store.StatusCanceled, &end, true
	if got, want := view(canceled, 0), head+`"priority":5,`+times+`,"waitedSeconds":10}`; got != want {
		t.Errorf("canceled:\n got  %s\n want %s", got, want)
	}
	if v := toRunQueue(store.Run{FleetRunID: "fr-2", Status: hostproto.StatusRunning}, 0, now); v != nil {
		t.Errorf("a run that never waited: %+v", v)
	}
}

// TestDispatchQueueDecodes: queue.timeout is a Go duration, required;
// anything else is a 400 naming it.
func TestDispatchQueueDecodes(t *testing.T) {
	r, err := toDispatchRequest(fleetapi.DispatchRequest{Agent: "shell", Queue: &fleetapi.QueueRequest{Timeout: "1h30m", Priority: -3}})
	if err != nil || r.Queue == nil || r.Queue.Timeout != 90*time.Minute || r.Queue.Priority != -3 {
		t.Fatalf("decoded %+v, %v", r.Queue, err)
	}
	if r, err := toDispatchRequest(fleetapi.DispatchRequest{Agent: "shell"}); err != nil || r.Queue != nil {
		t.Fatalf("without queue: %+v, %v", r.Queue, err)
	}
	for _, timeout := range []string{"", "soon", "30"} {
		_, err := toDispatchRequest(fleetapi.DispatchRequest{Agent: "shell", Queue: &fleetapi.QueueRequest{Timeout: timeout}})
		var re *requestError
		if !errors.As(err, &re) || re.status != 400 || !strings.Contains(err.Error(), "queue.timeout") {
			t.Errorf("timeout %q: %v, want a 400 naming queue.timeout", timeout, err)
		}
	}
}
