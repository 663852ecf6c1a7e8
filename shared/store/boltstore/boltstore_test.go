package boltstore_test

import (
	"path/filepath"
	"testing"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/boltstore"
	"github.com/runfleet/runfleet/tests/kit/storetest"
)

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clk *clock.Fake) store.Store {
		s, err := boltstore.Open(filepath.Join(t.TempDir(), "fleet.db"), boltstore.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		})
		return s
	})
}
