// Command dispatcher fills hosts with runs that wait, as a Lambda function
// on the DispatchWakes queue's event source mapping (batches of wakes,
// ReportBatchItemFailures): each wake names a host that may have room,
// and the runs it can take are offered to it and started, each exactly
// once. It only wires: the environment into Fleet's dependencies once per
// cold start, then the handler in shared/wake.
package main

import (
	"fmt"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/runfleet/runfleet/shared/fleetapp"
)

func main() {
	app, err := fleetapp.StartFunction(os.Getenv, os.Stdout, fleetapp.Function{Name: "dispatcher", Scheduled: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lambda.Start(app.Dispatcher.Handle)
}
