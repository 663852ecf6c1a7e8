// Command api is Fleet's HTTP API as a Lambda function behind an API Gateway
// HTTP API (payload format 2.0). It only wires: the environment into
// Fleet's dependencies once per cold start, then the handler in shared/api.
package main

import (
	"fmt"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/runfleet/runfleet/shared/fleetapp"
)

func main() {
	app, err := fleetapp.StartFunction(os.Getenv, os.Stdout, fleetapp.Function{Name: "api"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lambda.Start(app.API.Handle)
}
