package dynamostore

import (
	"fmt"
	"sort"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// item is one DynamoDB item. The put helpers leave an attribute out when
// its value is the zero value, so absent and zero read back alike and an
// item carries (and pays for) only what it holds.
type item map[string]types.AttributeValue

func (it item) putS(name, v string) {
	if v != "" {
		it[name] = &types.AttributeValueMemberS{Value: v}
	}
}

func (it item) putN(name string, v int64) {
	if v != 0 {
		it[name] = &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
	}
}

// putNAlways writes a number even when it is zero (versions, sequences).
func (it item) putNAlways(name string, v int64) {
	it[name] = &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

// putFloat writes the shortest decimal that reads back as v exactly.
func (it item) putFloat(name string, v float64) {
	if v != 0 {
		it[name] = &types.AttributeValueMemberN{Value: strconv.FormatFloat(v, 'g', -1, 64)}
	}
}

// putB writes bytes as B (sealed values: never a string an item reader
// might mistake for text).
func (it item) putB(name string, v []byte) {
	if len(v) > 0 {
		it[name] = &types.AttributeValueMemberB{Value: v}
	}
}

func (it item) putBool(name string, v bool) {
	if v {
		it[name] = &types.AttributeValueMemberBOOL{Value: true}
	}
}

// putBoolAlways writes false too, for flags whose absence would be ambiguous.
func (it item) putBoolAlways(name string, v bool) {
	it[name] = &types.AttributeValueMemberBOOL{Value: v}
}

func (it item) putStrings(name string, v []string) {
	if len(v) == 0 {
		return
	}
	l := make([]types.AttributeValue, len(v))
	for i, s := range v {
		l[i] = &types.AttributeValueMemberS{Value: s}
	}
	it[name] = &types.AttributeValueMemberL{Value: l}
}

func (it item) putStringMap(name string, v map[string]string) {
	if len(v) == 0 {
		return
	}
	m := make(map[string]types.AttributeValue, len(v))
	for k, s := range v {
		m[k] = &types.AttributeValueMemberS{Value: s}
	}
	it[name] = &types.AttributeValueMemberM{Value: m}
}

func (it item) putMap(name string, v item) {
	if len(v) > 0 {
		it[name] = &types.AttributeValueMemberM{Value: v}
	}
}

// reader decodes an item, remembering the first attribute of the wrong type.
type reader struct {
	it  item
	err error
}

func (r *reader) fail(name string, want string, got types.AttributeValue) {
	if r.err == nil {
		r.err = fmt.Errorf("attribute %q: want %s, got %T", name, want, got)
	}
}

func (r *reader) s(name string) string {
	v, ok := r.it[name]
	if !ok {
		return ""
	}
	s, ok := v.(*types.AttributeValueMemberS)
	if !ok {
		r.fail(name, "S", v)
		return ""
	}
	return s.Value
}

func (r *reader) n(name string) int64 {
	raw, ok := r.number(name)
	if !ok {
		return 0
	}
	i, err := strconv.ParseInt(raw, 10, 64)
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("attribute %q: %w", name, err)
	}
	return i
}

func (r *reader) float(name string) float64 {
	raw, ok := r.number(name)
	if !ok {
		return 0
	}
	f, err := strconv.ParseFloat(raw, 64)
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("attribute %q: %w", name, err)
	}
	return f
}

// number is the N attribute name as written; false when it is absent or
// of another type (recorded).
func (r *reader) number(name string) (string, bool) {
	v, ok := r.it[name]
	if !ok {
		return "", false
	}
	n, ok := v.(*types.AttributeValueMemberN)
	if !ok {
		r.fail(name, "N", v)
		return "", false
	}
	return n.Value, true
}

func (r *reader) b(name string) []byte {
	v, ok := r.it[name]
	if !ok {
		return nil
	}
	b, ok := v.(*types.AttributeValueMemberB)
	if !ok {
		r.fail(name, "B", v)
		return nil
	}
	return b.Value
}

func (r *reader) has(name string) bool {
	_, ok := r.it[name]
	return ok
}

func (r *reader) bool(name string) bool {
	v, ok := r.it[name]
	if !ok {
		return false
	}
	b, ok := v.(*types.AttributeValueMemberBOOL)
	if !ok {
		r.fail(name, "BOOL", v)
		return false
	}
	return b.Value
}

func (r *reader) strings(name string) []string {
	v, ok := r.it[name]
	if !ok {
		return nil
	}
	l, ok := v.(*types.AttributeValueMemberL)
	if !ok {
		r.fail(name, "L", v)
		return nil
	}
	out := make([]string, 0, len(l.Value))
	for _, e := range l.Value {
		s, ok := e.(*types.AttributeValueMemberS)
		if !ok {
			r.fail(name, "L of S", e)
			return nil
		}
		out = append(out, s.Value)
	}
	return out
}

func (r *reader) stringMap(name string) map[string]string {
	v, ok := r.it[name]
	if !ok {
		return nil
	}
	m, ok := v.(*types.AttributeValueMemberM)
	if !ok {
		r.fail(name, "M", v)
		return nil
	}
	out := make(map[string]string, len(m.Value))
	for k, e := range m.Value {
		s, ok := e.(*types.AttributeValueMemberS)
		if !ok {
			r.fail(name, "M of S", e)
			return nil
		}
		out[k] = s.Value
	}
	return out
}

// sub returns a reader of a map attribute, nil when absent.
func (r *reader) sub(name string) *reader {
	v, ok := r.it[name]
	if !ok {
		return nil
	}
	m, ok := v.(*types.AttributeValueMemberM)
	if !ok {
		r.fail(name, "M", v)
		return nil
	}
	return &reader{it: m.Value}
}

// done returns the first decoding error, including a child reader's.
func (r *reader) done(children ...*reader) error {
	if r.err != nil {
		return r.err
	}
	for _, c := range children {
		if c != nil && c.err != nil {
			return c.err
		}
	}
	return nil
}

// checkVersion refuses an item written in another format.
func (r *reader) checkVersion() {
	if v := r.n(attrVersionFormat); v != formatVersion && r.err == nil {
		r.err = fmt.Errorf("item format version %d, want %d", v, formatVersion)
	}
}

func sortedKeys(m map[string]types.AttributeValue) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
