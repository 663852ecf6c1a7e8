package tests

import (
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// The folders are the architecture: shared/ is what Fleet's functions and
// edge use at run time, edge/ is the runner host, tests/kit/ the harnesses
// only tests use. A production import across those lines would blur that
// silently, so it fails here, naming the import.

// sharedWithEdge is every shared/ package edge may use at run time: the
// host protocol's wire types, the seams both halves inject, and the
// two readers both halves share (a re-read file, Secrets Manager).
var sharedWithEdge = map[string]bool{
	"shared/clock":       true,
	"shared/filewatch":   true, // one way to tell a re-read file changed (edge's policy and secrets, Fleet's credentials)
	"shared/hostproto":   true,
	"shared/netname":     true, // one rule for a name and a domain (a policy's, a run's, a CONNECT's)
	"shared/runspec":     true, // the one run request and its validation, which Fleet and edge share
	"shared/secretcache": true, // one Secrets Manager cache (edge's real values, Fleet's credentials)
	"shared/version":     true,
}

func TestTheFoldersAreTheArchitecture(t *testing.T) {
	const module = "github.com/runfleet/runfleet/"
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", module+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var crossings []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		for _, imp := range fields[1:] {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			imp = strings.TrimPrefix(imp, module)
			switch {
			case strings.HasPrefix(imp, "tests/") && !strings.HasPrefix(pkg, "tests/"):
				crossings = append(crossings, pkg+" imports the test kit "+imp)
			case strings.HasPrefix(pkg, "shared/") && strings.HasPrefix(imp, "edge"):
				crossings = append(crossings, pkg+" (Fleet) imports the host's "+imp)
			case strings.HasPrefix(pkg, "edge") && strings.HasPrefix(imp, "shared/") && !sharedWithEdge[imp]:
				crossings = append(crossings, pkg+" (edge) imports Fleet's "+imp)
			case (pkg == "edge/runlog" || strings.HasPrefix(pkg, "shared/store")) && (imp == "shared/hostproto" || imp == "shared/runspec"):
				// Records apart from the wire: a protocol change must
				// never be a data migration, on either side.
				crossings = append(crossings, pkg+" (stored records) imports the wire types "+imp)
			}
		}
	}
	sort.Strings(crossings)
	for _, c := range crossings {
		t.Error(c)
	}
}
