package tests

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	"shared/jsonstrict":  true, // one refusal of a key given twice (Fleet's API, the host API, edge's config)
	"shared/egress":      true, // the egress ledger's record, chain and seal, which edge writes and Fleet verifies
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
			case pkg == "edge/ca" && (inFolder(imp, "edge/proxy") || inFolder(imp, "edge/runner")):
				// edge/host wires the CA, the proxy and the runner
				// together: the CA issues the proxy's leaves and the
				// bundle tasks trust through what edge/host hands it,
				// knowing neither.
				crossings = append(crossings, pkg+" (the CA) imports "+imp)
			case inFolder(pkg, "edge/proxy") && inFolder(imp, "edge/runner"):
				// The proxy knows a task by what edge/host registers
				// with it, never by the runner that starts it.
				crossings = append(crossings, pkg+" (the proxy) imports "+imp)
			case (pkg == "edge/runlog" || strings.HasPrefix(pkg, "shared/store")) && (imp == "shared/hostproto" || imp == "shared/runspec" || imp == "shared/fleetapi"):
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

// inFolder reports whether pkg is the package folder or one below it.
func inFolder(pkg, folder string) bool { return pkg == folder || strings.HasPrefix(pkg, folder+"/") }

// lambdaMustNotLink says why a Lambda function may not link a package (or
// module) path: bbolt and boltstore are the local stack's store, edge/ is
// the runner host. A function runs on DynamoDB only, and whatever it links
// it loads on every cold start. "" for any other path.
func lambdaMustNotLink(path string) string {
	const module = "github.com/runfleet/runfleet/"
	switch {
	case path == "go.etcd.io/bbolt" || strings.HasPrefix(path, "go.etcd.io/bbolt/"):
		return "bbolt, the local stack's store"
	case path == module+"shared/store/boltstore":
		return "the local stack's store"
	case path == module+"edge" || strings.HasPrefix(path, module+"edge/"):
		return "the runner host's"
	}
	return ""
}

// TestNoLambdaFunctionLinksBoltOrEdge builds every function of
// template.yaml as it ships (the Makefile's -tags lambda.norpc -trimpath,
// static; for this machine, as the emulator tests run it) and checks the
// two records of what it links: the packages of that build (go list's
// Deps, with the same tags and platform, and for linux/arm64 as make build
// ships it) hold no bbolt, no boltstore and nothing of edge/, and the
// modules the binary names (go version -m) hold no bbolt.
func TestNoLambdaFunctionLinksBoltOrEdge(t *testing.T) {
	var fns []string
	for _, pkg := range templateFunctions {
		fns = append(fns, pkg)
	}
	sort.Strings(fns)
	for _, platform := range []struct {
		name string
		env  []string
	}{
		{"this machine", nil},
		{"linux/arm64", []string{"GOOS=linux", "GOARCH=arm64"}},
	} {
		t.Run("packages/"+platform.name, func(t *testing.T) {
			args := []string{"list", "-tags", "lambda.norpc", "-f", "{{.ImportPath}}{{range .Deps}} {{.}}{{end}}"}
			for _, pkg := range fns {
				args = append(args, "./"+pkg)
			}
			cmd := exec.Command("go", args...)
			cmd.Dir = ".."
			cmd.Env = append(append(os.Environ(), "CGO_ENABLED=0"), platform.env...)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("go list: %v\n%s", err, out)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if len(lines) != len(fns) {
				t.Fatalf("go list answered for %d packages, want %d:\n%s", len(lines), len(fns), out)
			}
			for _, line := range lines {
				fields := strings.Fields(line)
				if !slices.Contains(fields[1:], "github.com/runfleet/runfleet/shared/fleetapp") {
					t.Fatalf("%s's packages lack fleetapp: not the list of its build", fields[0])
				}
				linked := map[string][]string{}
				for _, dep := range fields[1:] {
					if why := lambdaMustNotLink(dep); why != "" {
						linked[why] = append(linked[why], dep)
					}
				}
				for _, why := range slices.Sorted(maps.Keys(linked)) {
					t.Errorf("%s links %s: %s", fields[0], why, strings.Join(linked[why], ", "))
				}
			}
		})
	}
	t.Run("modules", func(t *testing.T) {
		for _, pkg := range fns {
			bin := functionBootstrap(t, filepath.Base(pkg))
			out, err := exec.Command("go", "version", "-m", bin).CombinedOutput()
			if err != nil {
				t.Fatalf("go version -m %s: %v\n%s", bin, err, out)
			}
			var deps int
			for _, line := range strings.Split(string(out), "\n") {
				fields := strings.Fields(line)
				if len(fields) < 2 || (fields[0] != "dep" && fields[0] != "=>") {
					continue
				}
				deps++
				if why := lambdaMustNotLink(fields[1]); why != "" {
					t.Errorf("%s's bootstrap links the module %s: %s", pkg, fields[1], why)
				}
			}
			if deps == 0 || !strings.Contains(string(out), "build\t-tags=lambda.norpc\n") || !strings.Contains(string(out), "build\tCGO_ENABLED=0\n") {
				t.Fatalf("go version -m %s names no module, or not the build that ships:\n%s", bin, out)
			}
		}
	})
}

// fleetAPIMustNotDependOn says why shared/fleetapi, shared/fleetclient or
// the runfleet CLI may not depend on a package path: callers import them to speak to
// Fleet, and must get the API's types without Fleet itself, its store, the
// AWS SDK, the host protocol or edge. "" for any other path.
func fleetAPIMustNotDependOn(path string) string {
	const module = "github.com/runfleet/runfleet/"
	switch {
	case strings.HasPrefix(path, "github.com/aws/"):
		return "the AWS SDK"
	case inFolder(path, module+"shared/store"):
		return "Fleet's store"
	case path == module+"shared/hostproto":
		return "the host protocol (its types are not the API's)"
	case path == module+"shared/fleet":
		return "Fleet's domain"
	case inFolder(path, module+"edge"):
		return "the runner host's"
	}
	return ""
}

// TestTheCallersToolsStandAlone: the whole dependency graph (go list
// -deps) of shared/fleetapi, of the Go client and of the runfleet binary
// holds none of fleetAPIMustNotDependOn's packages: a caller's program
// links the API's types and client without Fleet, its store or AWS.
func TestTheCallersToolsStandAlone(t *testing.T) {
	const module = "github.com/runfleet/runfleet/"
	for _, pkg := range []string{module + "shared/fleetapi", module + "shared/fleetclient", module + "shared/cli/runfleet"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps: %v\n%s", err, out)
		}
		deps := strings.Fields(string(out))
		if !slices.Contains(deps, pkg) || !slices.Contains(deps, module+"shared/fleetapi") {
			t.Fatalf("go list -deps %s does not list it and the API's types:\n%s", pkg, out)
		}
		found := map[string][]string{}
		for _, dep := range deps {
			if why := fleetAPIMustNotDependOn(dep); why != "" {
				found[why] = append(found[why], dep)
			}
		}
		for _, why := range slices.Sorted(maps.Keys(found)) {
			t.Errorf("%s depends on %s: %s", strings.TrimPrefix(pkg, module), why, strings.Join(found[why], ", "))
		}
	}
}
