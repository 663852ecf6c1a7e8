package secrets

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFileSourceRereadsOnChangeAndFailsClosed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secrets.json")
	write := func(s string) {
		t.Helper()
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"acme/OPENAI_API_KEY": "real-one"}`)
	src, err := NewFileSource(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if v, err := src.Value(ctx, "acme", "OPENAI_API_KEY"); err != nil || v.Reveal() != "real-one" {
		t.Fatalf("%q %v", v, err)
	}
	if _, err := src.Value(ctx, "acme", "OTHER"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("absent key: %v", err)
	}
	// A rotation (same size, new inode) applies to the next read.
	write(`{"acme/OPENAI_API_KEY": "real-two"}`)
	if v, _ := src.Value(ctx, "acme", "OPENAI_API_KEY"); v.Reveal() != "real-two" {
		t.Fatalf("after rotation: %q", v)
	}
	// A malformed file fails closed, and the error never quotes a value.
	write(`{"acme/OPENAI_API_KEY": "real-three"`)
	_, err = src.Value(ctx, "acme", "OPENAI_API_KEY")
	if err == nil || errors.Is(err, ErrNotFound) || strings.Contains(err.Error(), "real-") {
		t.Fatalf("malformed file: %v", err)
	}
	// So does a key given twice, naming the key and neither value.
	write(`{"acme/OPENAI_API_KEY": "real-four", "acme/OPENAI_API_KEY": "real-five"}`)
	_, err = src.Value(ctx, "acme", "OPENAI_API_KEY")
	if err == nil || !strings.Contains(err.Error(), `["acme/OPENAI_API_KEY"]: the key is given more than once`) || strings.Contains(err.Error(), "real-") {
		t.Fatalf("a key given twice: %v", err)
	}
	write(`{"acme/OPENAI_API_KEY": "real-four"}`)
	if v, _ := src.Value(ctx, "acme", "OPENAI_API_KEY"); v.Reveal() != "real-four" {
		t.Fatalf("after the fix: %q", v)
	}
	if _, err := NewFileSource(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Fatal("a missing file must fail at start")
	}
}
