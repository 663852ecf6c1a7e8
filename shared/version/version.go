// Package version names the product and its build, for /healthz answers,
// User-Agent headers and `edge version`.
package version

// Product is the product name reported by Fleet and edge.
const Product = "runfleet"

// Version is the build's version, set at link time with
// -ldflags "-X github.com/runfleet/runfleet/shared/version.Version=...".
var Version = "0.1.0-dev"
