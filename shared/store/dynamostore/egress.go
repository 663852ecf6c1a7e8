package dynamostore

import (
	"bytes"
	"compress/flate"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/internal/cursor"
)

// The egress table holds each run's ledger mirror (store.Egress) in the
// run's partition (fleetRunId), sorted by seq:
//
//   - seq 0 is the head.
//   - Every other item is a chunk: a run of contiguous records, keyed by
//     its last seq, with its first in "first" and the records in "data":
//     raw DEFLATE (RFC 1951) of, per record, its length (uvarint) and its
//     JSON byte for byte. A chunk is at most chunkItemBytes (one strongly
//     consistent read unit, four write units) unless one record alone is
//     larger, and holds at most maxChunkRecords records.
//
// Keyed by its last seq, the chunk holding seq s is the first one whose
// key is s or more, so a page's chunks are one Query away. A re-run (or
// two mirrors at once) may write chunks that overlap: PutEgress first
// reads which of its seqs are stored and writes only the others, and a
// chunk never replaces another (a conditional put), so a race at worst
// stores a seq twice; a reader then takes each seq once, from the chunk
// with the lowest key. A record is never rewritten.

const (
	// chunkItemBytes bounds a chunk's item size (ItemSize).
	chunkItemBytes = 4 << 10
	// maxChunkRecords bounds a chunk's records, however small they are, so
	// that the chunk holding seq s has a key below s+maxChunkRecords: what
	// bounds a reader's search for a seq it has not found.
	maxChunkRecords = 256
	// maxChunkRaw bounds what a chunk inflates to: a corrupt item is
	// refused, not read into memory.
	maxChunkRaw = 64 << 20
	// headSeq is the head's sort key.
	headSeq = 0
	// gapReadChunks is how many chunks a reader asks for at a time when a
	// seq it needs was in none of the chunks it read (expired, or never
	// stored).
	gapReadChunks = 2
)

var deflaters = sync.Pool{New: func() any {
	// BestCompression is a valid level: NewWriter cannot fail.
	w, _ := flate.NewWriter(nil, flate.BestCompression)
	return w
}}

// packRecords is a chunk's data.
func packRecords(recs []store.EgressRecord) []byte {
	var raw []byte
	for _, r := range recs {
		raw = binary.AppendUvarint(raw, uint64(len(r.Data)))
		raw = append(raw, r.Data...)
	}
	return deflate(raw)
}

// deflate is raw DEFLATE of raw, at the best compression.
func deflate(raw []byte) []byte {
	var out bytes.Buffer
	w := deflaters.Get().(*flate.Writer)
	defer deflaters.Put(w)
	w.Reset(&out)
	// Writes into a bytes.Buffer cannot fail.
	_, _ = w.Write(raw)
	_ = w.Close()
	return out.Bytes()
}

// chunkItem is the item of a chunk of recs (contiguous, ascending).
func chunkItem(fleetRunID string, recs []store.EgressRecord, expiresAt time.Time) item {
	it := item{}
	it.putS(attrFleetRunID, fleetRunID)
	it.putNAlways(attrSeq, recs[len(recs)-1].Seq)
	it.putNAlways(attrVersionFormat, formatVersion)
	it.putNAlways(attrFirst, recs[0].Seq)
	it[attrData] = &types.AttributeValueMemberB{Value: packRecords(recs)}
	it.putExpiry(expiresAt)
	return it
}

// chunk is one chunk of recs and its item.
type chunk struct {
	recs []store.EgressRecord
	it   item
}

// chunksOf packs recs (contiguous, ascending) into chunks, each as many
// records as fit chunkItemBytes: the largest prefix that fits, found by
// halving (DEFLATE's output does not add up record by record).
func chunksOf(fleetRunID string, recs []store.EgressRecord, expiresAt time.Time) []chunk {
	var out []chunk
	for i := 0; i < len(recs); {
		end := min(len(recs), i+maxChunkRecords)
		best := chunk{recs[i:end], chunkItem(fleetRunID, recs[i:end], expiresAt)}
		if ItemSize(best.it) > chunkItemBytes && end-i > 1 {
			best = chunk{recs[i : i+1], chunkItem(fleetRunID, recs[i:i+1], expiresAt)}
			lo, hi := i+2, end-1
			for lo <= hi {
				mid := (lo + hi) / 2
				it := chunkItem(fleetRunID, recs[i:mid], expiresAt)
				if ItemSize(it) <= chunkItemBytes {
					best, lo = chunk{recs[i:mid], it}, mid+1
				} else {
					hi = mid - 1
				}
			}
		}
		out = append(out, best)
		i += len(best.recs)
	}
	return out
}

// storedChunk is a chunk as read back.
type storedChunk struct {
	first, last int64
	expiresAt   time.Time
	data        []byte
}

func chunkFromItem(it item) (storedChunk, error) {
	r := &reader{it: it}
	r.checkVersion()
	c := storedChunk{first: r.n(attrFirst), last: r.n(attrSeq), expiresAt: r.expiry(), data: r.b(attrData)}
	if err := r.done(); err != nil {
		return storedChunk{}, fmt.Errorf("egress chunk item: %w", err)
	}
	if c.first < 1 || c.last < c.first || c.last-c.first >= maxChunkRecords {
		return storedChunk{}, fmt.Errorf("egress chunk item: seqs %d to %d", c.first, c.last)
	}
	return c, nil
}

// records inflates the chunk.
func (c storedChunk) records() ([]store.EgressRecord, error) {
	fr := flate.NewReader(bytes.NewReader(c.data))
	defer fr.Close()
	raw, err := io.ReadAll(io.LimitReader(fr, maxChunkRaw+1))
	if err != nil {
		return nil, fmt.Errorf("egress chunk %d: inflating: %w", c.last, err)
	}
	if len(raw) > maxChunkRaw {
		return nil, fmt.Errorf("egress chunk %d: inflates past %d bytes", c.last, maxChunkRaw)
	}
	recs := make([]store.EgressRecord, 0, c.last-c.first+1)
	for seq := c.first; seq <= c.last; seq++ {
		n, w := binary.Uvarint(raw)
		if w <= 0 || n > uint64(len(raw)-w) {
			return nil, fmt.Errorf("egress chunk %d: record %d is cut short", c.last, seq)
		}
		recs = append(recs, store.EgressRecord{Seq: seq, Data: raw[w : w+int(n) : w+int(n)]})
		raw = raw[w+int(n):]
	}
	if len(raw) != 0 {
		return nil, fmt.Errorf("egress chunk %d: %d bytes past its last record", c.last, len(raw))
	}
	return recs, nil
}

func seqKey(fleetRunID string, seq int64) item {
	return item{
		attrFleetRunID: &types.AttributeValueMemberS{Value: fleetRunID},
		attrSeq:        &types.AttributeValueMemberN{Value: strconv.FormatInt(seq, 10)},
	}
}

// queryChunks reads the run's chunks with keys from..to (to: MaxInt64 for
// no end), strongly consistent, at most limit (0: all), in key order; more
// reports that chunks past the last one read may remain. The head (seq 0)
// is never in range: from is 1 or more.
func (s *Store) queryChunks(ctx context.Context, fleetRunID string, from, to int64, limit int) (chunks []storedChunk, more bool, err error) {
	in := &dynamodb.QueryInput{
		TableName:                aws.String(s.tables.Egress),
		KeyConditionExpression:   aws.String("#r = :r AND #s BETWEEN :from AND :to"),
		ExpressionAttributeNames: map[string]string{"#r": attrFleetRunID, "#s": attrSeq},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":r":    &types.AttributeValueMemberS{Value: fleetRunID},
			":from": &types.AttributeValueMemberN{Value: strconv.FormatInt(from, 10)},
			":to":   &types.AttributeValueMemberN{Value: strconv.FormatInt(to, 10)},
		},
		ConsistentRead: aws.Bool(true),
	}
	for {
		if limit > 0 {
			in.Limit = aws.Int32(int32(limit - len(chunks)))
		}
		out, err := s.api.Query(ctx, in)
		if err != nil {
			return nil, false, err
		}
		for _, it := range out.Items {
			c, err := chunkFromItem(it)
			if err != nil {
				return nil, false, err
			}
			chunks = append(chunks, c)
		}
		more = len(out.LastEvaluatedKey) > 0
		if !more || (limit > 0 && len(chunks) >= limit) {
			return chunks, more, nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// PutEgress reads which of the records' seqs unexpired chunks hold (one
// strong Query over the keys that could hold them: in the usual append,
// none, one read unit), packs the others into chunks and writes each with
// a put conditional on its key being free (or expired). A put that finds
// its key taken (a concurrent mirror) leaves that chunk and writes, as
// another chunk, whatever of its records the taken one does not hold.
func (s *Store) PutEgress(ctx context.Context, fleetRunID string, records []store.EgressRecord, expiresAt time.Time) error {
	if err := store.CheckEgressRecords(fleetRunID, records); err != nil {
		return fmt.Errorf("dynamostore: put egress: %w", err)
	}
	if len(records) == 0 {
		return nil
	}
	first, last := records[0].Seq, records[len(records)-1].Seq
	now := s.now()
	stored, _, err := s.queryChunks(ctx, fleetRunID, first, satAdd(last, maxChunkRecords-1), 0)
	if err != nil {
		return fault(fmt.Sprintf("put egress of run %q: reading what is stored", fleetRunID), err)
	}
	held := make([]bool, len(records))
	for _, c := range stored {
		if store.Expired(c.expiresAt, now) {
			continue
		}
		for seq := max(c.first, first); seq <= min(c.last, last); seq++ {
			held[seq-first] = true
		}
	}
	var todo [][]store.EgressRecord
	for i := 0; i < len(records); {
		if held[i] {
			i++
			continue
		}
		j := i
		for j < len(records) && !held[j] {
			j++
		}
		todo = append(todo, records[i:j])
		i = j
	}
	// Each lost race shrinks what is left to write, so this ends; the
	// bound only guards against a store that keeps answering nonsense.
	for rounds := 0; len(todo) > 0; rounds++ {
		if rounds > 2*len(records) {
			return fault(fmt.Sprintf("put egress of run %q", fleetRunID), errors.New("chunks keep colliding"))
		}
		recs := todo[0]
		todo = todo[1:]
		for _, c := range chunksOf(fleetRunID, recs, expiresAt) {
			rest, err := s.putChunk(ctx, fleetRunID, c, now)
			if err != nil {
				return fault(fmt.Sprintf("put egress of run %q", fleetRunID), err)
			}
			if len(rest) > 0 {
				todo = append(todo, rest)
			}
		}
	}
	return nil
}

// putChunk writes c unless its key is taken by an unexpired chunk; then it
// returns c's records that chunk does not hold (those before its first).
func (s *Store) putChunk(ctx context.Context, fleetRunID string, c chunk, now time.Time) ([]store.EgressRecord, error) {
	key := seqKey(fleetRunID, c.recs[len(c.recs)-1].Seq)
	_, err := s.api.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           aws.String(s.tables.Egress),
		Item:                                c.it,
		ConditionExpression:                 aws.String(condAbsentOrExpired),
		ExpressionAttributeNames:            expiryNames(attrFleetRunID),
		ExpressionAttributeValues:           map[string]types.AttributeValue{":now": nowValue(now)},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	failed, old := conditionFailed(err)
	if !failed {
		return nil, err
	}
	held, err := s.holder(ctx, s.tables.Egress, key, old)
	if err != nil {
		return nil, fmt.Errorf("reading the chunk that holds seq %d: %w", c.recs[len(c.recs)-1].Seq, err)
	}
	if held == nil {
		return c.recs, nil // gone since: write it again
	}
	other, err := chunkFromItem(held)
	if err != nil {
		return nil, err
	}
	n := other.first - c.recs[0].Seq
	if n <= 0 {
		return nil, nil
	}
	return c.recs[:n], nil
}

// ListEgress reads the chunks that hold the page: those keyed after..
// after+limit+1 (one Query), and the next one (another, Limit 1), which
// holds the rest of the page and the seq that tells HasMore. Each seq is
// taken once, from the chunk with the lowest key. Only where a seq of the
// page is in none of those chunks (expired, never stored) does it read on,
// gapReadChunks at a time, until no chunk left could hold it.
func (s *Store) ListEgress(ctx context.Context, fleetRunID string, after int64, limit int) (store.EgressPage, error) {
	after = max(after, 0)
	limit = store.PageLimit(limit)
	want := int64(limit) + 1
	r := &ledgerRead{s: s, fleetRunID: fleetRunID, now: s.now(), got: map[int64][]byte{}}
	lo := after + 1
	if err := r.readRange(ctx, lo, satAdd(after, want)); err != nil {
		return store.EgressPage{}, fault("list egress", err)
	}
	if err := r.readOn(ctx, 1); err != nil {
		return store.EgressPage{}, fault("list egress", err)
	}
	for {
		seqs := r.seqsFrom(lo)
		bound := int64(math.MaxInt64)
		if int64(len(seqs)) >= want {
			bound = seqs[want-1]
		}
		if r.end || !r.unknownBelow(lo, seqs, bound) {
			page := store.EgressPage{}
			for _, seq := range seqs[:min(len(seqs), limit)] {
				page.Records = append(page.Records, store.EgressRecord{Seq: seq, Data: r.got[seq]})
			}
			page.HasMore = len(seqs) > limit
			return page, nil
		}
		if err := r.readOn(ctx, gapReadChunks); err != nil {
			return store.EgressPage{}, fault("list egress", err)
		}
	}
}

// ledgerRead is what one ListEgress has read: every chunk keyed lo..
// through, in key order.
type ledgerRead struct {
	s          *Store
	fleetRunID string
	now        time.Time
	got        map[int64][]byte
	through    int64
	// end: no chunk is keyed past through.
	end bool
}

func (r *ledgerRead) readRange(ctx context.Context, from, to int64) error {
	chunks, _, err := r.s.queryChunks(ctx, r.fleetRunID, from, to, 0)
	if err != nil {
		return err
	}
	r.through = to
	return r.add(chunks)
}

// readOn reads the next n chunks past through.
func (r *ledgerRead) readOn(ctx context.Context, n int) error {
	if r.end || n <= 0 {
		return nil
	}
	if r.through == math.MaxInt64 {
		r.end = true
		return nil
	}
	chunks, more, err := r.s.queryChunks(ctx, r.fleetRunID, r.through+1, math.MaxInt64, n)
	if err != nil {
		return err
	}
	if len(chunks) == 0 {
		r.end = true
		return nil
	}
	r.through, r.end = chunks[len(chunks)-1].last, !more
	return r.add(chunks)
}

// add keeps each seq of the unexpired chunks, unless a chunk read before
// (a lower key) gave it already.
func (r *ledgerRead) add(chunks []storedChunk) error {
	for _, c := range chunks {
		if store.Expired(c.expiresAt, r.now) {
			continue
		}
		recs, err := c.records()
		if err != nil {
			return err
		}
		for _, rec := range recs {
			if _, ok := r.got[rec.Seq]; !ok {
				r.got[rec.Seq] = rec.Data
			}
		}
	}
	return nil
}

// seqsFrom is the seqs read from lo on, ascending.
func (r *ledgerRead) seqsFrom(lo int64) []int64 {
	seqs := make([]int64, 0, len(r.got))
	for seq := range r.got {
		if seq >= lo {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	return seqs
}

// unknownBelow reports whether some seq from lo to below bound is missing
// from what was read while a chunk not read yet could still hold it (a
// chunk holding s is keyed below s+maxChunkRecords).
func (r *ledgerRead) unknownBelow(lo int64, seqs []int64, bound int64) bool {
	cand := max(lo, r.through-maxChunkRecords+2)
	for _, seq := range seqs {
		if seq < cand {
			continue
		}
		if seq != cand {
			break
		}
		cand++
	}
	return cand < bound
}

// satAdd is a+b (b >= 0), saturating at MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// --- heads -----------------------------------------------------------------

// headItem is the whole head, written when none is stored. firstAlert is
// the FirstAlertAt to keep (store.KeptFirstAlertAt); when set, the head
// enters the alerted index.
func headItem(h store.EgressHead, firstAlert time.Time) item {
	it := item{}
	it.putS(attrFleetRunID, h.FleetRunID)
	it.putNAlways(attrSeq, headSeq)
	it.putNAlways(attrVersionFormat, formatVersion)
	for k, v := range headMutable(h) {
		it[k] = v
	}
	if !firstAlert.IsZero() {
		for k, v := range alertAttrs(h.FleetRunID, firstAlert) {
			it[k] = v
		}
	}
	return it
}

// headMutable holds what a head update sets; an attribute missing here is
// removed by one.
func headMutable(h store.EgressHead) item {
	it := item{}
	it.putNAlways(attrHeadVersion, h.Version)
	it.putN(attrCursor, h.Cursor)
	it.putS(attrSummary, string(h.Summary))
	it.putS(attrSeal, string(h.Seal))
	it.putS(attrHostID, h.HostID)
	it.putN(attrAlerts, h.Alerts)
	it.putTime(attrUpdatedAt, h.UpdatedAt)
	it.putExpiry(h.ExpiresAt)
	return it
}

var headMutableNames = []string{
	attrHeadVersion, attrCursor, attrSummary, attrSeal, attrHostID, attrAlerts, attrUpdatedAt, attrExpiresAt,
}

// alertAttrs are the alerted index's key and the time it sorts by; they
// are written once (the first head with alerts) and never change.
func alertAttrs(fleetRunID string, firstAlert time.Time) item {
	it := item{}
	it.putTime(attrFirstAlertAt, firstAlert)
	it.putS(attrAlerted, alertedValue)
	it.putS(attrAlertKey, createdKey(firstAlert, fleetRunID))
	return it
}

func headFromItem(it item) (store.EgressHead, error) {
	r := &reader{it: it}
	r.checkVersion()
	h := store.EgressHead{
		FleetRunID: r.s(attrFleetRunID), Version: r.n(attrHeadVersion), Cursor: r.n(attrCursor),
		HostID: r.s(attrHostID), Alerts: r.n(attrAlerts), FirstAlertAt: r.time(attrFirstAlertAt),
		UpdatedAt: r.time(attrUpdatedAt), ExpiresAt: r.expiry(),
	}
	if v := r.s(attrSummary); v != "" {
		h.Summary = []byte(v)
	}
	if v := r.s(attrSeal); v != "" {
		h.Seal = []byte(v)
	}
	if err := r.done(); err != nil {
		return store.EgressHead{}, fmt.Errorf("egress head item: %w", err)
	}
	return h, nil
}

// GetEgressHead reads the head, strongly consistent; ErrNotFound when
// absent or expired.
func (s *Store) GetEgressHead(ctx context.Context, fleetRunID string) (store.EgressHead, error) {
	out, err := s.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Egress), Key: seqKey(fleetRunID, headSeq), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return store.EgressHead{}, fault("get egress head", err)
	}
	if out.Item == nil {
		return store.EgressHead{}, fmt.Errorf("dynamostore: egress head of run %q: %w", fleetRunID, store.ErrNotFound)
	}
	h, err := headFromItem(out.Item)
	if err != nil {
		return store.EgressHead{}, fault("get egress head", err)
	}
	if store.Expired(h.ExpiresAt, s.now()) {
		return store.EgressHead{}, fmt.Errorf("dynamostore: egress head of run %q: %w", fleetRunID, store.ErrNotFound)
	}
	return h, nil
}

// PutEgressHead writes the first head with a put conditional on none
// being stored (or the stored one expired), and every later one with an
// update conditional on the stored Version, which sets FirstAlertAt and
// the alerted index's key only if they are not set already
// (if_not_exists), so they never move and the index is written once. Like
// UpdateRun, each write carries a token (ownwrites.go), so that a retry of
// a write whose answer was lost returns the head it stored.
func (s *Store) PutEgressHead(ctx context.Context, h store.EgressHead) (store.EgressHead, error) {
	if h.FleetRunID == "" {
		return store.EgressHead{}, errors.New("dynamostore: put egress head: empty fleetRunId")
	}
	token, err := s.newWriteToken()
	if err != nil {
		return store.EgressHead{}, err
	}
	now := s.now()
	expect := h.Version
	h.Version = expect + 1
	var out map[string]types.AttributeValue
	if expect == 0 {
		it := headItem(h, store.KeptFirstAlertAt(time.Time{}, h, now))
		it[attrWriteToken] = token
		_, err = s.api.PutItem(ctx, &dynamodb.PutItemInput{
			TableName:                           aws.String(s.tables.Egress),
			Item:                                it,
			ConditionExpression:                 aws.String(condAbsentOrExpired),
			ExpressionAttributeNames:            expiryNames(attrFleetRunID),
			ExpressionAttributeValues:           map[string]types.AttributeValue{":now": nowValue(now)},
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		out = it
	} else {
		var res *dynamodb.UpdateItemOutput
		res, err = s.api.UpdateItem(ctx, s.headUpdate(h, expect, token, now))
		if err == nil {
			out = res.Attributes
		}
	}
	if failed, old := conditionFailed(err); failed {
		held, herr := s.holder(ctx, s.tables.Egress, seqKey(h.FleetRunID, headSeq), old)
		if herr != nil {
			return store.EgressHead{}, fault("put egress head: reading the stored one", herr)
		}
		var stored store.EgressHead
		if held != nil {
			if stored, err = headFromItem(held); err != nil {
				return store.EgressHead{}, fault("put egress head", err)
			}
			if store.Expired(stored.ExpiresAt, now) {
				stored = store.EgressHead{}
			} else if stored.Version == h.Version && wroteBy(held, token) {
				return stored, nil
			}
		}
		return store.EgressHead{}, fmt.Errorf("dynamostore: egress head of run %q is at version %d, not %d: %w",
			h.FleetRunID, stored.Version, expect, store.ErrConflict)
	}
	if err != nil {
		return store.EgressHead{}, fault("put egress head", err)
	}
	stored, err := headFromItem(out)
	if err != nil {
		return store.EgressHead{}, fault("put egress head", err)
	}
	return stored, nil
}

// headUpdate is the update of a stored head at version expect to h.
func (s *Store) headUpdate(h store.EgressHead, expect int64, token types.AttributeValue, now time.Time) *dynamodb.UpdateItemInput {
	names := expiryNames(attrFleetRunID)
	names["#version"], names["#wt"] = attrHeadVersion, attrWriteToken
	values := map[string]types.AttributeValue{
		":now":    nowValue(now),
		":expect": &types.AttributeValueMemberN{Value: strconv.FormatInt(expect, 10)},
		":wt":     token,
	}
	sets := []string{"#wt = :wt"}
	var removes []string
	set := headMutable(h)
	for i, name := range headMutableNames {
		ph := "#a" + strconv.Itoa(i)
		names[ph] = name
		if v, ok := set[name]; ok {
			values[":a"+strconv.Itoa(i)] = v
			sets = append(sets, ph+" = :a"+strconv.Itoa(i))
		} else {
			removes = append(removes, ph)
		}
	}
	if first := store.KeptFirstAlertAt(time.Time{}, h, now); !first.IsZero() {
		i := 0
		for name, v := range alertAttrs(h.FleetRunID, first) {
			ph, vp := "#f"+strconv.Itoa(i), ":f"+strconv.Itoa(i)
			names[ph], values[vp] = name, v
			sets = append(sets, fmt.Sprintf("%s = if_not_exists(%s, %s)", ph, ph, vp))
			i++
		}
	}
	expr := "SET " + strings.Join(sets, ", ")
	if len(removes) > 0 {
		expr += " REMOVE " + strings.Join(removes, ", ")
	}
	return &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.tables.Egress),
		Key:                                 seqKey(h.FleetRunID, headSeq),
		UpdateExpression:                    aws.String(expr),
		ConditionExpression:                 aws.String(condPresentUnexpired + " AND #version = :expect"),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           values,
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
}

// ExtendEgressExpiry moves the expiry of the run's unexpired chunks and
// head that expire before to (extendExpiry).
func (s *Store) ExtendEgressExpiry(ctx context.Context, fleetRunID string, to time.Time) error {
	if err := s.extendExpiry(ctx, s.tables.Egress, attrSeq, fleetRunID, to); err != nil {
		return fault(fmt.Sprintf("extend the expiry of the egress ledger of run %q", fleetRunID), err)
	}
	return nil
}

// ListAlertedRuns pages the alerted index newest first, strictly before
// the cursor's position, and fetches the page's heads with BatchGetItem
// (eventually consistent: the index is too); expired or vanished heads are
// skipped and more keys pulled until the page (plus one, to know whether
// there is a next page) is full.
func (s *Store) ListAlertedRuns(ctx context.Context, cur string, limit int) (store.AlertedPage, error) {
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Egress),
		IndexName:                 aws.String(indexAlerted),
		KeyConditionExpression:    aws.String("#a = :a"),
		ExpressionAttributeNames:  map[string]string{"#a": attrAlerted},
		ExpressionAttributeValues: map[string]types.AttributeValue{":a": &types.AttributeValueMemberS{Value: alertedValue}},
		ScanIndexForward:          aws.Bool(false),
	}
	if cur != "" {
		pos, err := cursor.DecodeAlerted(cur)
		if err != nil {
			return store.AlertedPage{}, err
		}
		in.KeyConditionExpression = aws.String("#a = :a AND #k < :before")
		in.ExpressionAttributeNames["#k"] = attrAlertKey
		in.ExpressionAttributeValues[":before"] = &types.AttributeValueMemberS{Value: createdKey(pos.FirstAlertAt, pos.FleetRunID)}
	}
	limit = store.PageLimit(limit)
	want := limit + 1
	now := s.now()
	var heads []store.EgressHead
	for len(heads) < want {
		in.Limit = aws.Int32(int32(want - len(heads)))
		out, err := s.api.Query(ctx, in)
		if err != nil {
			return store.AlertedPage{}, fault("list alerted runs", err)
		}
		keys := make([]item, 0, len(out.Items))
		order := make([]string, 0, len(out.Items))
		for _, it := range out.Items {
			id, ok := it[attrFleetRunID].(*types.AttributeValueMemberS)
			if !ok {
				return store.AlertedPage{}, fault("list alerted runs", fmt.Errorf("index entry without fleetRunId: %v", sortedKeys(it)))
			}
			keys = append(keys, seqKey(id.Value, headSeq))
			order = append(order, id.Value)
		}
		items, err := s.batchGet(ctx, s.tables.Egress, keys, false)
		if err != nil {
			return store.AlertedPage{}, fault("list alerted runs", err)
		}
		byID := make(map[string]store.EgressHead, len(items))
		for _, it := range items {
			h, err := headFromItem(it)
			if err != nil {
				return store.AlertedPage{}, fault("list alerted runs", err)
			}
			byID[h.FleetRunID] = h
		}
		for _, id := range order {
			if h, ok := byID[id]; ok && !store.Expired(h.ExpiresAt, now) && !h.FirstAlertAt.IsZero() {
				heads = append(heads, h)
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
	page := store.AlertedPage{Heads: heads}
	if len(heads) > limit {
		page.Heads = heads[:limit]
		last := heads[limit-1]
		page.NextCursor = cursor.EncodeAlerted(cursor.Alerted{FirstAlertAt: last.FirstAlertAt, FleetRunID: last.FleetRunID})
	}
	return page, nil
}
