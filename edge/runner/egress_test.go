package runner

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

func TestDecideEgress(t *testing.T) {
	tests := []struct {
		name    string
		facts   egressFacts
		verdict egressVerdict
		reason  string
	}{
		{"nothing known refuses (deny by default)", egressFacts{}, egressRefuse, "neither"},
		{"tasks with groups of their own are confined", egressFacts{Mode: TaskEgressConfined, OwnGroups: true}, egressConfine, ""},
		{"insecureOpen leaves them open, saying so", egressFacts{Mode: TaskEgressInsecureOpen, OwnGroups: true}, egressOpen, "metadata"},
		{"tasks as edge itself cannot be confined", egressFacts{Mode: TaskEgressConfined, SameUser: true}, egressRefuse, "runner.insecureSameUser"},
		{"tasks as edge itself run open where declared", egressFacts{Mode: TaskEgressInsecureOpen, SameUser: true}, egressOpen, ""},
		{"an edge that is not root runs no task, so starts with nothing to confine", egressFacts{Mode: TaskEgressConfined}, egressNoTasks, "not root"},
		{"an unknown mode refuses", egressFacts{Mode: "open", OwnGroups: true}, egressRefuse, "neither"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := decideEgress(tt.facts)
			if d.Verdict != tt.verdict || !strings.Contains(d.Reason, tt.reason) {
				t.Fatalf("decideEgress(%+v) = %+v, want verdict %d with a reason mentioning %q", tt.facts, d, tt.verdict, tt.reason)
			}
			if d.Verdict == egressRefuse && !strings.Contains(d.Reason, TaskEgressInsecureOpen) {
				t.Fatalf("the refusal %q does not say how to start anyway", d.Reason)
			}
		})
	}
}

// recordingConfiner stands in for nftables where the test is about what
// the runner asks of it (the real one is tested in package sandbox and
// against a network namespace in package host).
type recordingConfiner struct {
	mu         sync.Mutex
	installErr error
	installed  [][2]uint32
	removed    int
}

func (c *recordingConfiner) Install(first, last uint32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.installErr != nil {
		return c.installErr
	}
	c.installed = append(c.installed, [2]uint32{first, last})
	return nil
}

func (c *recordingConfiner) Remove() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removed++
	return nil
}

func TestNewConfinesTaskGroupsAndShutdownLiftsIt(t *testing.T) {
	c := &recordingConfiner{}
	h := newHarness(t, func(cfg *Config) { cfg.Confiner = c })
	if !h.r.EgressConfined() || len(c.installed) != 1 || c.installed[0] != [2]uint32{DefaultTaskGroupFirst, DefaultTaskGroupFirst + DefaultTaskGroupCount - 1} {
		t.Fatalf("confined %v, installs %v: want the whole task group range", h.r.EgressConfined(), c.installed)
	}
	if c.removed != 0 {
		t.Fatal("the confinement was removed while the runner runs")
	}
	h.close()
	if c.removed != 1 {
		t.Fatalf("Shutdown removed the confinement %d times, want once", c.removed)
	}
}

func TestNewRefusesToStartWhereItCannotConfine(t *testing.T) {
	edgetest.RequireRoot(t)
	c := &recordingConfiner{installErr: errors.New("nft: no such file")}
	l, err := runlog.Open(filepath.Join(t.TempDir(), "runs.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cfg := Config{WorkDir: filepath.Join(edgetest.TraversableDir(t), "work"), Confiner: c}
	_, err = New(cfg, l, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "nft: no such file") || !strings.Contains(err.Error(), "runner.egress") || !strings.Contains(err.Error(), TaskEgressInsecureOpen) {
		t.Fatalf("New without a working confiner = %v, want a refusal naming runner.egress and the way out", err)
	}

	// A working confiner is not enough: each task's network must be made.
	cfg.Confiner = &recordingConfiner{}
	cfg.NFT = "/nonexistent/nft"
	_, err = New(cfg, l, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "creating a task's network") || !strings.Contains(err.Error(), "/nonexistent/nft") ||
		!strings.Contains(err.Error(), TaskEgressInsecureOpen) {
		t.Fatalf("New where a task's network cannot be made = %v, want a refusal naming why and the way out", err)
	}

	cfg.Confiner = c
	cfg.Egress = TaskEgressInsecureOpen
	r, err := New(cfg, l, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown(t.Context(), 0)
	if r.EgressConfined() || len(c.installed) != 0 {
		t.Fatalf("insecureOpen: confined %v, installs %v", r.EgressConfined(), c.installed)
	}
}

// TestNewThatFailsLeavesNoControlGroups: a runner that cannot start (here
// its confinement) removes the control group parents it made for its
// tasks, so a host where edge fails to start is left as it was.
func TestNewThatFailsLeavesNoControlGroups(t *testing.T) {
	edgetest.RequireRoot(t)
	l, err := runlog.Open(filepath.Join(t.TempDir(), "runs.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cfg := Config{WorkDir: filepath.Join(edgetest.TraversableDir(t), "work"), Confiner: &recordingConfiner{installErr: errors.New("nft: no such file")}}
	if _, err := New(cfg, l, nil, nil); err == nil {
		t.Fatal("New with a failing confiner started")
	}
	name := "runfleet-edge-" + edgeID(cfg.WorkDir)
	var left []string
	filepath.WalkDir("/sys/fs/cgroup", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil || !d.IsDir():
			return nil
		case d.Name() == name:
			left = append(left, path)
			return fs.SkipDir
		case strings.Count(path, "/") > 6:
			return fs.SkipDir
		}
		return nil
	})
	if len(left) > 0 {
		t.Fatalf("New failed and left its control groups: %v", left)
	}
}

// TestPrecheckRefusesWhatNewWouldWithoutTouchingAnything: what New would
// refuse for tasks' egress or the system roots, Precheck names without
// making the work dir or installing anything.
func TestPrecheckRefusesWhatNewWouldWithoutTouchingAnything(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("tasks switch users only under root: run these tests as root (as in CI)")
	}
	work := filepath.Join(t.TempDir(), "work")
	base := Config{WorkDir: work, Egress: TaskEgressConfined}
	if errs := Precheck(base); len(errs) != 0 {
		t.Fatalf("a config New accepts here: %v", errs)
	}
	broken := base
	broken.NFT = filepath.Join(t.TempDir(), "no-nft")
	broken.SystemRootsFile = filepath.Join(t.TempDir(), "no-roots.pem")
	errs := Precheck(broken)
	if len(errs) != 2 || !strings.Contains(errs[0].Error(), "system roots") ||
		!strings.Contains(errs[1].Error(), "nft executable") || !strings.Contains(errs[1].Error(), TaskEgressInsecureOpen) {
		t.Fatalf("Precheck: %v", errs)
	}
	open := broken
	open.Egress = TaskEgressInsecureOpen
	if errs := Precheck(open); len(errs) != 1 {
		t.Fatalf("insecureOpen needs no nft: %v", errs)
	}
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Fatalf("Precheck made the work dir: %v", err)
	}
}
