// Command stream is the SSE stream of a run's events as a Lambda function
// behind a Function URL with InvokeMode RESPONSE_STREAM (the path,
// /fleet/runs/{id}/stream, read from rawPath). It only wires: the
// environment into Fleet's dependencies once per cold start, then the
// handler in shared/stream. Build it with -tags lambda.norpc (the Makefile
// does): streamed responses need the provided runtime's API.
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
		fmt.Fprintln(os.Stderr, "stream: configuration:", err)
		os.Exit(1)
	}
	log := fleetapp.NewLogger(os.Stdout, cfg.LogLevel)
	app, err := fleetapp.New(context.Background(), cfg, fleetapp.Deps{Logger: log, DefaultStore: config.StoreDynamoDB})
	if err != nil {
		log.Error("stream: start", "err", err)
		os.Exit(1)
	}
	lambda.Start(app.Stream.HandleLambda)
}
