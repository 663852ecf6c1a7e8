package filewatch

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A file replaced by a rename with the same size and modification time is
// still seen as changed (another inode); an untouched file is not; a
// rewrite of another size is.
func TestStampSeesAReplacementOfTheSameSizeAndTime(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "edge.json")
	mtime := time.Unix(1_800_000_000, 0)
	write := func(p, content string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	write(path, "aaaa")
	first, err := Of(path)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := Of(path); again != first {
		t.Fatal("an untouched file's stamp changed")
	}
	write(filepath.Join(dir, "new"), "bbbb")
	if err := os.Rename(filepath.Join(dir, "new"), path); err != nil {
		t.Fatal(err)
	}
	if replaced, _ := Of(path); replaced == first {
		t.Fatal("a same-size, same-mtime replacement was not seen")
	}
	write(path, "ccccc")
	if longer, _ := Of(path); longer == first {
		t.Fatal("a rewrite of another size was not seen")
	}
	if _, err := Of(filepath.Join(dir, "absent")); err == nil {
		t.Fatal("a missing file stamped")
	}
}
