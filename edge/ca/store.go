package ca

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/runfleet/runfleet/edge/internal/atomicfile"
)

// The CA store is one JSON file under Config.Dir, replaced atomically, so a
// crash leaves either the old set or the new one, never a mix.
const (
	storeFileName = "authorities.json"
	storeVersion  = 1
	lockFileName  = "lock"
)

func storePath(dir string) string { return filepath.Join(dir, storeFileName) }

// storedSet is the store file's wire form.
type storedSet struct {
	Version     int               `json:"version"`
	Authorities []storedAuthority `json:"authorities"`
}

// storedAuthority is one CA: its certificate, and its private key (PKCS #8
// DER) sealed by the Sealer with the certificate's fingerprint as aad, so a
// sealed key moved to another certificate does not open.
type storedAuthority struct {
	Certificate string `json:"certificate"`
	SealedKey   []byte `json:"sealedKey"`
}

// ErrStoreUnreadable and ErrSealedKey are why Open refuses to start: the
// store exists but cannot be read back, so minting a new CA over it would
// break every running task's trust.
var (
	ErrStoreUnreadable = errors.New("the CA store cannot be read")
	ErrSealedKey       = errors.New("a sealed CA key cannot be opened")
)

// refusal words the error for a store Open will not mint over.
func refusal(path string, kind error, detail string) error {
	return fmt.Errorf("ca: refusing to start: %w (%s): %s; a new CA is never minted over it, "+
		"since that would break every running task's trust: restore the file or the seal key "+
		"(or KMS access) that sealed it, or move %s away to start over with a new CA",
		kind, path, detail, filepath.Dir(path))
}

// readStore reads the stored set; a missing file is an empty set.
func readStore(dir string) ([]storedAuthority, error) {
	path := storePath(dir)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, refusal(path, ErrStoreUnreadable, err.Error())
	}
	return decodeStore(path, b)
}

// decodeStore reads the store file's content b (from path).
func decodeStore(path string, b []byte) ([]storedAuthority, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var set storedSet
	if err := dec.Decode(&set); err != nil {
		return nil, refusal(path, ErrStoreUnreadable, "not valid JSON (truncated or corrupt?): "+err.Error())
	}
	if dec.More() {
		return nil, refusal(path, ErrStoreUnreadable, "trailing data after the JSON document")
	}
	if set.Version != storeVersion {
		return nil, refusal(path, ErrStoreUnreadable, fmt.Sprintf("store version %d, this edge reads version %d", set.Version, storeVersion))
	}
	if len(set.Authorities) == 0 {
		return nil, refusal(path, ErrStoreUnreadable, "the store lists no CA")
	}
	return set.Authorities, nil
}

// writeStore replaces the stored set atomically.
func writeStore(dir string, authorities []storedAuthority) error {
	b, err := json.MarshalIndent(storedSet{Version: storeVersion, Authorities: authorities}, "", "  ")
	if err != nil {
		return fmt.Errorf("ca: encoding the CA store: %w", err)
	}
	if err := atomicfile.Write(storePath(dir), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	return nil
}

// removeStaleTemps clears the temp files a crash between write and rename
// left in dir. They hold only sealed keys, but nothing reads them.
func removeStaleTemps(dir string) { atomicfile.RemoveTemps(storePath(dir)) }

// lockDir takes an exclusive lock on dir for the Authority's lifetime, so
// two edges on one data dir cannot both rotate it.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFileName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ca: locking %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("ca: %s is in use by another edge process", dir)
		}
		return nil, fmt.Errorf("ca: locking %s: %w", dir, err)
	}
	return f, nil
}
