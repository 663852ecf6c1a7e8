package secrets

import (
	"fmt"
	"log/slog"
)

// Redacted is what a Value shows wherever it is printed, logged or encoded.
const Redacted = "[redacted]"

// Value is a real value: it cannot print itself. String, every fmt verb
// (%v %+v %#v %s %q %x %X %d...), GoString, slog (LogValue) and the JSON
// and text encodings all give Redacted; Reveal is the one way to its bytes,
// called where they are written upstream.
//
// The bytes are held by a closure, so even a printer that reaches a Value
// by reflection without calling its methods (fmt on a struct holding one
// in an unexported field, with any verb) shows a function's address, never
// the value; and a Value is not comparable (==), so no code compares one in
// variable time. A Value is immutable and safe to copy and to share between
// goroutines; the zero Value is empty.
type Value struct{ reveal func() string }

// NewValue wraps s, as a source does once when it reads a value (not per
// request: a Value costs an allocation).
func NewValue(s string) Value { return Value{func() string { return s }} }

// Reveal returns the value's bytes. It is the one place a value leaves its
// type: call it only where the value is written to the upstream it is for
// (or compared with what an upstream answers), never to log or format it.
func (v Value) Reveal() string {
	if v.reveal == nil {
		return ""
	}
	return v.reveal()
}

// Len is the value's length in bytes, which is not secret to anyone who
// can see a request on the wire.
func (v Value) Len() int { return len(v.Reveal()) }

// IsZero reports whether v is empty.
func (v Value) IsZero() bool { return v.Len() == 0 }

func (Value) String() string   { return Redacted }
func (Value) GoString() string { return "secrets.Value(" + Redacted + ")" }

// Format writes Redacted for every verb and flag (%q quotes it, so the
// output keeps its shape), never the value.
func (Value) Format(f fmt.State, verb rune) {
	if verb == 'q' {
		f.Write([]byte(`"` + Redacted + `"`))
		return
	}
	f.Write([]byte(Redacted))
}

// LogValue makes slog log Redacted, with any handler.
func (Value) LogValue() slog.Value { return slog.StringValue(Redacted) }

// MarshalJSON encodes a Value as the JSON string "[redacted]".
func (Value) MarshalJSON() ([]byte, error) { return []byte(`"` + Redacted + `"`), nil }

// MarshalText encodes a Value as Redacted (encoding.TextMarshaler: map
// keys, XML, and encoders that prefer text).
func (Value) MarshalText() ([]byte, error) { return []byte(Redacted), nil }

var (
	_ fmt.Stringer   = Value{}
	_ fmt.GoStringer = Value{}
	_ fmt.Formatter  = Value{}
	_ slog.LogValuer = Value{}
)
