package fleetapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"time"
)

// Scope is a caller's allowedHosts or allowedProjects: "*" (All: every id)
// or a list of ids.
type Scope struct {
	All bool
	IDs []string
}

// MarshalJSON writes "*" or the list ([] when empty, never null).
func (s Scope) MarshalJSON() ([]byte, error) {
	if s.All {
		return []byte(`"*"`), nil
	}
	ids := s.IDs
	if ids == nil {
		ids = []string{}
	}
	return json.Marshal(ids)
}

// maxQuoted bounds how much of a wrong string a scope error quotes.
const maxQuoted = 40

// UnmarshalJSON reads "*" or an array of strings. Anything else is a
// *json.UnmarshalTypeError, which the decoder names the field in; its
// Value is the JSON kind given, and for a string other than "*" the
// string quoted (at most 40 bytes of it): `string "all"`. null leaves s
// as it is, as for any type.
func (s *Scope) UnmarshalJSON(b []byte) error {
	if string(bytes.TrimSpace(b)) == "null" {
		return nil
	}
	var star string
	if json.Unmarshal(b, &star) == nil {
		if star != "*" {
			if len(star) > maxQuoted {
				star = star[:maxQuoted] + "..."
			}
			return &json.UnmarshalTypeError{Value: fmt.Sprintf("string %q", star), Type: reflect.TypeFor[Scope]()}
		}
		*s = Scope{All: true}
		return nil
	}
	var ids []string
	if err := json.Unmarshal(b, &ids); err != nil {
		return &json.UnmarshalTypeError{Value: jsonKind(b), Type: reflect.TypeFor[Scope]()}
	}
	if ids == nil {
		ids = []string{}
	}
	*s = Scope{IDs: ids}
	return nil
}

// jsonKind names a JSON value's kind as encoding/json's errors do.
func jsonKind(b []byte) string {
	switch b = bytes.TrimSpace(b); {
	case len(b) == 0:
		return "nothing"
	case b[0] == '[':
		return "array"
	case b[0] == '{':
		return "object"
	case b[0] == 't' || b[0] == 'f':
		return "bool"
	}
	return "number"
}

// MintCaller is POST /fleet/callers' body (admin). The scopes are required
// for a non-admin caller (nil: not given) and default to "*" for an admin.
type MintCaller struct {
	OwnerID         string `json:"ownerId"`
	AllowedHosts    *Scope `json:"allowedHosts,omitempty"`
	AllowedProjects *Scope `json:"allowedProjects,omitempty"`
	Admin           bool   `json:"admin,omitempty"`
}

// Minted is POST /fleet/callers' answer (201). The token is shown here
// only: Fleet keeps its SHA-256.
type Minted struct {
	OwnerID string `json:"ownerId"`
	Token   string `json:"token"`
}

// Caller is a minted caller, never its token.
type Caller struct {
	OwnerID         string    `json:"ownerId"`
	Admin           bool      `json:"admin"`
	AllowedHosts    Scope     `json:"allowedHosts"`
	AllowedProjects Scope     `json:"allowedProjects"`
	CreatedAt       time.Time `json:"createdAt"`
}

// CallerList is GET /fleet/callers (admin).
type CallerList struct {
	Callers []Caller `json:"callers"`
}

// Revoked is DELETE /fleet/callers/{ownerId}: the ownerId revoked.
type Revoked struct {
	Revoked string `json:"revoked"`
}
