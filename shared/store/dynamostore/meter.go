package dynamostore

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Meter counts the DynamoDB calls a Store makes and prices them in capacity
// units by DynamoDB's documented rules, because moto (like any emulator)
// does not report ConsumedCapacity for every call. Install it with
// Config.Meter. It is safe for concurrent use; the zero value is ready.
//
// The rules (Amazon DynamoDB Developer Guide: "Capacity unit consumption",
// "Item sizes", "Global secondary indexes: provisioned throughput"):
//
//   - Item size: the sum, over attributes, of the name's length plus the
//     value's size. String and binary: their byte length. Number: one byte
//     per two significant digits, plus one. Boolean and null: one byte. List
//     and map: 3 bytes plus, per element, 1 byte plus its size (and, in a
//     map, its name's length). Sets: the sum of their elements.
//   - Reads: ceil(size / 4 KB) units per item (at least 1), halved when
//     eventually consistent. GetItem of a missing item still costs the
//     minimum; BatchGetItem prices each key as a GetItem. Query and Scan:
//     the total size of the items read, rounded up to 4 KB (at least 1 unit).
//   - Writes: ceil(size / 1 KB) units (at least 1), where size is the larger
//     of the item before and after (PutItem, UpdateItem), the item deleted
//     (DeleteItem). A write whose condition fails still costs ceil(size of
//     the existing item / 1 KB), at least 1. Transactional writes cost
//     twice; a canceled transaction is priced like its failed conditional
//     writes, twice (an assumption: DynamoDB documents that canceled
//     transactions consume capacity, not how much).
//   - Each global secondary index a write touches: 1 write when the item
//     enters it (it now has the index key) or leaves it, 2 when an index key
//     value changes (delete + put), 1 when only a projected attribute
//     changes, 0 otherwise; each sized by the index entry (the table key,
//     the index key and the projected attributes) rounded up to 1 KB.
//     Failed writes touch no index.
//
// To learn the item before and after a write, a metered store reads it with
// unmetered, strongly consistent GetItems around the write. So a metered
// store makes more calls than it reports: those reads are the meter's, not
// the store's, and under concurrent writers to one item the before-image
// may be a moment stale (the failed-condition item DynamoDB returns is used
// when present). Metering is for benchmarks, never for production.
type Meter struct {
	mu    sync.Mutex
	calls map[string]int
	rcu   map[string]float64
	wcu   map[string]float64
}

// Usage is what a Meter counted.
type Usage struct {
	// Calls counts calls by operation ("GetItem", "PutItem", ...), failed
	// ones included.
	Calls map[string]int
	// RCU and WCU are capacity units by table role ("runs", "callers") and
	// by index ("runs/byOwner").
	RCU map[string]float64
	WCU map[string]float64
}

// Snapshot returns a copy of the counts so far.
func (m *Meter) Snapshot() Usage {
	m.mu.Lock()
	defer m.mu.Unlock()
	u := Usage{Calls: map[string]int{}, RCU: map[string]float64{}, WCU: map[string]float64{}}
	for k, v := range m.calls {
		u.Calls[k] = v
	}
	for k, v := range m.rcu {
		u.RCU[k] = v
	}
	for k, v := range m.wcu {
		u.WCU[k] = v
	}
	return u
}

// Reset forgets every count.
func (m *Meter) Reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls, m.rcu, m.wcu = nil, nil, nil
}

func (m *Meter) call(op string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.calls == nil {
		m.calls = map[string]int{}
	}
	m.calls[op]++
}

func (m *Meter) read(target string, units float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rcu == nil {
		m.rcu = map[string]float64{}
	}
	m.rcu[target] += units
}

func (m *Meter) write(target string, units float64) {
	if units == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.wcu == nil {
		m.wcu = map[string]float64{}
	}
	m.wcu[target] += units
}

// TotalCalls is the number of calls of every operation.
func (u Usage) TotalCalls() int {
	n := 0
	for _, v := range u.Calls {
		n += v
	}
	return n
}

// TotalRCU is the read units on every table and index.
func (u Usage) TotalRCU() float64 { return sum(u.RCU) }

// TotalWCU is the write units on every table and index.
func (u Usage) TotalWCU() float64 { return sum(u.WCU) }

// TableWCU is the write units on base tables only (indexes left out).
func (u Usage) TableWCU() float64 {
	t := 0.0
	for k, v := range u.WCU {
		if !strings.Contains(k, "/") {
			t += v
		}
	}
	return t
}

func sum(m map[string]float64) float64 {
	t := 0.0
	for _, v := range m {
		t += v
	}
	return t
}

// String is one line: calls, then read and write units by target.
func (u Usage) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "calls %d (%s); RCU %g (%s); WCU %g (%s)",
		u.TotalCalls(), joinCounts(u.Calls), u.TotalRCU(), joinUnits(u.RCU), u.TotalWCU(), joinUnits(u.WCU))
	return b.String()
}

func joinCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

func joinUnits(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%g", k, m[k])
	}
	return strings.Join(parts, " ")
}

// --- the documented arithmetic ---------------------------------------------

const (
	readUnitBytes  = 4 << 10
	writeUnitBytes = 1 << 10
)

// ItemSize is an item's size in bytes by DynamoDB's rules.
func ItemSize(it map[string]types.AttributeValue) int {
	n := 0
	for name, v := range it {
		n += len(name) + valueSize(v)
	}
	return n
}

func valueSize(v types.AttributeValue) int {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return len(v.Value)
	case *types.AttributeValueMemberN:
		return numberSize(v.Value)
	case *types.AttributeValueMemberB:
		return len(v.Value)
	case *types.AttributeValueMemberBOOL, *types.AttributeValueMemberNULL:
		return 1
	case *types.AttributeValueMemberSS:
		n := 0
		for _, s := range v.Value {
			n += len(s)
		}
		return n
	case *types.AttributeValueMemberNS:
		n := 0
		for _, s := range v.Value {
			n += numberSize(s)
		}
		return n
	case *types.AttributeValueMemberBS:
		n := 0
		for _, b := range v.Value {
			n += len(b)
		}
		return n
	case *types.AttributeValueMemberL:
		n := 3
		for _, e := range v.Value {
			n += 1 + valueSize(e)
		}
		return n
	case *types.AttributeValueMemberM:
		n := 3
		for k, e := range v.Value {
			n += 1 + len(k) + valueSize(e)
		}
		return n
	}
	return 0
}

// numberSize is one byte per two significant digits, plus one. Leading and
// trailing zeros are not significant; sign, point and exponent are not
// digits.
func numberSize(s string) int {
	mantissa := s
	if i := strings.IndexAny(mantissa, "eE"); i >= 0 {
		mantissa = mantissa[:i]
	}
	digits := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, mantissa)
	digits = strings.TrimLeft(digits, "0")
	// Trailing zeros are insignificant whether after the point (1.50) or
	// before it (1500 = 15e2).
	digits = strings.TrimRight(digits, "0")
	sig := utf8.RuneCountInString(digits)
	return (sig+1)/2 + 1
}

// readUnits prices one read of size bytes.
func readUnits(size int, consistent bool) float64 {
	u := math.Max(1, math.Ceil(float64(size)/readUnitBytes))
	if !consistent {
		u /= 2
	}
	return u
}

// writeUnits prices one write of size bytes.
func writeUnits(size int) float64 {
	return math.Max(1, math.Ceil(float64(size)/writeUnitBytes))
}

// tableWrite prices a write on the base table given the item before (nil:
// none) and after (nil: deleted), and whether its condition held.
func tableWrite(old, new item, ok bool) float64 {
	if !ok {
		return writeUnits(ItemSize(old))
	}
	return writeUnits(max(ItemSize(old), ItemSize(new)))
}

// indexWrite prices what a successful write costs one index.
func indexWrite(ix indexSchema, tableKeys []string, old, new item) float64 {
	in := func(it item) bool {
		if it == nil {
			return false
		}
		for _, k := range ix.keys {
			if _, ok := it[k]; !ok {
				return false
			}
		}
		return true
	}
	inOld, inNew := in(old), in(new)
	switch {
	case !inOld && !inNew:
		return 0
	case !inOld:
		return writeUnits(ItemSize(indexEntry(ix, tableKeys, new)))
	case !inNew:
		return writeUnits(ItemSize(indexEntry(ix, tableKeys, old)))
	}
	eo, en := indexEntry(ix, tableKeys, old), indexEntry(ix, tableKeys, new)
	for _, k := range ix.keys {
		if !reflect.DeepEqual(old[k], new[k]) {
			return writeUnits(ItemSize(eo)) + writeUnits(ItemSize(en))
		}
	}
	if !reflect.DeepEqual(eo, en) {
		return writeUnits(ItemSize(en))
	}
	return 0
}

// indexEntry is what an index holds of an item: the table key, the index
// key and the projected attributes.
func indexEntry(ix indexSchema, tableKeys []string, it item) item {
	if ix.projection == types.ProjectionTypeAll {
		return it
	}
	e := item{}
	for _, names := range [][]string{tableKeys, ix.keys, ix.include} {
		for _, k := range names {
			if v, ok := it[k]; ok {
				e[k] = v
			}
		}
	}
	return e
}

// chargeWrite records one write on table t: the base table and its indexes.
func (m *Meter) chargeWrite(t tableSchema, old, new item, ok bool, transactional bool) {
	mult := 1.0
	if transactional {
		mult = 2
	}
	m.write(t.logical, mult*tableWrite(old, new, ok))
	if !ok {
		return
	}
	for _, ix := range t.indexes {
		m.write(t.logical+"/"+ix.name, indexWrite(ix, t.keys, old, new))
	}
}
