package broker_test

import (
	"os"
	"testing"

	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

// moto serves KMS, Secrets Manager and DynamoDB to every test here.
var moto *motoserver.Server

func TestMain(m *testing.M) {
	os.Exit(motoserver.Run(m, func(s *motoserver.Server) { moto = s }))
}
