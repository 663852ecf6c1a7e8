package tests

import (
	"bytes"
	"compress/flate"
	"context"
	"crypto/ed25519"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// Issue 31, item 3: a run's egress ledger through Fleet, on both stores:
// mirrored at the run's end, paged with the events' conventions, verified,
// summarised on the run, scoped as the run, and its alerts listed for an
// admin.

func TestEgressLedgerThroughTheAPI(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { egressLedgerThroughTheAPI(t, kind) })
	}
}

func egressLedgerThroughTheAPI(t *testing.T, kind string) {
	s := newStack(t, kind, stackOptions{})
	host, alice, id, child := s.aliceRun(t)
	bob := s.mint(t, "bob", "*", "*")
	leak := egress.Record{Via: egress.ViaProxy, Authority: "paste.example.com:443", Method: "POST", Path: "/p?k=*&v=*",
		Status: 403, BytesUp: 64, Keys: []string{"acme/API_KEY"}, Action: egress.Blocked, Reason: egress.AlertRealValue, Alert: egress.AlertRealValue}
	host.AddEgress(child,
		egress.Record{Via: egress.ViaProxy, Authority: "api.example.com:443", Method: "GET", Path: "/v1/items?page=*", Status: 200,
			BytesUp: 120, BytesDown: 2048, DurationUs: 3100, Keys: []string{"acme/API_KEY"}, Action: egress.Substituted},
		egress.Record{Via: egress.ViaDNS, Authority: "exfil.example.net", Action: egress.Blocked, Reason: "name_not_granted"},
		egress.Record{Via: egress.ViaProxy, Authority: "db.example.com:5432", Method: "CONNECT", BytesUp: 10, BytesDown: 20, Action: egress.Tunnelled},
		leak)
	host.SetRun(child, hostproto.StatusSucceeded, new(int), "")
	if rep := s.sweep(t); rep.Drained != 1 || rep.Egress != 4 {
		t.Fatalf("sweep = %+v", rep)
	}

	// GET: the summary, and the ledger's link.
	var got fleetapi.RunAnswer
	decodeAnswer(t, s.must(t, http.StatusOK, "GET", "/fleet/runs/"+id, alice, ""), &got)
	sum := got.Run.Egress
	if sum == nil || sum.Requests != 4 || sum.Blocked != 2 || sum.Alerts != 1 || sum.BytesDown != 2068 || len(sum.Authorities) != 4 ||
		got.Run.Links.Egress != s.srv.URL+"/fleet/runs/"+id+"/egress" {
		t.Fatalf("GET's egress %+v, links %+v", sum, got.Run.Links)
	}

	// Pages, in ledger order, each record as the host wrote it.
	onHost, seal := host.Egress(child)
	var all []egress.Record
	for _, c := range []struct {
		query   string
		seqs    string
		next    string
		hasMore bool
	}{
		{"?limit=3", "[1 2 3]", "3", true},
		{"?cursor=3&limit=3", "[4]", "4", false},
		{"?cursor=4", "[]", "4", false},
		{"?cursor=5", "[]", "none", false},
	} {
		var page fleetapi.EgressPage
		decodeAnswer(t, s.must(t, http.StatusOK, "GET", "/fleet/runs/"+id+"/egress"+c.query, alice, ""), &page)
		var seqs []int64
		for _, r := range page.Records {
			seqs = append(seqs, r.Seq)
			var rec egress.Record
			b, _ := json.Marshal(r)
			json.Unmarshal(b, &rec)
			all = append(all, rec)
		}
		next := "none"
		if page.NextCursor != nil {
			next = fmt.Sprint(*page.NextCursor)
		}
		if fmt.Sprint(seqs) != c.seqs && !(c.seqs == "[]" && seqs == nil) || next != c.next || page.HasMore != c.hasMore || page.Live ||
			page.Summary == nil || page.Summary.Alerts != 1 || page.Seal == nil || page.Seal.Count != 4 || page.Seal.LastHash != seal.LastHash {
			t.Fatalf("%s: seqs %v, next %s, page %+v", c.query, seqs, next, page)
		}
	}
	if !reflect.DeepEqual(all, onHost) {
		t.Fatalf("the records through Fleet differ from the host's:\n%+v\n%+v", all, onHost)
	}

	var verified fleetapi.EgressPage
	decodeAnswer(t, s.must(t, http.StatusOK, "GET", "/fleet/runs/"+id+"/egress?verify=true&limit=1", alice, ""), &verified)
	if v := verified.Verification; v == nil || !v.OK || v.Records != 4 || !v.Sealed || v.HostID != "h1" || v.LedgerKey != host.LedgerKey() {
		t.Fatalf("verification %+v", verified.Verification)
	}

	// The run's scope: another owner gets GET's 404, word for word.
	runFor := s.must(t, http.StatusNotFound, "GET", "/fleet/runs/"+id, bob, "")
	if ledger := s.must(t, http.StatusNotFound, "GET", "/fleet/runs/"+id+"/egress?verify=true", bob, ""); ledger.raw != runFor.raw {
		t.Fatalf("another owner's ledger: %s, its run: %s", ledger.raw, runFor.raw)
	}
	for _, q := range []string{"?limit=0", "?limit=1001", "?cursor=-1", "?cursor=x", "?verify=2", "?after=1"} {
		if a := s.do(t, "GET", "/fleet/runs/"+id+"/egress"+q, alice, ""); a.status != http.StatusBadRequest || a.body["code"] != "invalid_request" {
			t.Errorf("%s: %d %s, want 400 invalid_request", q, a.status, a.raw)
		}
	}

	// The alerts listing: an admin's, the refusal of the admin routes to
	// anyone else.
	quiet := s.must(t, http.StatusCreated, "POST", "/fleet/runs", bob, `{"agent":"shell"}`)
	host.AddEgress(quiet.str("childRunId"), egress.Record{Via: egress.ViaProxy, Authority: "api.example.com:443", Action: egress.Forwarded})
	host.SetRun(quiet.str("childRunId"), hostproto.StatusSucceeded, new(int), "")
	s.sweep(t)
	var alerted fleetapi.RunPage
	decodeAnswer(t, s.must(t, http.StatusOK, "GET", "/fleet/runs?alerts=true", adminToken, ""), &alerted)
	if len(alerted.Runs) != 1 || alerted.Runs[0].FleetRunID != id || alerted.Runs[0].Egress.Alerts != 1 || alerted.HasMore {
		t.Fatalf("alerted runs %+v", alerted)
	}
	adminView := s.must(t, http.StatusForbidden, "GET", "/fleet/callers", alice, "")
	if a := s.must(t, http.StatusForbidden, "GET", "/fleet/runs?alerts=true", alice, ""); a.body["code"] != adminView.body["code"] {
		t.Fatalf("a caller's alerts listing: %s; an admin route answers it %s", a.raw, adminView.raw)
	}
	if a := s.must(t, http.StatusOK, "GET", "/fleet/runs?alerts=false", alice, ""); len(a.body["runs"].([]any)) != 1 {
		t.Fatalf("alerts=false is the caller's own listing: %s", a.raw)
	}
}

// decodeAnswer decodes an answer strictly into its fleetapi type.
func decodeAnswer(t *testing.T, a answer, v any) {
	t.Helper()
	if _, err := roundTrip([]byte(a.raw), v, json.Marshal); err != nil {
		t.Fatalf("%v: %s", err, a.raw)
	}
}

// rewriteChunk rewrites, in DynamoDB itself, the egress chunk of run id
// that holds record seq (its stored form: raw DEFLATE of uvarint-length
// JSON records, keyed by its last seq, first in "first"), as change gives
// its records back: what an attacker with write access to the table does.
func rewriteChunk(t *testing.T, table, id string, seq int64, change func([][]byte) [][]byte) {
	t.Helper()
	db, ctx := moto.DynamoDB(), context.Background()
	out, err := db.Query(ctx, &dynamodb.QueryInput{TableName: aws.String(table), KeyConditionExpression: aws.String("fleetRunId = :id"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":id": &types.AttributeValueMemberS{Value: id}}, ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range out.Items {
		firstAttr, chunk := it["first"].(*types.AttributeValueMemberN)
		if !chunk {
			continue // the head
		}
		last, _ := strconv.ParseInt(it["seq"].(*types.AttributeValueMemberN).Value, 10, 64)
		first, _ := strconv.ParseInt(firstAttr.Value, 10, 64)
		if seq < first || seq > last {
			continue
		}
		raw, err := io.ReadAll(flate.NewReader(bytes.NewReader(it["data"].(*types.AttributeValueMemberB).Value)))
		if err != nil {
			t.Fatal(err)
		}
		var recs [][]byte
		for len(raw) > 0 {
			n, w := binary.Uvarint(raw)
			recs = append(recs, raw[w:w+int(n)])
			raw = raw[w+int(n):]
		}
		recs = change(recs)
		var packed []byte
		for _, r := range recs {
			packed = append(binary.AppendUvarint(packed, uint64(len(r))), r...)
		}
		var deflated bytes.Buffer
		w, _ := flate.NewWriter(&deflated, flate.BestCompression)
		w.Write(packed)
		w.Close()
		it["data"] = &types.AttributeValueMemberB{Value: deflated.Bytes()}
		it["seq"] = &types.AttributeValueMemberN{Value: strconv.FormatInt(first+int64(len(recs))-1, 10)}
		if _, err := db.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(table),
			Key: map[string]types.AttributeValue{"fleetRunId": &types.AttributeValueMemberS{Value: id}, "seq": &types.AttributeValueMemberN{Value: strconv.FormatInt(last, 10)}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: it}); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("no chunk of %s holds record %d", id, seq)
}

// TestEgressVerificationNamesTamperingInDynamoDB: one field of one record
// altered in the egress table itself, a record dropped from it, or the
// ledger sealed by another host's key: ?verify=true says which record
// fails, or that the seal does.
func TestEgressVerificationNamesTamperingInDynamoDB(t *testing.T) {
	other := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))
	for _, c := range []struct {
		name      string
		onHost    func(h *fakehost.Host)
		inTable   func(recs [][]byte) [][]byte
		failedSeq float64
		problem   string
	}{
		{name: "untouched"},
		{name: "one field of one record altered", failedSeq: 3, problem: "record 3 does not match its hash",
			inTable: func(recs [][]byte) [][]byte {
				recs[2] = bytes.Replace(recs[2], []byte(`"status":201`), []byte(`"status":200`), 1) // record 3 was a 201
				return recs
			}},
		{name: "a record dropped", failedSeq: 3, problem: "record 3 is missing",
			inTable: func(recs [][]byte) [][]byte { return append(recs[:2:2], recs[3:]...) }},
		{name: "sealed by another host's key", problem: "signature does not verify with the host's ledger key",
			onHost: func(h *fakehost.Host) { h.SignLedgersWith(other) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newStack(t, "dynamodb", stackOptions{})
			host, alice, id, child := s.aliceRun(t)
			host.AddEgress(child, ledgerRecords(0, 6)...)
			if c.onHost != nil {
				c.onHost(host)
			}
			host.SetRun(child, hostproto.StatusSucceeded, new(int), "")
			if rep := s.sweep(t); rep.Drained != 1 {
				t.Fatalf("sweep = %+v", rep)
			}
			if c.inTable != nil {
				rewriteChunk(t, s.app.Config.Tables.Egress, id, 3, c.inTable)
			}
			v, _ := s.must(t, http.StatusOK, "GET", "/fleet/runs/"+id+"/egress?verify=true", alice, "").body["verification"].(map[string]any)
			failed, _ := v["failedSeq"].(float64)
			problem, _ := v["problem"].(string)
			if (v["ok"] == true) != (c.problem == "") || failed != c.failedSeq || !strings.Contains(problem, c.problem) || v["ledgerKey"] != host.LedgerKey() {
				t.Fatalf("verification %v; want failedSeq %v and a problem saying %q", v, c.failedSeq, c.problem)
			}
		})
	}
}
