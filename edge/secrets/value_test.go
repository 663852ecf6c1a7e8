package secrets

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

const secret = "sk-live-do-not-print-0123456789"

// Every way Go prints, logs or encodes a value shows Redacted, never the
// value: directly, through a pointer, inside a struct (exported and
// unexported fields), a slice, a map, and an error that wraps it.
func TestValueNeverPrintsItself(t *testing.T) {
	v := NewValue(secret)
	type holder struct {
		Exported Value
		hidden   Value
		Ptr      *Value
	}
	h := holder{Exported: v, hidden: v, Ptr: &v}
	things := map[string]any{
		"value": v, "pointer": &v, "struct": h, "struct pointer": &h,
		"slice": []Value{v, v}, "map": map[string]Value{"k": v},
		"any slice": []any{v, &h},
	}
	verbs := []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T", "%10.3s", "%-20v", "%08x", "% x", "%+q", "%#q", "%p"}
	for name, x := range things {
		for _, verb := range verbs {
			if out := fmt.Sprintf(verb, x); strings.Contains(out, secret) || bytes.Contains([]byte(out), []byte(fmt.Sprintf("%x", secret))) {
				t.Errorf("%s %s: %q", name, verb, out)
			}
		}
		for _, out := range []string{fmt.Sprint(x), fmt.Sprintln(x), fmt.Sprint("x", x, 1)} {
			if strings.Contains(out, secret) {
				t.Errorf("%s Sprint: %q", name, out)
			}
		}
	}
	if got := fmt.Sprintf("%v|%q|%#v|%x", v, v, v, v); got != `[redacted]|"[redacted]"|[redacted]|[redacted]` {
		t.Errorf("formatted %q", got)
	}
	if v.String() != Redacted || !strings.Contains(v.GoString(), Redacted) || strings.Contains(v.GoString(), secret) {
		t.Errorf("String %q GoString %q", v.String(), v.GoString())
	}
	if v.Reveal() != secret || v.Len() != len(secret) || v.IsZero() || !(Value{}).IsZero() || (Value{}).Reveal() != "" {
		t.Error("Reveal, Len or IsZero")
	}

	err := fmt.Errorf("reading: %v (%q): %w", v, v, errors.New("inner"))
	wrapped := fmt.Errorf("outer: %w", err)
	if strings.Contains(wrapped.Error(), secret) || fmt.Sprintf("%+v", wrapped) != wrapped.Error() {
		t.Errorf("error %q", wrapped)
	}
}

func TestValueEncodesRedacted(t *testing.T) {
	v := NewValue(secret)
	type wire struct {
		Key   Value             `json:"key"`
		Ptr   *Value            `json:"ptr"`
		List  []Value           `json:"list"`
		Inner struct{ V Value } `json:"inner"`
	}
	w := wire{Key: v, Ptr: &v, List: []Value{v}}
	w.Inner.V = v
	b, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte(secret)) || !bytes.Contains(b, []byte(`"key":"[redacted]"`)) {
		t.Errorf("json %s", b)
	}
	type doc struct{ V Value }
	x, err := xml.Marshal(doc{v})
	if err != nil || bytes.Contains(x, []byte(secret)) || !bytes.Contains(x, []byte(Redacted)) {
		t.Errorf("xml %s %v", x, err)
	}
	text, _ := v.MarshalText()
	if string(text) != Redacted {
		t.Errorf("text %s", text)
	}
}

// slog's JSON and text handlers, given a Value as an attribute, inside a
// group, inside a struct (JSON: encoding/json; text: fmt), or as the
// message's argument.
func TestValueLogsRedacted(t *testing.T) {
	v := NewValue(secret)
	type holder struct {
		V     Value
		inner Value
	}
	for name, newHandler := range map[string]func(*bytes.Buffer) slog.Handler{
		"json": func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
		"text": func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
	} {
		var buf bytes.Buffer
		log := slog.New(newHandler(&buf))
		log.Info("read", "value", v, "ptr", &v, slog.Group("g", slog.Any("v", v)), "struct", holder{v, v})
		log.Info(fmt.Sprint("message ", v), slog.Any("error", fmt.Errorf("wrapping %v", v)))
		log.With("bound", v).Info("with")
		log.LogAttrs(context.Background(), slog.LevelWarn, "attrs", slog.Any("v", v), slog.String("s", v.String()))
		if strings.Contains(buf.String(), secret) || !strings.Contains(buf.String(), Redacted) {
			t.Errorf("%s handler: %s", name, buf.String())
		}
	}
}

// Observed hands every value read to its hook, and nothing on an error.
func TestObservedSeesEveryValueRead(t *testing.T) {
	src := mapSource{"p/K": NewValue(secret)}
	var seen []string
	o := Observed(src, func(v Value) { seen = append(seen, v.Reveal()) })
	for range 2 {
		if v, err := o.Value(context.Background(), "p", "K"); err != nil || v.Reveal() != secret {
			t.Fatalf("%v", err)
		}
	}
	if _, err := o.Value(context.Background(), "p", "MISSING"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	if len(seen) != 2 || seen[0] != secret {
		t.Fatalf("seen %d values", len(seen))
	}
}

type mapSource map[string]Value

func (m mapSource) Value(_ context.Context, project, key string) (Value, error) {
	v, ok := m[ID(project, key)]
	if !ok {
		return Value{}, ErrNotFound
	}
	return v, nil
}
