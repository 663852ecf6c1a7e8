package boltstore_test

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/boltstore"
	"github.com/runfleet/runfleet/tests/kit/storetest"
)

// The items as the store wrote them before its records had types of their
// own: the JSON is a contract with files already on disk.
const (
	storedHostJSON = `{"v":1,"id":"h-stored","baseUrl":"https://h-stored.example.test:7070","credentialRef":"cred-h-stored",` +
		`"labels":{"gpu":"a100","zone":"eu"},"localPaths":["/srv/work/h-stored","/srv/other"],` +
		`"caPem":"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n","enabled":true,"createdAt":"2026-05-04T03:02:01.123456789Z",` +
		`"probe":{"status":"ok","at":"2026-05-04T03:02:02.123456789Z","latencyMs":42,"version":"1.2.3","agents":["claude","shell"],` +
		`"features":{"secretsProxy":true,"execRequire":true},` +
		`"ca":{"notAfter":"2027-05-04T03:02:01.123456789Z","successorNotAfter":"2026-08-02T03:02:01.123456789Z"},` +
		`"draining":true,"idle":true,"storage":{"freeBytes":3221225472,"minFreeBytes":1073741824,"low":true},` +
		`"limits":{"enforced":"cgroup2","memoryBytes":2147483648,"pids":512,"cpu":1.5,"detail":"per task"},"load":{"active":0,"maxConcurrent":4},"detail":"ok after 1 retry",` +
		`"ledgerKey":"ed25519:11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="}}`
	storedEventJSON = `{"v":1,"fleetRunId":"r-stored","sequence":7,"type":"output","data":"hello","ts":"2026-05-04T03:02:01.123456789Z","expiresAt":1780455721}`
	// A ledger mirror's record keeps its data as a string: byte for byte.
	storedEgressJSON     = `{"v":1,"seq":7,"data":"{\"seq\":7,\"path\":\"/a?q=*\"}","expiresAt":1780455721}`
	storedEgressHeadJSON = `{"v":1,"fleetRunId":"r-stored","version":1,"cursor":8,"summary":"{\"requests\":8}","seal":"{\"count\":8}",` +
		`"hostId":"h-stored","alerts":1,"firstAlertAt":1777863721123456789,"updatedAt":"2026-05-04T03:02:01.123456789Z","expiresAt":1780455721}`
	// A run's brokered keys: the value's expiry "valueExpiresAt" (not a
	// TTL), the sealed value base64.
	storedRunJSON = `{"v":1,"fleetRunId":"r-stored","ownerId":"alice","hostId":"h-stored","childRunId":"child-stored","status":"running",` +
		`"attempt":1,"agent":"shell","repository":"acme/app","idempotencyKey":"k-stored","createdAt":"2026-05-04T03:02:01.123456789Z",` +
		`"updatedAt":"2026-05-04T03:03:01.123456789Z","deadline":"2026-05-04T03:02:31.123456789Z","eventCursor":7,"eventsExpireAfter":1780455721000000000,` +
		`"brokered":[{"projectId":"acme","key":"GITHUB_TOKEN","kind":"githubApp","valueExpiresAt":"2026-05-04T04:02:01.123456789Z","sealed":"AAH+/w==",` +
		`"revokedAt":"2026-05-04T03:04:01.123456789Z"},{"projectId":"acme","key":"GOOGLE_TOKEN","kind":"oauth2","valueExpiresAt":"2026-05-04T03:52:01.123456789Z"}],` +
		`"version":1}`
	// A run waiting for capacity: no host, its wait with the request
	// (base64) and the timeout in nanoseconds; and its queue entry,
	// runsQueue/<class>: store.QueueOrder -> its Until as text, "|", and its
	// hosts (none here: an unscoped caller's). It is
	// not in runsLive (a queued run is not live).
	storedQueuedRunJSON = `{"v":1,"fleetRunId":"r-queued","ownerId":"bob","hostId":"","status":"queued","agent":"claude","idempotencyKey":"k-queued",` +
		`"createdAt":"2026-05-04T03:02:01.123456789Z","updatedAt":"2026-05-04T03:03:01.123456789Z","deadline":"0001-01-01T00:00:00Z",` +
		`"queue":{"class":"claude?pool=build","priority":5,"since":"2026-05-04T03:02:01.123456789Z","timeout":1800000000000,` +
		`"until":"2026-05-04T03:32:01.123456789Z","offers":1,"request":"eyJhZ2VudCI6ImNsYXVkZSIsInByb21wdCI6ImhpIn0="},"version":1}`
	storedQueueClass = "claude?pool=build"
	storedQueueOrder = "095|01777863721123456789|r-queued"
	storedQueueUntil = "2026-05-04T03:32:01.123456789Z"
	// A run that waited and started: its wait kept, with where and when.
	storedWaitedRunJSON = `{"v":1,"fleetRunId":"r-waited","ownerId":"bob","hostId":"h-stored","childRunId":"child-waited","status":"running",` +
		`"attempt":1,"agent":"claude","createdAt":"2026-05-04T03:02:01.123456789Z","updatedAt":"2026-05-04T03:04:01.123456789Z",` +
		`"deadline":"2026-05-04T03:04:31.123456789Z","queue":{"class":"claude","priority":-3,"since":"2026-05-04T03:02:01.123456789Z",` +
		`"timeout":3600000000000,"until":"2026-05-04T04:02:01.123456789Z","startedAt":"2026-05-04T03:04:01.123456789Z","startedOn":"h-stored"},"version":1}`
	// A broker state, under its key in the idempotency bucket.
	storedBrokerJSON = `{"v":1,"id":"acme/GOOGLE_TOKEN","generation":1,"sealedRefreshToken":"AAEC/w==","sealedAccessToken":"/gAD",` +
		`"accessExpiresAt":"2026-05-04T04:02:01.123456789Z","seed":"seed-fingerprint","holder":"holder-stored",` +
		`"leaseUntil":"2026-05-04T03:07:01.123456789Z","updatedAt":"2026-05-04T03:02:01.123456789Z"}`
)

// TestStoredFormUnchanged: the store writes a host with its probe, an
// event, a ledger mirror's record and head, a run with brokered keys, a
// run waiting for capacity (with its queue entry) and one that waited,
// and a broker state as the JSON above, and reads that JSON back as the
// records.
func TestStoredFormUnchanged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fleet.db")
	h, ev := storetest.StoredFormHost(), storetest.StoredFormEvent()
	recs, head := storetest.StoredFormEgress()
	withStore(t, path, func(st *boltstore.Store) {
		bare := h
		bare.Probe = nil
		if err := st.CreateHost(t.Context(), bare); err != nil {
			t.Fatal(err)
		}
		if err := st.RecordProbe(t.Context(), h.ID, *h.Probe); err != nil {
			t.Fatal(err)
		}
		if err := st.PutEvents(t.Context(), []store.Event{ev}); err != nil {
			t.Fatal(err)
		}
		if err := st.PutEgress(t.Context(), head.FleetRunID, recs, head.ExpiresAt); err != nil {
			t.Fatal(err)
		}
		put := head
		put.Version = 0
		if _, err := st.PutEgressHead(t.Context(), put); err != nil {
			t.Fatal(err)
		}
		storetest.PutStoredForm(t, st)
	})
	run, brokerState := storetest.StoredFormRun(), storetest.StoredFormBrokerState()
	runKey, brokerKey := []byte(run.FleetRunID), []byte(store.BrokerStateKey(brokerState.ID))

	seq := binary.BigEndian.AppendUint64(nil, uint64(ev.Sequence))
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		hosts, events := tx.Bucket([]byte("hosts")), tx.Bucket([]byte("events")).Bucket([]byte(ev.FleetRunID))
		if got := string(hosts.Get([]byte(h.ID))); got != storedHostJSON {
			t.Errorf("host written:\n got  %s\n want %s", got, storedHostJSON)
		}
		if got := string(events.Get(seq)); got != storedEventJSON {
			t.Errorf("event written:\n got  %s\n want %s", got, storedEventJSON)
		}
		egress, heads := tx.Bucket([]byte("egress")).Bucket([]byte(head.FleetRunID)), tx.Bucket([]byte("egressHeads"))
		if got := string(egress.Get(seq)); got != storedEgressJSON {
			t.Errorf("egress record written:\n got  %s\n want %s", got, storedEgressJSON)
		}
		if got := string(heads.Get([]byte(head.FleetRunID))); got != storedEgressHeadJSON {
			t.Errorf("egress head written:\n got  %s\n want %s", got, storedEgressHeadJSON)
		}
		runs, idem := tx.Bucket([]byte("runs")), tx.Bucket([]byte("idempotency"))
		if got := string(runs.Get(runKey)); got != storedRunJSON {
			t.Errorf("run written:\n got  %s\n want %s", got, storedRunJSON)
		}
		for id, want := range map[string]string{"r-queued": storedQueuedRunJSON, "r-waited": storedWaitedRunJSON} {
			if got := string(runs.Get([]byte(id))); got != want {
				t.Errorf("run %s written:\n got  %s\n want %s", id, got, want)
			}
			if err := runs.Put([]byte(id), []byte(want)); err != nil {
				return err
			}
		}
		queue := tx.Bucket([]byte("runsQueue"))
		var entries []string
		err := queue.ForEachBucket(func(class []byte) error {
			return queue.Bucket(class).ForEach(func(order, v []byte) error {
				entries = append(entries, fmt.Sprintf("%s: %s -> %q", class, order, v))
				return nil
			})
		})
		if want := fmt.Sprintf("%s: %s -> %q", storedQueueClass, storedQueueOrder, storedQueueUntil+"|"); err != nil || len(entries) != 1 || entries[0] != want {
			t.Errorf("queue entries written: %q (%v), want [%s]", entries, err, want)
		}
		var live []string
		err = tx.Bucket([]byte("runsLive")).ForEach(func(id, _ []byte) error {
			live = append(live, string(id))
			return nil
		})
		if want := []string{"r-stored", "r-waited"}; err != nil || fmt.Sprint(live) != fmt.Sprint(want) {
			t.Errorf("live entries written: %q (%v), want %q", live, err, want)
		}
		if got := string(idem.Get(brokerKey)); got != storedBrokerJSON {
			t.Errorf("broker state written:\n got  %s\n want %s", got, storedBrokerJSON)
		}
		if err := runs.Put(runKey, []byte(storedRunJSON)); err != nil {
			return err
		}
		if err := idem.Put(brokerKey, []byte(storedBrokerJSON)); err != nil {
			return err
		}
		if err := egress.Put(seq, []byte(storedEgressJSON)); err != nil {
			return err
		}
		if err := heads.Put([]byte(head.FleetRunID), []byte(storedEgressHeadJSON)); err != nil {
			return err
		}
		// Read back from the pinned JSON itself, not from what this store
		// wrote.
		if err := hosts.Put([]byte(h.ID), []byte(storedHostJSON)); err != nil {
			return err
		}
		return events.Put(seq, []byte(storedEventJSON))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	withStore(t, path, func(st *boltstore.Store) {
		got, err := st.GetHost(t.Context(), h.ID)
		if err != nil {
			t.Fatal(err)
		}
		storetest.SameJSON(t, "host read", got, h)
		page, err := st.ListEvents(t.Context(), ev.FleetRunID, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		storetest.SameJSON(t, "events read", page.Events, []store.Event{ev})
		ledger, err := st.ListEgress(t.Context(), head.FleetRunID, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		storetest.SameJSON(t, "egress records read", ledger.Records, recs)
		if string(ledger.Records[0].Data) != string(recs[0].Data) {
			t.Errorf("egress record read: %s, want %s byte for byte", ledger.Records[0].Data, recs[0].Data)
		}
		gotHead, err := st.GetEgressHead(t.Context(), head.FleetRunID)
		if err != nil {
			t.Fatal(err)
		}
		storetest.SameJSON(t, "egress head read", gotHead, head)
		alerted, err := st.ListAlertedRuns(t.Context(), "", 10)
		if err != nil {
			t.Fatal(err)
		}
		storetest.SameJSON(t, "alerted runs read", alerted.Heads, []store.EgressHead{head})
		gotRun, err := st.GetRun(t.Context(), run.FleetRunID)
		if err != nil {
			t.Fatal(err)
		}
		storetest.SameJSON(t, "run read", gotRun, run)
		runs, err := st.ListRuns(t.Context(), store.RunQuery{OwnerID: run.OwnerID})
		if err != nil {
			t.Fatal(err)
		}
		storetest.SameJSON(t, "runs listed", runs.Runs, []store.Run{run})
		for _, want := range []store.Run{storetest.StoredFormQueuedRun(), storetest.StoredFormWaitedRun()} {
			got, err := st.GetRun(t.Context(), want.FleetRunID)
			if err != nil {
				t.Fatal(err)
			}
			storetest.SameJSON(t, want.FleetRunID+" read", got, want)
		}
		waiting, err := st.ListQueue(t.Context(), storedQueueClass, "", 10)
		if err != nil {
			t.Fatal(err)
		}
		queued := storetest.StoredFormQueuedRun()
		storetest.SameJSON(t, "queue read", waiting.Entries, []store.QueueEntry{{
			FleetRunID: queued.FleetRunID, Order: storedQueueOrder, Since: queued.Queue.Since, Until: queued.Queue.Until,
		}})
		gotBroker, err := st.GetBrokerState(t.Context(), brokerState.ID)
		if err != nil {
			t.Fatal(err)
		}
		storetest.SameJSON(t, "broker state read", gotBroker, brokerState)
	})
}

// withStore opens the store at path for fn, and closes it after (bbolt
// locks the file while it is open).
func withStore(t *testing.T, path string, fn func(*boltstore.Store)) {
	t.Helper()
	st, err := boltstore.Open(path, boltstore.WithClock(clock.NewFake(storetest.StoredFormAt)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	}()
	fn(st)
}
