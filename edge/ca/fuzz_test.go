package ca

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzReadBackStore feeds damaged store files and sealed keys to what Open
// reads first: nothing may panic, a damaged file is refused with one of
// the two refusal kinds, and no sealed key opens unless it is the genuine
// one.
func FuzzReadBackStore(f *testing.F) {
	ctx := context.Background()
	dir := f.TempDir()
	sealer, err := NewFileSealer(filepath.Join(dir, "seal.key"), nil)
	if err != nil {
		f.Fatal(err)
	}
	genuine, err := mintAuthority(ctx, t0, DefaultLifetime, rand.Reader, sealer)
	if err != nil {
		f.Fatal(err)
	}
	if err := writeStore(dir, []storedAuthority{genuine.stored()}); err != nil {
		f.Fatal(err)
	}
	file, err := os.ReadFile(storePath(dir))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(file)
	f.Add(file[:len(file)/2])
	f.Add(genuine.sealedKey)
	f.Add(genuine.sealedKey[:len(genuine.sealedKey)-1])
	f.Fuzz(func(t *testing.T, data []byte) {
		if !bytes.Equal(data, genuine.sealedKey) {
			if plain, err := sealer.Open(ctx, data, keyAAD(genuine.fingerprint)); err == nil {
				t.Fatalf("a forged sealed key opened: %x", plain)
			}
		}
		raw, err := decodeStore("authorities.json", data)
		var stored []*authority
		if err == nil {
			stored, err = parseStored("authorities.json", raw)
		}
		if err != nil {
			if !errors.Is(err, ErrStoreUnreadable) {
				t.Fatalf("a damaged store is refused without ErrStoreUnreadable: %v", err)
			}
			return
		}
		for _, s := range stored {
			if err := s.unseal(ctx, sealer); err == nil && s.fingerprint != genuine.fingerprint {
				t.Fatal("a key sealed for another certificate opened")
			}
		}
	})
}
