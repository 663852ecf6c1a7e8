package fleetapi

import "encoding/json"

// Error is every error answer of the API and of the stream's refusals:
// {error, code?, details?}. Error names the field or cause for a person;
// Code is the machine code a client branches on.
type Error struct {
	Error string `json:"error"`
	Code  string `json:"code,omitempty"`
	// Details are extra facts for Code, as JSON: a NoEligibleHost for
	// no_eligible_host; a CredentialUnavailable for
	// credential_unavailable; {"fleetRunId"} for idempotency_key_reused and
	// dispatch_in_flight; {"reason", "status"} for run_not_on_host.
	// Decode them with json.Unmarshal into the type the code names.
	Details json.RawMessage `json:"details,omitempty"`
}

// CodeNoEligibleHost is the code of a dispatch that routing refused:
// Details is a NoEligibleHost.
const CodeNoEligibleHost = "no_eligible_host"

// CodeInvalidJSON is the code of a 400 for a request body that is not one
// well-formed JSON value (empty, form-encoded, cut short, malformed) or that
// gives a key twice in one object (the error names the key by its path, as
// runner.agents[2].argv). A body that is JSON but not what the route takes
// (an unknown field, a wrong type) is invalid_request.
const CodeInvalidJSON = "invalid_json"

// CodeCredentialUnavailable is the code of a 409 for a dispatch whose
// brokered key Fleet could not mint (the provider refused or failed):
// Details is a CredentialUnavailable. No run was started.
const CodeCredentialUnavailable = "credential_unavailable"

// CredentialUnavailable is the Details of credential_unavailable.
type CredentialUnavailable struct {
	ProjectID string `json:"projectId"`
	Key       string `json:"key"`
	Kind      string `json:"kind"`
	// ProviderStatus is the HTTP status the provider answered; absent
	// when it could not be reached.
	ProviderStatus int `json:"providerStatus,omitempty"`
}

// NoEligibleHost is the Details of a no_eligible_host refusal: every host
// routing left out with every reason that applied. Considered (and, for a
// caller that may use every host, Hosts) is set when routing read only
// part of a fleet larger than its routing view: how many hosts it
// considered, of how many. Its keys are in the order Fleet writes them.
type NoEligibleHost struct {
	Considered *int        `json:"considered,omitempty"`
	Excluded   []Exclusion `json:"excluded"`
	Hosts      *int        `json:"hosts,omitempty"`
}

// Exclusion is one host routing left out.
type Exclusion struct {
	HostID string `json:"hostId"`
	// Reasons are every reason that applied (disabled, never_probed,
	// stale_probe, unhealthy, draining, storage_low, agent_unsupported,
	// label_missing, repository_unavailable, secrets_unsupported).
	Reasons []string `json:"reasons"`
	// Agents are what the host offers, when it was left out for
	// agent_unsupported: what the caller could ask for instead.
	Agents []string `json:"agents,omitempty"`
	// Detail is what the host said when it refused the dispatch itself
	// (DispatchDetails), as the run's detail would.
	Detail string `json:"detail,omitempty"`
}
