// Command probe is Fleet's scheduled probe as a Lambda function (EventBridge
// Scheduler): every enabled host probed and recorded within the
// invocation's budget. It only wires: the environment into Fleet's
// dependencies once per cold start, then the handler in shared/scheduled.
package main

import (
	"fmt"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/runfleet/runfleet/shared/fleetapp"
)

func main() {
	app, err := fleetapp.StartFunction(os.Getenv, os.Stdout, fleetapp.Function{Name: "probe", Scheduled: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lambda.Start(app.Jobs.Probe)
}
