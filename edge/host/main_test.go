package host

import (
	"testing"

	"github.com/runfleet/runfleet/edge/internal/edgetest"
)

func TestMain(m *testing.M) { edgetest.RunTests(m, removeGoClient) }
