package dynamostore

import (
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

func sv(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
func nv(v string) types.AttributeValue { return &types.AttributeValueMemberN{Value: v} }

// Each size below is worked out by hand from the documented rules.
func TestItemSize(t *testing.T) {
	for _, tc := range []struct {
		name string
		it   item
		want int
	}{
		{"string: name + bytes", item{"id": sv("abc")}, 2 + 3},
		{"utf-8 counts bytes", item{"s": sv("é")}, 1 + 2},
		{"number 123: 3 digits -> 2 bytes + 1", item{"n": nv("123")}, 1 + 3},
		{"number 1500: trailing zeros trimmed -> 15", item{"n": nv("1500")}, 1 + 2},
		{"number 0.0012: leading zeros trimmed -> 12", item{"n": nv("0.0012")}, 1 + 2},
		{"number -12.50 -> 125", item{"n": nv("-12.50")}, 1 + 3},
		{"number 0", item{"n": nv("0")}, 1 + 1},
		{"19-digit nanoseconds: 10 + 1", item{"ts": nv("1772600767123456789")}, 2 + 11},
		{"bool and null: 1 byte", item{"b": &types.AttributeValueMemberBOOL{Value: true}, "z": &types.AttributeValueMemberNULL{Value: true}}, 1 + 1 + 1 + 1},
		{"binary", item{"b": &types.AttributeValueMemberB{Value: []byte{1, 2, 3, 4}}}, 1 + 4},
		{"list: 3 + per element 1 + size", item{"l": &types.AttributeValueMemberL{Value: []types.AttributeValue{sv("a"), sv("bc")}}}, 1 + 3 + (1 + 1) + (1 + 2)},
		{"empty list: 3", item{"l": &types.AttributeValueMemberL{}}, 1 + 3},
		{"map: 3 + per entry 1 + name + size", item{"m": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"k": sv("v")}}}, 1 + 3 + (1 + 1 + 1)},
		{"string set: sum of elements", item{"ss": &types.AttributeValueMemberSS{Value: []string{"ab", "c"}}}, 2 + 3},
		{"a caller token item", item{
			"id":      sv("token#" + strings.Repeat("a", 64)), // 2 + 70
			"v":       nv("1"),                                // 1 + 2
			"ownerId": sv("bob"),                              // 7 + 3
		}, 72 + 3 + 10},
	} {
		if got := ItemSize(tc.it); got != tc.want {
			t.Errorf("%s: ItemSize = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestReadAndWriteUnits(t *testing.T) {
	for _, tc := range []struct {
		size       int
		consistent bool
		want       float64
	}{
		{0, true, 1},        // a missing item still costs the minimum
		{0, false, 0.5},     // halved when eventually consistent
		{3500, true, 1},     // rounded up to 4 KB
		{4096, true, 1},     // exactly 4 KB
		{4097, true, 2},     // one byte over
		{4097, false, 1},    // 2 units halved
		{10240, false, 1.5}, // 10 KB -> 12 KB -> 3 units, halved
	} {
		if got := readUnits(tc.size, tc.consistent); got != tc.want {
			t.Errorf("readUnits(%d, %v) = %g, want %g", tc.size, tc.consistent, got, tc.want)
		}
	}
	for size, want := range map[int]float64{0: 1, 1: 1, 1024: 1, 1025: 2, 3500: 4, 33 << 10: 33} {
		if got := writeUnits(size); got != want {
			t.Errorf("writeUnits(%d) = %g, want %g", size, got, want)
		}
	}
}

// sized returns an item of exactly n bytes: "k" plus n-1 bytes of string.
func sized(n int, extra item) item {
	it := item{"k": sv(strings.Repeat("x", n-1-ItemSize(extra)))}
	for k, v := range extra {
		it[k] = v
	}
	return it
}

func TestTableWrite(t *testing.T) {
	for _, tc := range []struct {
		name     string
		old, new item
		ok       bool
		want     float64
	}{
		{"new item of 500 B", nil, sized(500, nil), true, 1},
		{"replace 500 B by 1500 B: the larger", sized(500, nil), sized(1500, nil), true, 2},
		{"replace 2500 B by 100 B: the larger", sized(2500, nil), sized(100, nil), true, 3},
		{"delete of 2048 B", sized(2048, nil), nil, true, 2},
		{"delete of a missing item", nil, nil, true, 1},
		{"failed condition, no item: the minimum", nil, sized(3000, nil), false, 1},
		{"failed condition on 2500 B: the existing item", sized(2500, nil), sized(100, nil), false, 3},
	} {
		if got := tableWrite(tc.old, tc.new, tc.ok); got != tc.want {
			t.Errorf("%s: %g WCU, want %g", tc.name, got, tc.want)
		}
	}
}

func TestIndexWrite(t *testing.T) {
	tableKeys := []string{"pk"}
	keysOnly := indexSchema{name: "byOwner", keys: []string{"owner", "created"}, projection: types.ProjectionTypeKeysOnly}
	sparse := indexSchema{name: "live", keys: []string{"live", "pk"}, projection: types.ProjectionTypeKeysOnly}
	include := indexSchema{name: "inc", keys: []string{"owner"}, projection: types.ProjectionTypeInclude, include: []string{"status"}}
	all := indexSchema{name: "all", keys: []string{"owner"}, projection: types.ProjectionTypeAll}

	base := item{"pk": sv("r1"), "owner": sv("alice"), "created": sv("t1"), "status": sv("running")}
	with := func(changes item, drop ...string) item {
		it := item{}
		for k, v := range base {
			it[k] = v
		}
		for k, v := range changes {
			it[k] = v
		}
		for _, k := range drop {
			delete(it, k)
		}
		return it
	}
	for _, tc := range []struct {
		name     string
		ix       indexSchema
		old, new item
		want     float64
	}{
		{"put defining the index key: 1", keysOnly, nil, base, 1},
		{"put without the index key: 0", keysOnly, nil, with(nil, "owner"), 0},
		{"delete of an indexed item: 1", keysOnly, base, nil, 1},
		{"key value changes: delete + put = 2", keysOnly, base, with(item{"created": sv("t2")}), 2},
		{"non-projected change (KEYS_ONLY): 0", keysOnly, base, with(item{"status": sv("failed")}), 0},
		{"sparse: enters the index: 1", sparse, base, with(item{"live": sv("1")}), 1},
		{"sparse: stays in, no projected change: 0", sparse, with(item{"live": sv("1")}), with(item{"live": sv("1"), "status": sv("x")}), 0},
		{"sparse: leaves the index: 1", sparse, with(item{"live": sv("1")}), base, 1},
		{"sparse: never in it: 0", sparse, base, with(item{"status": sv("x")}), 0},
		{"projected attribute changes: 1", include, base, with(item{"status": sv("failed")}), 1},
		{"unprojected attribute changes under INCLUDE: 0", include, base, with(item{"created": sv("t9")}), 0},
		{"ALL projection of a 3000 B item, attribute changes: ceil(3000/1K) = 3", all,
			sized(3000, item{"pk": sv("r1"), "owner": sv("alice")}),
			sized(3000, item{"pk": sv("r1"), "owner": sv("alice"), "status": sv("z")}), 3},
	} {
		if got := indexWrite(tc.ix, tableKeys, tc.old, tc.new); got != tc.want {
			t.Errorf("%s: %g WCU, want %g", tc.name, got, tc.want)
		}
	}
}

func TestChargeWrite(t *testing.T) {
	schemas := schemasFor(DefaultTableNames())
	runs, callers := schemas["runfleet-runs"], schemas["runfleet-callers"]
	run := item{
		"fleetRunId": sv("r1"), "ownerId": sv("alice"), "hostId": sv("h1"),
		"createdAt": sv("2026-03-04T05:06:07.123456789Z#r1"), "live": sv("1"), "status": sv("dispatching"),
		"allShard": sv("0"),
	}

	var m Meter
	m.chargeWrite(runs, nil, run, true, false)
	u := m.Snapshot()
	want := map[string]float64{"runs": 1, "runs/live": 1, "runs/byOwner": 1, "runs/byHost": 1, "runs/all": 1}
	if !sameUnits(u.WCU, want) || u.TotalWCU() != 5 || u.TableWCU() != 1 {
		t.Fatalf("new live run: %v (total %g, table %g), want %v", u.WCU, u.TotalWCU(), u.TableWCU(), want)
	}

	m.Reset()
	failed := item{"id": sv("owner#bob")}
	m.chargeWrite(callers, nil, failed, true, true)
	m.chargeWrite(callers, failed, nil, false, true)
	if u := m.Snapshot(); !sameUnits(u.WCU, map[string]float64{"callers": 4}) {
		t.Fatalf("transactional put + canceled action: %v, want callers=4", u.WCU)
	}

	m.Reset()
	m.chargeWrite(runs, run, nil, false, false)
	if u := m.Snapshot(); !sameUnits(u.WCU, map[string]float64{"runs": 1}) {
		t.Fatalf("failed conditional write touches no index: %v", u.WCU)
	}
}

func sameUnits(got, want map[string]float64) bool {
	if len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

func TestUsageString(t *testing.T) {
	var m Meter
	m.call("PutItem")
	m.call("PutItem")
	m.call("GetItem")
	m.read("callers", 1)
	m.write("runs", 1)
	m.write("runs/live", 1)
	got := m.Snapshot().String()
	want := "calls 3 (GetItem=1 PutItem=2); RCU 1 (callers=1); WCU 2 (runs=1 runs/live=1)"
	if got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
}

// A million eventually consistent small reads are half a million read
// request units; a million small writes, a million write request units.
func TestUsageDollars(t *testing.T) {
	u := Usage{RCU: map[string]float64{"runs": 0.5e6}, WCU: map[string]float64{"runs": 1e6, "runs/live": 1e6}}
	got := u.Dollars(OnDemandUSEast1)
	want := 0.5*0.125 + 2*0.625
	if diff := got - want; diff > 1e-9 || diff < -1e-9 {
		t.Errorf("Dollars = %v, want %v", got, want)
	}
}

// The queue index is sparse, its entries the keys and qu (Until, fixed
// while the run waits): a run costs it a write when it enters and one
// when it leaves; an update that leaves its entry as it was (an offer, a
// run taken back to its place) costs it nothing. The live index takes
// the run at its offer and lets it go when it is taken back: a queued
// run is not live.
func TestChargeWriteQueueIndex(t *testing.T) {
	runs := schemasFor(DefaultTableNames())["runfleet-runs"]
	base := item{"fleetRunId": sv("r1"), "ownerId": sv("alice"), "createdAt": sv("t#r1"), "allShard": sv("0")}
	with := func(extra item) item {
		it := item{}
		for k, v := range base {
			it[k] = v
		}
		for k, v := range extra {
			it[k] = v
		}
		return it
	}
	entry := item{"qp": sv("q"), "qk": sv("claude#100|00000000000000000001|r1"), "qu": nv("1800000000001")}
	queued := with(item{"qp": entry["qp"], "qk": entry["qk"], "qu": entry["qu"], "status": sv("queued")})
	offered := with(item{"qp": entry["qp"], "qk": entry["qk"], "qu": entry["qu"], "status": sv("dispatching"), "hostId": sv("h1"), "live": sv("1")})
	running := with(item{"status": sv("running"), "hostId": sv("h1"), "live": sv("1")})
	for _, tc := range []struct {
		name        string
		old, new    item
		queue, live float64
	}{
		{"created queued: enters the queue", nil, queued, 1, 0},
		{"offered: its entry unchanged, enters the live index", queued, offered, 0, 1},
		{"back to queued in its place, leaves the live index", offered, queued, 0, 1},
		{"started: leaves the queue", offered, running, 1, 0},
		{"never waited", nil, running, 0, 1},
	} {
		var m Meter
		m.chargeWrite(runs, tc.old, tc.new, true, false)
		u := m.Snapshot()
		if got := u.WCU["runs/queue"]; got != tc.queue {
			t.Errorf("%s: %g WCU on the queue index, want %g", tc.name, got, tc.queue)
		}
		if got := u.WCU["runs/live"]; got != tc.live {
			t.Errorf("%s: %g WCU on the live index, want %g", tc.name, got, tc.live)
		}
	}
}
