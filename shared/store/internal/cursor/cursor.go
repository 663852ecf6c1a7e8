// Package cursor owns the opaque list cursors that both store
// implementations issue: where a ListRuns, ListLive or ListAlertedRuns page
// ended, bound to
// the query it came from, so a cursor from another query (or made up) is
// store.ErrBadCursor rather than a silently different listing.
//
// A runs cursor is a position in the total order (CreatedAt, FleetRunID),
// not a backend key: the next page is "everything strictly older than this
// position", which both stores can answer (bbolt by seeking, DynamoDB with a
// key condition per index partition) and which stays correct when runs are
// added or deleted between pages.
package cursor

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"github.com/runfleet/runfleet/shared/store"
)

// version is the cursor format; a cursor of another version is rejected.
const version = 1

const (
	kindRuns    = "runs"
	kindLive    = "live"
	kindAlerted = "alerted"
)

// maxLen bounds what is decoded: a real cursor is well under this.
const maxLen = 2048

// Runs is the position a ListRuns page ended at.
type Runs struct {
	// Scope is the query's Scope().
	Scope      string
	CreatedAt  time.Time
	FleetRunID string
}

// wire is the JSON inside a cursor.
type wire struct {
	V     int    `json:"v"`
	Kind  string `json:"k"`
	Scope string `json:"s,omitempty"`
	Nanos int64  `json:"t,omitempty"`
	ID    string `json:"id"`
}

// Scope names what a query lists: "owner:<id>", "host:<id>" or "all".
func Scope(q store.RunQuery) string {
	switch {
	case q.OwnerID != "":
		return "owner:" + q.OwnerID
	case q.HostID != "":
		return "host:" + q.HostID
	}
	return "all"
}

// EncodeRuns makes the cursor that continues after r.
func EncodeRuns(r Runs) string {
	return encode(wire{V: version, Kind: kindRuns, Scope: r.Scope, Nanos: r.CreatedAt.UnixNano(), ID: r.FleetRunID})
}

// DecodeRuns reads a runs cursor issued for scope; anything else is
// store.ErrBadCursor.
func DecodeRuns(s, scope string) (Runs, error) {
	w, err := decode(s, kindRuns)
	if err != nil {
		return Runs{}, err
	}
	if w.Scope != scope {
		return Runs{}, fmt.Errorf("store: cursor belongs to another listing: %w", store.ErrBadCursor)
	}
	return Runs{Scope: w.Scope, CreatedAt: time.Unix(0, w.Nanos).UTC(), FleetRunID: w.ID}, nil
}

// EncodeLive makes the ListLive cursor that continues after the run id.
func EncodeLive(fleetRunID string) string {
	return encode(wire{V: version, Kind: kindLive, ID: fleetRunID})
}

// DecodeLive reads a ListLive cursor; anything else is store.ErrBadCursor.
func DecodeLive(s string) (string, error) {
	w, err := decode(s, kindLive)
	if err != nil {
		return "", err
	}
	return w.ID, nil
}

// Alerted is the position a ListAlertedRuns page ended at, in the order
// (FirstAlertAt, FleetRunID) descending.
type Alerted struct {
	FirstAlertAt time.Time
	FleetRunID   string
}

// EncodeAlerted makes the ListAlertedRuns cursor that continues after a.
func EncodeAlerted(a Alerted) string {
	return encode(wire{V: version, Kind: kindAlerted, Nanos: a.FirstAlertAt.UnixNano(), ID: a.FleetRunID})
}

// DecodeAlerted reads a ListAlertedRuns cursor; anything else is
// store.ErrBadCursor.
func DecodeAlerted(s string) (Alerted, error) {
	w, err := decode(s, kindAlerted)
	if err != nil {
		return Alerted{}, err
	}
	return Alerted{FirstAlertAt: time.Unix(0, w.Nanos).UTC(), FleetRunID: w.ID}, nil
}

func encode(w wire) string {
	// A struct of strings and ints always marshals.
	b, _ := json.Marshal(w)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decode(s, kind string) (wire, error) {
	if len(s) > maxLen {
		return wire{}, fmt.Errorf("store: cursor too long: %w", store.ErrBadCursor)
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return wire{}, fmt.Errorf("store: cursor is not base64url: %w", store.ErrBadCursor)
	}
	var w wire
	if err := json.Unmarshal(b, &w); err != nil {
		return wire{}, fmt.Errorf("store: cursor is not readable: %w", store.ErrBadCursor)
	}
	if w.V != version || w.Kind != kind || w.ID == "" {
		return wire{}, fmt.Errorf("store: cursor was not issued by this store: %w", store.ErrBadCursor)
	}
	return w, nil
}
