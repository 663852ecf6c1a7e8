package runner

import (
	"testing"

	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

func TestMain(m *testing.M) { edgetest.RunTests(m) }
