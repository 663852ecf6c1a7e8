// Command api is Fleet's HTTP API as a Lambda function behind an API Gateway
// HTTP API (payload format 2.0). It only wires: the environment into
// Fleet's dependencies once per cold start, then the handler in shared/api.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/fleetapp"
)

func main() {
	cfg, err := config.FromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "api: configuration:", err)
		os.Exit(1)
	}
	log := fleetapp.NewLogger(os.Stdout, cfg.LogLevel)
	app, err := fleetapp.New(context.Background(), cfg, fleetapp.Deps{Logger: log, DefaultStore: config.StoreDynamoDB})
	if err != nil {
		log.Error("api: start", "err", err)
		os.Exit(1)
	}
	lambda.Start(app.API.Handle)
}
