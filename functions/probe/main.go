// Command probe is Fleet's scheduled probe as a Lambda function (EventBridge
// Scheduler): every enabled host probed and recorded within the
// invocation's budget. It only wires: the environment into Fleet's
// dependencies once per cold start, then the handler in shared/scheduled.
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
		fmt.Fprintln(os.Stderr, "probe: configuration:", err)
		os.Exit(1)
	}
	log := fleetapp.NewLogger(os.Stdout, cfg.LogLevel)
	app, err := fleetapp.New(context.Background(), cfg, fleetapp.Deps{Logger: log, DefaultStore: config.StoreDynamoDB})
	if err != nil {
		log.Error("probe: start", "err", err)
		os.Exit(1)
	}
	lambda.Start(app.Jobs.Probe)
}
