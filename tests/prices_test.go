package tests

// Public us-east-1 prices (checked 2026-12; AWS's pricing pages), in
// dollars, that turn measured durations and requests into cost. DynamoDB's
// are dynamostore.OnDemandUSEast1 (Usage.Dollars).
const (
	priceLambdaGBs      = 0.0000133334 // per GB-second, arm64 (template.yaml's Architectures)
	priceLambdaRequest  = 0.20 / 1e6   // per invocation (a Function URL request is one)
	priceHTTPAPIRequest = 1.00 / 1e6   // API Gateway HTTP API, first 300 M a month
	priceKMSRequest     = 0.03 / 1e4   // a KMS Encrypt or Decrypt of a symmetric key
)

// lambdaDollars is what invocations of a function of memoryMB cost when
// they are billed seconds in all.
func lambdaDollars(invocations, seconds float64, memoryMB int) float64 {
	return seconds*float64(memoryMB)/1024*priceLambdaGBs + invocations*priceLambdaRequest
}
