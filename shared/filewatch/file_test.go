package filewatch

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A File reads on its first Check, re-reads only when the file's stamp
// changes, keeps a failed reading without reading again until the next
// change, survives the file going missing, and re-reads on Reload whatever
// the stamp.
func TestFileRereadsOnlyOnChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path+".tmp", []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	reads := 0
	bad := errors.New("bad content")
	f := New(path, func(p string) (string, error) {
		reads++
		b, err := os.ReadFile(p)
		if string(b) == "bad" {
			return "", bad
		}
		return string(b), err
	})
	expect := func(reread bool, value string, wantErr error, wantReads int) {
		t.Helper()
		got, err := f.Check()
		if err != nil || got != reread {
			t.Fatalf("Check = %v, %v; want %v", got, err, reread)
		}
		if v, err := f.Reading(); v != value || !errors.Is(err, wantErr) || reads != wantReads {
			t.Fatalf("reading %q, %v after %d reads; want %q, %v after %d", v, err, reads, value, wantErr, wantReads)
		}
	}
	write("one")
	expect(true, "one", nil, 1)
	expect(false, "one", nil, 1)
	write("two")
	expect(true, "two", nil, 2)
	write("bad")
	expect(true, "", bad, 3)
	expect(false, "", bad, 3)

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if reread, err := f.Check(); err == nil || reread {
		t.Fatalf("Check of a missing file = %v, %v", reread, err)
	}
	f.Reload()
	if _, err := f.Reading(); err == nil || reads != 4 {
		t.Fatalf("Reload of a missing file: %v after %d reads", err, reads)
	}
	write("back")
	expect(true, "back", nil, 5)
	f.Reload()
	if v, _ := f.Reading(); v != "back" || reads != 6 {
		t.Fatalf("Reload of an unchanged file: %q after %d reads", v, reads)
	}
	expect(false, "back", nil, 6)
}
