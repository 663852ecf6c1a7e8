// Command stream is the SSE stream of a run's events as a Lambda function
// behind a Function URL with InvokeMode RESPONSE_STREAM (the path,
// /fleet/runs/{id}/stream, read from rawPath). It only wires: the
// environment into Fleet's dependencies once per cold start, then the
// handler in shared/stream. Build it with -tags lambda.norpc (the Makefile
// does): streamed responses need the provided runtime's API.
package main

import (
	"fmt"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/runfleet/runfleet/shared/fleetapp"
)

func main() {
	app, err := fleetapp.StartFunction(os.Getenv, os.Stdout, fleetapp.Function{Name: "stream"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lambda.Start(app.Stream.HandleLambda)
}
