// Package routeview owns the stored form of the routing view's entries,
// which both store implementations keep: a shard's hosts as gzip-compressed
// JSON of short-named fields, and the packing of a list into shards of a
// bounded size, so both stores keep the same hosts in the same shards.
package routeview

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/runfleet/runfleet/shared/store"
)

// version is the entries' format, stored beside them; another is refused.
const version = 1

// Version is the entries' format version, for the store to keep.
const Version = version

// ShardBytes bounds a shard's blob: 4 KB (what an eventually consistent
// GetItem reads for half a unit) less 512 bytes for the item's id (up to
// "#route#a:" and a 256-byte agent name) and its other attributes.
const ShardBytes = 4096 - 512

// entry is one host as the view stores it: only what routing decides from
// (store.RouteStore's contract). Short names: a shard holds more hosts.
type entry struct {
	ID         string            `json:"i"`
	Enabled    bool              `json:"e,omitempty"`
	Labels     map[string]string `json:"l,omitempty"`
	LocalPaths []string          `json:"p,omitempty"`
	Probe      *probe            `json:"r,omitempty"`
}

type probe struct {
	Status string `json:"s"`
	// At is in Unix nanoseconds: staleness is judged to the nanosecond, as
	// on the host's item.
	At           int64    `json:"t"`
	LatencyMs    int64    `json:"m,omitempty"`
	Draining     bool     `json:"d,omitempty"`
	StorageLow   bool     `json:"w,omitempty"`
	Agents       []string `json:"a,omitempty"`
	SecretsProxy bool     `json:"x,omitempty"`
	ExecRequire  bool     `json:"q,omitempty"`
	// Load is [active, maxConcurrent]; absent when the host did not say.
	Load []int `json:"o,omitempty"`
}

func toEntry(h store.Host) entry {
	e := entry{ID: h.ID, Enabled: h.Enabled, Labels: h.Labels, LocalPaths: h.LocalPaths}
	if p := h.Probe; p != nil {
		e.Probe = &probe{Status: p.Status, At: p.At.UnixNano()}
		if p.Status == store.ProbeOK {
			e.Probe.LatencyMs = p.LatencyMs
			e.Probe.Draining = p.Draining
			e.Probe.StorageLow = p.Storage != nil && p.Storage.Low
			e.Probe.Agents = p.Agents
			e.Probe.SecretsProxy = p.Features.SecretsProxy
			e.Probe.ExecRequire = p.Features.ExecRequire
			if p.Load != nil {
				e.Probe.Load = []int{p.Load.Active, p.Load.MaxConcurrent}
			}
		}
	}
	return e
}

func (e entry) host() store.Host {
	h := store.Host{ID: e.ID, Enabled: e.Enabled, Labels: e.Labels, LocalPaths: e.LocalPaths}
	if p := e.Probe; p != nil {
		h.Probe = &store.Probe{
			Status: p.Status, At: time.Unix(0, p.At).UTC(), LatencyMs: p.LatencyMs, Draining: p.Draining, Agents: p.Agents,
			Features: store.Features{SecretsProxy: p.SecretsProxy, ExecRequire: p.ExecRequire},
		}
		if p.StorageLow {
			h.Probe.Storage = &store.Storage{Low: true}
		}
		if len(p.Load) == 2 {
			h.Probe.Load = &store.Load{Active: p.Load[0], MaxConcurrent: p.Load[1]}
		}
	}
	return h
}

// Entries keeps of h only what the view stores, as the store reads it back.
func Entries(hosts []store.Host) []store.Host {
	out := make([]store.Host, len(hosts))
	for i, h := range hosts {
		out[i] = toEntry(h).host()
	}
	return out
}

// encode compresses entries es. It cannot fail on these types.
func encode(es []entry) []byte {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err := json.NewEncoder(zw).Encode(es); err != nil {
		panic(fmt.Sprintf("routeview: encoding entries: %v", err))
	}
	if err := zw.Close(); err != nil {
		panic(fmt.Sprintf("routeview: compressing entries: %v", err))
	}
	return buf.Bytes()
}

// maxDecoded bounds a shard's decompressed size (a corrupt or hostile blob
// cannot balloon): far above what 4 KB of gzip of these entries holds.
const maxDecoded = 4 << 20

// Decode reads a shard's blob back into hosts.
func Decode(blob []byte) ([]store.Host, error) {
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		return nil, fmt.Errorf("routeview: shard: %w", err)
	}
	raw, err := io.ReadAll(io.LimitReader(zr, maxDecoded+1))
	if err != nil {
		return nil, fmt.Errorf("routeview: shard: %w", err)
	}
	if len(raw) > maxDecoded {
		return nil, fmt.Errorf("routeview: shard decompresses past %d bytes", maxDecoded)
	}
	var es []entry
	if err := json.Unmarshal(raw, &es); err != nil {
		return nil, fmt.Errorf("routeview: shard: %w", err)
	}
	hosts := make([]store.Host, len(es))
	for i, e := range es {
		hosts[i] = e.host()
	}
	return hosts, nil
}

// Pack splits hosts, in order, into at most maxShards blobs of at most
// maxBytes each, each holding as many hosts as fit; the hosts that do not
// fit in maxShards are left out, and so is a host whose entry alone is
// larger than a shard (labels and local paths near their bounds, which do
// not compress): such a host is routed to only by name. It returns the
// blobs and how many hosts they hold.
func Pack(hosts []store.Host, maxShards, maxBytes int) (blobs [][]byte, kept int) {
	es := make([]entry, len(hosts))
	for i, h := range hosts {
		es[i] = toEntry(h)
	}
	for len(blobs) < maxShards && len(es) > 0 {
		n, blob := fit(es, maxBytes)
		if n == 0 {
			es = es[1:] // too large alone
			continue
		}
		blobs = append(blobs, blob)
		kept += n
		es = es[n:]
	}
	return blobs, kept
}

// fit finds the most leading entries of es whose blob is within maxBytes:
// doubling from 64 while the blob fits, then a binary search between the
// last count that fitted and the first that did not, to within 1/64
// (compressed size grows with the count, near enough: a shard may hold a
// few hosts fewer than the densest packing). A few compressions per shard
// whatever len(es).
func fit(es []entry, maxBytes int) (int, []byte) {
	lo, hi := 0, 0
	var best []byte
	for n := min(64, len(es)); ; n = min(2*n, len(es)) {
		blob := encode(es[:n])
		if len(blob) > maxBytes {
			hi = n - 1
			break
		}
		lo, best = n, blob
		if n == len(es) {
			return lo, best
		}
	}
	// Within 1/64 of the densest count is close enough, and saves the
	// search's last, costliest steps.
	for hi-lo > max(0, lo/64) {
		mid := (lo + hi + 1) / 2
		blob := encode(es[:mid])
		if len(blob) <= maxBytes {
			lo, best = mid, blob
		} else {
			hi = mid - 1
		}
	}
	return lo, best
}

// Encode is the blob of hosts in one shard, whatever its size (an empty
// list is one shard of no host).
func Encode(hosts []store.Host) []byte {
	es := make([]entry, len(hosts))
	for i, h := range hosts {
		es[i] = toEntry(h)
	}
	return encode(es)
}
