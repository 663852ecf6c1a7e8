package dynamostore_test

import (
	"bytes"
	"compress/flate"
	"context"
	"io"
	"maps"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
	"github.com/runfleet/runfleet/tests/kit/storetest"
)

// The items as the store wrote them before its records had types of their
// own: attribute names and value forms are a contract with
// tables already in use.
var (
	storedHostItem = map[string]types.AttributeValue{
		"id":            s("h-stored"),
		"v":             n("1"),
		"baseUrl":       s("https://h-stored.example.test:7070"),
		"credentialRef": s("cred-h-stored"),
		"labels":        &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"gpu": s("a100"), "zone": s("eu")}},
		"localPaths":    l(s("/srv/work/h-stored"), s("/srv/other")),
		"caPem":         s("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
		"enabled":       b(true),
		"createdAt":     n("1777863721123456789"),
		"probe": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
			"status":    s("ok"),
			"at":        n("1777863722123456789"),
			"latencyMs": n("42"),
			"version":   s("1.2.3"),
			"agents":    l(s("claude"), s("shell")),
			"features":  &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"secretsProxy": b(true), "execRequire": b(true)}},
			"ca": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
				"notAfter": n("1809399721123456789"), "successorNotAfter": n("1785639721123456789"),
			}},
			"draining": b(true),
			"idle":     b(true),
			"storage": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
				"freeBytes": n("3221225472"), "minFreeBytes": n("1073741824"), "low": b(true),
			}},
			"limits": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
				"enforced": s("cgroup2"), "memoryBytes": n("2147483648"), "pids": n("512"), "cpu": n("1.5"), "detail": s("per task"),
			}},
			"load": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
				"active": n("0"), "maxConcurrent": n("4"),
			}},
			"detail":    s("ok after 1 retry"),
			"ledgerKey": s("ed25519:11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="),
		}},
	}
	storedEventItem = map[string]types.AttributeValue{
		"fleetRunId": s("r-stored"),
		"sequence":   n("7"),
		"v":          n("1"),
		"type":       s("output"),
		"data":       s(`"hello"`),
		"ts":         n("1777863721123456789"),
		"expiresAt":  n("1780455721"),
	}
	// A chunk of the ledger mirror, keyed by its last seq; its data (raw
	// DEFLATE of storedEgressRaw) is checked by inflating it, since the
	// compressor's bytes are not a contract.
	storedEgressChunk = map[string]types.AttributeValue{
		"fleetRunId": s("r-stored"),
		"seq":        n("8"),
		"v":          n("1"),
		"first":      n("7"),
		"expiresAt":  n("1780455721"),
	}
	// storedEgressRaw is the chunk inflated: per record its length
	// (uvarint) and its JSON.
	storedEgressRaw  = "\x19" + `{"seq":7,"path":"/a?q=*"}` + "\x09" + `{"seq":8}`
	storedEgressHead = map[string]types.AttributeValue{
		"fleetRunId":   s("r-stored"),
		"seq":          n("0"),
		"v":            n("1"),
		"version":      n("1"),
		"cursor":       n("8"),
		"summary":      s(`{"requests":8}`),
		"seal":         s(`{"count":8}`),
		"hostId":       s("h-stored"),
		"alerts":       n("1"),
		"firstAlertAt": n("1777863721123456789"),
		"alerted":      s("1"),
		"alertKey":     s("2026-05-04T03:02:01.123456789Z#r-stored"),
		"updatedAt":    n("1777863721123456789"),
		"expiresAt":    n("1780455721"),
	}
	// A run's brokered keys are a list of maps; their expiry is
	// "valueExpiresAt" in nanoseconds (not the TTL), the sealed value B.
	storedRunItem = map[string]types.AttributeValue{
		"fleetRunId":        s("r-stored"),
		"v":                 n("1"),
		"ownerId":           s("alice"),
		"hostId":            s("h-stored"),
		"createdAt":         s("2026-05-04T03:02:01.123456789Z#r-stored"),
		"idempotencyKey":    s("k-stored"),
		"repository":        s("acme/app"),
		"childRunId":        s("child-stored"),
		"status":            s("running"),
		"attempt":           n("1"),
		"agent":             s("shell"),
		"updatedAt":         n("1777863781123456789"),
		"deadline":          n("1777863751123456789"),
		"eventCursor":       n("7"),
		"live":              s("1"),
		"eventsExpireAfter": n("1780455721000000000"),
		"brokered": l(
			&types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
				"projectId": s("acme"), "key": s("GITHUB_TOKEN"), "kind": s("githubApp"),
				"valueExpiresAt": n("1777867321123456789"), "sealed": bin(0, 1, 0xfe, 0xff),
				"revokedAt": n("1777863841123456789"),
			}},
			&types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
				"projectId": s("acme"), "key": s("GOOGLE_TOKEN"), "kind": s("oauth2"),
				"valueExpiresAt": n("1777866721123456789"),
			}},
		),
		"version":  n("1"),
		"allShard": s("0"),
	}
	// A run waiting for capacity: no hostId (an index key cannot be
	// empty), no live key (a queued run is not live), the queue index's
	// keys qp and qk (class, "#", then store.QueueOrder) and its
	// projected qu (Until, nanoseconds), its wait a map whose times and
	// timeout are nanoseconds. Its request (raw DEFLATE, B) is checked by inflating
	// it, as a chunk's data is.
	storedQueuedRunItem = map[string]types.AttributeValue{
		"fleetRunId":     s("r-queued"),
		"v":              n("1"),
		"ownerId":        s("bob"),
		"createdAt":      s("2026-05-04T03:02:01.123456789Z#r-queued"),
		"idempotencyKey": s("k-queued"),
		"status":         s("queued"),
		"agent":          s("claude"),
		"updatedAt":      n("1777863781123456789"),
		"queue": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
			"class": s("claude?pool=build"), "priority": n("5"), "since": n("1777863721123456789"),
			"timeout": n("1800000000000"), "until": n("1777865521123456789"), "offers": n("1"),
		}},
		"qp":       s("q"),
		"qk":       s("claude?pool=build#095|01777863721123456789|r-queued"),
		"qu":       n("1777865521123456789"),
		"version":  n("1"),
		"allShard": s("0"),
	}
	storedQueuedRequest = `{"agent":"claude","prompt":"hi"}`
	// A run that waited and started: out of the queue index, its wait
	// kept with where and when it started, its request gone.
	storedWaitedRunItem = map[string]types.AttributeValue{
		"fleetRunId": s("r-waited"),
		"v":          n("1"),
		"ownerId":    s("bob"),
		"hostId":     s("h-stored"),
		"createdAt":  s("2026-05-04T03:02:01.123456789Z#r-waited"),
		"childRunId": s("child-waited"),
		"status":     s("running"),
		"attempt":    n("1"),
		"agent":      s("claude"),
		"updatedAt":  n("1777863841123456789"),
		"deadline":   n("1777863871123456789"),
		"live":       s("1"),
		"queue": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
			"class": s("claude"), "priority": n("-3"), "since": n("1777863721123456789"),
			"timeout": n("3600000000000"), "until": n("1777867321123456789"),
			"startedAt": n("1777863841123456789"), "startedOn": s("h-stored"),
		}},
		"version":  n("1"),
		"allShard": s("0"),
	}
	// A broker state: no expiresAt (the TTL never reaps it), the sealed
	// tokens B.
	storedBrokerItem = map[string]types.AttributeValue{
		"id":                 s("#broker#acme/GOOGLE_TOKEN"),
		"v":                  n("1"),
		"generation":         n("1"),
		"sealedRefreshToken": bin(0, 1, 2, 0xff),
		"sealedAccessToken":  bin(0xfe, 0, 3),
		"accessExpiresAt":    n("1777867321123456789"),
		"seed":               s("seed-fingerprint"),
		"holder":             s("holder-stored"),
		"leaseUntil":         n("1777864021123456789"),
		"updatedAt":          n("1777863721123456789"),
	}
)

// TestStoredFormUnchanged: the store writes a host with its probe, an
// event, a ledger mirror's chunk and head, a run with brokered keys, a
// run waiting for capacity and one that waited, and a broker state as the
// items above, and reads those items back as the records (the waiting
// one in the queue index too).
func TestStoredFormUnchanged(t *testing.T) {
	ctx := context.Background()
	names := dynamostore.Prefixed(motoserver.Unique("form") + "-")
	st, err := dynamostore.New(moto.DynamoDB(), dynamostore.Config{Tables: names, Clock: clock.NewFake(storetest.StoredFormAt)})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTables(ctx); err != nil {
		t.Fatal(err)
	}
	db := moto.DynamoDB()

	h, ev := storetest.StoredFormHost(), storetest.StoredFormEvent()
	bare := h
	bare.Probe = nil
	if err := st.CreateHost(ctx, bare); err != nil {
		t.Fatal(err)
	}
	if err := st.RecordProbe(ctx, h.ID, *h.Probe); err != nil {
		t.Fatal(err)
	}
	if err := st.PutEvents(ctx, []store.Event{ev}); err != nil {
		t.Fatal(err)
	}
	recs, head := storetest.StoredFormEgress()
	if err := st.PutEgress(ctx, head.FleetRunID, recs, head.ExpiresAt); err != nil {
		t.Fatal(err)
	}
	put := head
	put.Version = 0
	if _, err := st.PutEgressHead(ctx, put); err != nil {
		t.Fatal(err)
	}
	storetest.PutStoredForm(t, st)
	written := rawItem(t, names.Hosts, map[string]types.AttributeValue{"id": s(h.ID)})
	delete(written, "writeToken") // random per create (ownwrites.go)
	sameItem(t, "host item written", written, storedHostItem)
	sameItem(t, "event item written", rawItem(t, names.Events,
		map[string]types.AttributeValue{"fleetRunId": s(ev.FleetRunID), "sequence": n("7")}), storedEventItem)

	chunk := rawItem(t, names.Egress, map[string]types.AttributeValue{"fleetRunId": s(head.FleetRunID), "seq": n("8")})
	data, ok := chunk["data"].(*types.AttributeValueMemberB)
	if !ok {
		t.Fatalf("chunk data: %T, want B", chunk["data"])
	}
	if raw, err := io.ReadAll(flate.NewReader(bytes.NewReader(data.Value))); err != nil || string(raw) != storedEgressRaw {
		t.Errorf("chunk data inflated: %q (%v), want %q", raw, err, storedEgressRaw)
	}
	delete(chunk, "data")
	sameItem(t, "egress chunk written", chunk, storedEgressChunk)
	writtenHead := rawItem(t, names.Egress, map[string]types.AttributeValue{"fleetRunId": s(head.FleetRunID), "seq": n("0")})
	delete(writtenHead, "writeToken")
	sameItem(t, "egress head written", writtenHead, storedEgressHead)
	run, brokerState := storetest.StoredFormRun(), storetest.StoredFormBrokerState()
	writtenRun := rawItem(t, names.Runs, map[string]types.AttributeValue{"fleetRunId": s(run.FleetRunID)})
	delete(writtenRun, "writeToken")
	sameItem(t, "run item written", writtenRun, storedRunItem)
	writtenQueued := rawItem(t, names.Runs, map[string]types.AttributeValue{"fleetRunId": s("r-queued")})
	delete(writtenQueued, "writeToken")
	queueMap, _ := writtenQueued["queue"].(*types.AttributeValueMemberM)
	if queueMap == nil {
		t.Fatalf("queued run's queue: %T, want M", writtenQueued["queue"])
	}
	queueMap = &types.AttributeValueMemberM{Value: maps.Clone(queueMap.Value)}
	req, ok := queueMap.Value["request"].(*types.AttributeValueMemberB)
	if !ok {
		t.Fatalf("queued run's request: %T, want B", queueMap.Value["request"])
	}
	if raw, err := io.ReadAll(flate.NewReader(bytes.NewReader(req.Value))); err != nil || string(raw) != storedQueuedRequest {
		t.Errorf("queued run's request inflated: %q (%v), want %q", raw, err, storedQueuedRequest)
	}
	delete(queueMap.Value, "request")
	writtenQueued["queue"] = queueMap
	sameItem(t, "queued run item written", writtenQueued, storedQueuedRunItem)
	writtenWaited := rawItem(t, names.Runs, map[string]types.AttributeValue{"fleetRunId": s("r-waited")})
	delete(writtenWaited, "writeToken")
	sameItem(t, "waited run item written", writtenWaited, storedWaitedRunItem)
	writtenBroker := rawItem(t, names.Idempotency, map[string]types.AttributeValue{"id": s(store.BrokerStateKey(brokerState.ID))})
	delete(writtenBroker, "writeToken") // random per commit (ownwrites.go)
	sameItem(t, "broker state item written", writtenBroker, storedBrokerItem)

	// Read back from the pinned items themselves, not from what this
	// store wrote; the chunk's data compressed by another compressor.
	var packed bytes.Buffer
	fw, err := flate.NewWriter(&packed, flate.HuffmanOnly)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(fw, storedEgressRaw); err != nil || fw.Close() != nil {
		t.Fatal("deflating the pinned chunk")
	}
	pinnedQueued := maps.Clone(storedQueuedRunItem)
	pinnedQueue := maps.Clone(storedQueuedRunItem["queue"].(*types.AttributeValueMemberM).Value)
	var packedRequest bytes.Buffer
	fw, err = flate.NewWriter(&packedRequest, flate.HuffmanOnly)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(fw, storedQueuedRequest); err != nil || fw.Close() != nil {
		t.Fatal("deflating the pinned request")
	}
	pinnedQueue["request"] = &types.AttributeValueMemberB{Value: packedRequest.Bytes()}
	pinnedQueued["queue"] = &types.AttributeValueMemberM{Value: pinnedQueue}
	pinnedChunk := maps.Clone(storedEgressChunk)
	pinnedChunk["data"] = &types.AttributeValueMemberB{Value: packed.Bytes()}
	for _, it := range []map[string]types.AttributeValue{pinnedChunk, storedEgressHead} {
		if _, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(names.Egress), Item: it}); err != nil {
			t.Fatal(err)
		}
	}
	for table, it := range map[string]map[string]types.AttributeValue{
		names.Hosts: storedHostItem, names.Events: storedEventItem, names.Runs: storedRunItem, names.Idempotency: storedBrokerItem,
	} {
		if _, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: it}); err != nil {
			t.Fatal(err)
		}
	}
	for _, it := range []map[string]types.AttributeValue{pinnedQueued, storedWaitedRunItem} {
		if _, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(names.Runs), Item: it}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := st.GetHost(ctx, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	storetest.SameJSON(t, "host read", got, h)
	page, err := st.ListEvents(ctx, ev.FleetRunID, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	storetest.SameJSON(t, "events read", page.Events, []store.Event{ev})
	ledger, err := st.ListEgress(ctx, head.FleetRunID, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	storetest.SameJSON(t, "egress records read", ledger.Records, recs)
	gotHead, err := st.GetEgressHead(ctx, head.FleetRunID)
	if err != nil {
		t.Fatal(err)
	}
	storetest.SameJSON(t, "egress head read", gotHead, head)
	alerted, err := st.ListAlertedRuns(ctx, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	storetest.SameJSON(t, "alerted runs read", alerted.Heads, []store.EgressHead{head})
	gotRun, err := st.GetRun(ctx, run.FleetRunID)
	if err != nil {
		t.Fatal(err)
	}
	storetest.SameJSON(t, "run read", gotRun, run)
	runs, err := st.ListRuns(ctx, store.RunQuery{OwnerID: run.OwnerID})
	if err != nil {
		t.Fatal(err)
	}
	storetest.SameJSON(t, "runs listed", runs.Runs, []store.Run{run})
	for _, want := range []store.Run{storetest.StoredFormQueuedRun(), storetest.StoredFormWaitedRun()} {
		got, err := st.GetRun(ctx, want.FleetRunID)
		if err != nil {
			t.Fatal(err)
		}
		storetest.SameJSON(t, want.FleetRunID+" read", got, want)
	}
	queued := storetest.StoredFormQueuedRun()
	waiting, err := st.ListQueue(ctx, queued.Queue.Class, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	storetest.SameJSON(t, "queue read", waiting.Entries, []store.QueueEntry{{
		FleetRunID: queued.FleetRunID, Order: store.QueueOrder(*queued.Queue, queued.FleetRunID), Since: queued.Queue.Since,
		Until: queued.Queue.Until,
	}})
	gotBroker, err := st.GetBrokerState(ctx, brokerState.ID)
	if err != nil {
		t.Fatal(err)
	}
	storetest.SameJSON(t, "broker state read", gotBroker, brokerState)
}

func sameItem(t *testing.T, what string, got, want map[string]types.AttributeValue) {
	t.Helper()
	g, w := attrString(&types.AttributeValueMemberM{Value: got}), attrString(&types.AttributeValueMemberM{Value: want})
	if g != w {
		t.Errorf("%s:\n got  %s\n want %s", what, g, w)
	}
}

func n(v string) types.AttributeValue { return &types.AttributeValueMemberN{Value: v} }
func b(v bool) types.AttributeValue   { return &types.AttributeValueMemberBOOL{Value: v} }
func bin(v ...byte) types.AttributeValue {
	return &types.AttributeValueMemberB{Value: v}
}
func l(vs ...types.AttributeValue) types.AttributeValue {
	return &types.AttributeValueMemberL{Value: vs}
}
