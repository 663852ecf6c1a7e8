package runlog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// testdata/runs-v1.db was written by the run log of commit ba5355c, whose
// stored values were the host protocol's wire types (hostproto.StartRequest
// in a record, hostproto.Event per event). The log reads it, and writes the
// same values back byte for byte: the file's form did not move with the
// types.
func TestAFileOfLayoutVersion1ReadsAndWritesByteForByte(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runs.db")
	fixture, err := os.ReadFile("testdata/runs-v1.db")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, fixture, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	rec, err := l.Get("run-full")
	if err != nil {
		t.Fatal(err)
	}
	req := rec.Request
	if rec.Serial != 1 || rec.Status != "canceled" || rec.ExitCode == nil || *rec.ExitCode != 137 || rec.EndedAt == nil ||
		req.Deadline == nil || !req.Deadline.Equal(time.Date(2026, 11, 30, 12, 5, 0, 0, time.UTC)) ||
		req.Agent != "shell" || req.Prompt != "echo hi" || len(req.Argv) != 2 || req.Argv[1] != "é" ||
		req.CloneURL != "https://git.example/acme/app.git" || req.Env["A"] != "1" ||
		len(req.Secrets) != 2 || req.Secrets[0].Domains[0] != "api.example" || req.Secrets[1].Domains != nil {
		t.Fatalf("the stored run read as %+v", rec)
	}
	page, err := l.Page("run-full", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Events) != 2 || page.NextCursor != 2 || page.HasMore || page.Events[1].Type != "output" || string(page.Events[1].Data) != `"hello\r\n"` {
		t.Fatalf("the stored events read as %+v", page)
	}

	// Rewritten by this log, every value is the bytes the old log wrote.
	old := rawValues(t, l)
	for _, id := range []string{"run-full", "run-bare"} {
		if _, err := l.Update(id, nil); err != nil {
			t.Fatal(err)
		}
	}
	again, err := Open(filepath.Join(t.TempDir(), "fresh.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	for _, id := range []string{"run-full", "run-bare"} {
		rec, err := l.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		p, err := l.Page(id, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		var entries []Entry
		for _, e := range p.Events {
			entries = append(entries, Entry{Type: e.Type, Data: e.Data, TS: e.TS})
		}
		rec.Serial = 0
		if _, _, err := again.Create(rec, entries...); err != nil {
			t.Fatal(err)
		}
	}
	for name, got := range map[string]map[string][]byte{"rewritten": rawValues(t, l), "created afresh": rawValues(t, again)} {
		for key, want := range old {
			if !bytes.Equal(got[key], want) {
				t.Errorf("%s, %s is\n%s\nwant the old log's\n%s", name, key, got[key], want)
			}
		}
	}
}

// rawValues are the stored bytes of the log's runs and events, by bucket/key.
func rawValues(t *testing.T, l *Log) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := l.db.View(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketRuns).ForEach(func(k, v []byte) error {
			out["runs/"+string(k)] = bytes.Clone(v)
			return nil
		}); err != nil {
			return err
		}
		return tx.Bucket(bucketEvents).ForEachBucket(func(run []byte) error {
			return tx.Bucket(bucketEvents).Bucket(run).ForEach(func(k, v []byte) error {
				var e Event
				if err := json.Unmarshal(v, &e); err != nil {
					return err
				}
				out[fmt.Sprintf("events/%s/%d", run, e.Sequence)] = bytes.Clone(v)
				return nil
			})
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 4 {
		t.Fatalf("the log holds %d values, want the fixture's 2 runs and 2 events", len(out))
	}
	return out
}
