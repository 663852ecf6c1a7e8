package fleet

import (
	"encoding/pem"
	"regexp"
	"unicode/utf8"

	"github.com/runfleet/runfleet/shared/auth"
	"github.com/runfleet/runfleet/shared/runspec"
)

// What Fleet accepts. Every record is stored as one item, and DynamoDB
// refuses an item over 400 KB (and a key over 2048 bytes, even on a read):
// input is bounded here, where the refusal is a 400 naming the field, so a
// store never meets what it cannot hold (which would be a 500 on DynamoDB
// and a 201 on bbolt). The bounds leave every item well below the limit:
// a host at most ~150 KB (labels ~20 KB, localPaths 64 KiB, caPem 64 KiB),
// each of a caller's two items at most ~130 KB (both scopes, 1000 ids of at
// most 64 bytes each), a run ~1 KB (a run item keeps none of the prompt,
// argv or env). What a run asks is bounded by the run request's own limits
// (runspec), the same on every side.
const (
	// MaxLabels bounds a host's or a dispatch's labels; keys have the id
	// shape, values MaxLabelValue bytes.
	MaxLabels     = 64
	MaxLabelValue = 256
	// MaxLocalPaths bounds a host's localPaths, each at most
	// runspec.MaxPathBytes.
	MaxLocalPaths = 64
	// MaxBaseURLBytes bounds a host's baseUrl.
	MaxBaseURLBytes = 2048
	// MaxCAPEMBytes bounds a host's caPem (a bundle of a few CA
	// certificates is a few KiB).
	MaxCAPEMBytes = 64 << 10
	// MaxScopeIDs bounds a caller's allowedHosts and allowedProjects.
	MaxScopeIDs = 1000
	// maxProbeAgents, maxProbeVersion, maxProbeLimits (limits' enforced
	// and detail together) and maxProbeLedgerKey bound what a probe records
	// of a host's /healthz answer (the host, not a caller, writes it).
	maxProbeAgents    = 64
	maxProbeAgentName = 256
	maxProbeVersion   = 128
	maxProbeLimits    = 1024
	maxProbeLedgerKey = 128
	// MaxDetailBytes bounds a run's detail (the human side of its reason):
	// a host writes it, and it is kept in the run's item and shown.
	MaxDetailBytes = 1024
)

// Ids in paths. Every id a caller puts in a path is checked for shape before
// any store call, by these functions: a malformed id names nothing, so it is
// a 404 as an unknown one is (never a store error, never a 500).
var runIDPattern = regexp.MustCompile(`^fr-[a-z2-7]{26}$`)

// runPathID refuses a run id that newRunID could not have made.
func runPathID(id string) *Error {
	if !runIDPattern.MatchString(id) {
		return notFound("run %s does not exist", runspec.Quoted(id))
	}
	return nil
}

// hostPathID refuses a host id that registration would have refused.
func hostPathID(id string) *Error {
	if !runspec.IDPattern.MatchString(id) {
		return notFound("host %s is not registered", runspec.Quoted(id))
	}
	return nil
}

// ownerPathID refuses an ownerId that a mint would have refused.
func ownerPathID(id string) *Error {
	if !auth.WellFormedOwnerID(id) {
		return notFound("caller %s does not exist", runspec.Quoted(id))
	}
	return nil
}

// boundDetail cuts a detail to MaxDetailBytes on a UTF-8 boundary.
func boundDetail(s string) string {
	if len(s) <= MaxDetailBytes {
		return s
	}
	const more = "..."
	keep := MaxDetailBytes - len(more)
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + more
}

// checkCAPEM accepts a PEM bundle of CERTIFICATE blocks only, at most
// MaxCAPEMBytes: anything else pasted there (a private key above all) is
// refused rather than stored and shown to admins.
func checkCAPEM(s string) *Error {
	if len(s) > MaxCAPEMBytes {
		return invalid("caPem: %d bytes; at most %d", len(s), MaxCAPEMBytes)
	}
	rest := []byte(s)
	for i := 1; ; i++ {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil
		}
		if block.Type != "CERTIFICATE" {
			return invalid("caPem: PEM block %d is a %q; want only CERTIFICATE blocks", i, block.Type)
		}
	}
}
