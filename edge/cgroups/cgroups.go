// Package cgroups owns the control groups that bound each task's resources:
// where on this host edge may make them (cgroup v2 where the controllers
// are there, else the v1 memory, pids and cpu hierarchies), one group per
// task attempt with its memory, process and CPU limits, what the kernel did
// to it (OOM kills, refused forks), and its end, with every process still
// in it.
//
// Groups live under edge's own cgroup, in a directory of this edge's
// (Options.Name), so limits nest inside whatever bounds edge itself and two
// edges on one host never touch each other's tasks.
package cgroups

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Limits are one task's bounds; a zero field sets no limit.
type Limits struct {
	// MemoryBytes bounds the task's memory (swap included where the kernel
	// accounts it): past it the kernel's OOM killer ends a process.
	MemoryBytes int64
	// Pids bounds how many processes and threads the task has at once;
	// past it fork and clone fail with EAGAIN.
	Pids int64
	// CPU bounds the task's CPU time per wall second, in cores (1.5: one
	// and a half cores' worth, however many it spins on).
	CPU float64
}

// Version is the cgroup hierarchy in use.
type Version int

const (
	V1 Version = 1
	V2 Version = 2
)

// controllers are what a task's limits need.
var controllers = []string{"memory", "pids", "cpu"}

// cpuPeriod is the CFS period a CPU limit is expressed against (the
// kernel's default): the quota is CPU×period per period.
const cpuPeriodMicros = 100_000

// Options say where to find this process's cgroups and where to make the
// tasks' groups.
type Options struct {
	// Name is the directory under edge's own cgroup that holds its tasks'
	// groups; one per edge on a host. Required.
	Name string
	// Proc is the proc file system; default "/proc". Tests point it at a
	// tree of their own.
	Proc string
}

// Hierarchy is where this edge makes its tasks' groups. Its methods are safe
// for concurrent use.
type Hierarchy struct {
	version Version
	// parents maps each controller to the directory holding the tasks'
	// groups; in v2 every controller maps to the same one.
	parents map[string]string
}

// Open finds this process's cgroups and makes the directory for its tasks'
// groups, with the controllers enabled: v2 when the unified hierarchy
// offers memory, pids and cpu, else v1 when each is mounted. It fails,
// saying why, where neither can be written. Groups left by an earlier edge
// of the same Name (a crash) are ended and removed.
func Open(o Options) (*Hierarchy, error) {
	if o.Name == "" || strings.ContainsAny(o.Name, "/\x00") || o.Name == "." || o.Name == ".." {
		return nil, fmt.Errorf("cgroups: invalid name %q", o.Name)
	}
	if o.Proc == "" {
		o.Proc = "/proc"
	}
	mounts, err := readMounts(filepath.Join(o.Proc, "self/mountinfo"))
	if err != nil {
		return nil, err
	}
	own, err := readOwn(filepath.Join(o.Proc, "self/cgroup"))
	if err != nil {
		return nil, err
	}
	var h *Hierarchy
	var v2err error
	if dir, ok := mounts.v2Dir(own); ok {
		if h, v2err = openV2(dir, o.Name); v2err == nil {
			return h.sweep()
		}
	}
	h, err = openV1(mounts, own, o.Name)
	if err != nil {
		if v2err != nil {
			return nil, fmt.Errorf("cgroups: %w; and cgroup v2: %w", err, v2err)
		}
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	return h.sweep()
}

// Version is the hierarchy in use.
func (h *Hierarchy) Version() Version { return h.version }

// openV2 makes dir/name with memory, pids and cpu enabled for its children.
// dir must offer them; where it holds processes of its own (edge, and
// whatever shares its cgroup), they move to dir/<name>-edge first: v2 lets
// only a cgroup without processes hand controllers to its children.
func openV2(dir, name string) (*Hierarchy, error) {
	offered, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return nil, fmt.Errorf("reading the controllers of %s: %w", dir, err)
	}
	have := strings.Fields(string(offered))
	for _, c := range controllers {
		if !slices.Contains(have, c) {
			return nil, fmt.Errorf("%s does not offer the %s controller", dir, c)
		}
	}
	if err := enableV2(dir); errors.Is(err, syscall.EBUSY) {
		if err := moveProcesses(dir, filepath.Join(dir, name+"-edge")); err != nil {
			return nil, err
		}
		err = enableV2(dir)
		if err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	parent := filepath.Join(dir, name)
	if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("making %s: %w", parent, err)
	}
	if err := enableV2(parent); err != nil {
		return nil, err
	}
	h := &Hierarchy{version: V2, parents: map[string]string{}}
	for _, c := range controllers {
		h.parents[c] = parent
	}
	return h, nil
}

func enableV2(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory +pids +cpu"), 0); err != nil {
		return fmt.Errorf("enabling memory, pids and cpu under %s: %w", dir, err)
	}
	return nil
}

// moveProcesses moves every process of from into the leaf to.
func moveProcesses(from, to string) error {
	if err := os.Mkdir(to, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("making %s: %w", to, err)
	}
	pids, err := readPids(filepath.Join(from, "cgroup.procs"))
	if err != nil {
		return err
	}
	for _, pid := range pids {
		err := os.WriteFile(filepath.Join(to, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
		if err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("moving process %d into %s: %w", pid, to, err)
		}
	}
	return nil
}

// openV1 makes name under this process's cgroup in the memory, pids and cpu
// hierarchies.
func openV1(mounts mountTable, own ownCgroups, name string) (*Hierarchy, error) {
	h := &Hierarchy{version: V1, parents: map[string]string{}}
	for _, c := range controllers {
		dir, ok := mounts.v1Dir(c, own)
		if !ok {
			return nil, fmt.Errorf("no cgroup v1 hierarchy with the %s controller is mounted", c)
		}
		parent := filepath.Join(dir, name)
		if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("making %s: %w", parent, err)
		}
		h.parents[c] = parent
	}
	return h, nil
}

// sweep ends and removes every group left under the parents.
func (h *Hierarchy) sweep() (*Hierarchy, error) {
	for _, dir := range h.dirs() {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("cgroups: listing %s: %w", dir, err)
		}
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			g := &Group{version: h.version, dirs: []string{filepath.Join(dir, e.Name())}}
			if err := g.Close(); err != nil {
				return nil, fmt.Errorf("cgroups: ending a group left in %s: %w", dir, err)
			}
		}
	}
	return h, nil
}

// dirs are the parents, each once.
func (h *Hierarchy) dirs() []string {
	var out []string
	for _, c := range controllers {
		if d := h.parents[c]; !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// Close ends every group left, as Group.Close does, and removes the tasks'
// parent directories.
func (h *Hierarchy) Close() error {
	if _, err := h.sweep(); err != nil {
		return err
	}
	var errs []error
	for _, d := range h.dirs() {
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("cgroups: removing %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// New makes the group name (one task attempt) with limits. A process joins
// it by writing its pid to each of its ProcsFiles; Close ends it.
func (h *Hierarchy) New(name string, l Limits) (*Group, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return nil, fmt.Errorf("cgroups: invalid group name %q", name)
	}
	g := &Group{version: h.version, limits: l}
	for _, c := range controllers {
		dir := filepath.Join(h.parents[c], name)
		if slices.Contains(g.dirs, dir) {
			continue
		}
		if err := os.Mkdir(dir, 0o755); err != nil {
			g.Close()
			return nil, fmt.Errorf("cgroups: making %s: %w", dir, err)
		}
		g.dirs = append(g.dirs, dir)
	}
	g.memory, g.pids, g.cpu = filepath.Join(h.parents["memory"], name), filepath.Join(h.parents["pids"], name), filepath.Join(h.parents["cpu"], name)
	if err := g.apply(); err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

// Group is one task attempt's control group.
type Group struct {
	version           Version
	limits            Limits
	dirs              []string
	memory, pids, cpu string
}

// apply writes the limits. Swap is bounded with memory (v1: memsw equal to
// the limit; v2: none at all), so swapping is no way past it; in v2 an OOM
// kill takes the whole group, as v1's does by the runner's hand.
func (g *Group) apply() error {
	l := g.limits
	type setting struct {
		dir, file, value string
		optional         bool
	}
	var s []setting
	switch g.version {
	case V2:
		if l.MemoryBytes > 0 {
			v := strconv.FormatInt(l.MemoryBytes, 10)
			s = append(s, setting{g.memory, "memory.max", v, false}, setting{g.memory, "memory.swap.max", "0", true},
				setting{g.memory, "memory.oom.group", "1", true})
		}
		if l.Pids > 0 {
			s = append(s, setting{g.pids, "pids.max", strconv.FormatInt(l.Pids, 10), false})
		}
		if l.CPU > 0 {
			s = append(s, setting{g.cpu, "cpu.max", fmt.Sprintf("%d %d", cpuQuota(l.CPU), cpuPeriodMicros), false})
		}
	case V1:
		if l.MemoryBytes > 0 {
			v := strconv.FormatInt(l.MemoryBytes, 10)
			// memsw must stay at or above the memory limit: memory first.
			s = append(s, setting{g.memory, "memory.limit_in_bytes", v, false}, setting{g.memory, "memory.memsw.limit_in_bytes", v, true})
		}
		if l.Pids > 0 {
			s = append(s, setting{g.pids, "pids.max", strconv.FormatInt(l.Pids, 10), false})
		}
		if l.CPU > 0 {
			s = append(s, setting{g.cpu, "cpu.cfs_period_us", strconv.Itoa(cpuPeriodMicros), false},
				setting{g.cpu, "cpu.cfs_quota_us", strconv.FormatInt(cpuQuota(l.CPU), 10), false})
		}
	}
	for _, x := range s {
		path := filepath.Join(x.dir, x.file)
		if err := os.WriteFile(path, []byte(x.value), 0); err != nil {
			if x.optional && errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return fmt.Errorf("cgroups: setting %s: %w", path, err)
		}
	}
	return nil
}

// cpuQuota is cores' worth of microseconds per period, at least the
// kernel's minimum of 1ms.
func cpuQuota(cores float64) int64 {
	return max(int64(cores*cpuPeriodMicros+0.5), 1000)
}

// ProcsFiles are the files a process writes "0" (itself) or its pid to, to
// join the group: one per hierarchy.
func (g *Group) ProcsFiles() []string {
	out := make([]string, len(g.dirs))
	for i, d := range g.dirs {
		out[i] = filepath.Join(d, "cgroup.procs")
	}
	return out
}

// Join moves process pid (with all its threads) into the group.
func (g *Group) Join(pid int) error {
	for _, f := range g.ProcsFiles() {
		if err := os.WriteFile(f, []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("cgroups: joining %s: %w", f, err)
		}
	}
	return nil
}

// Events are what the kernel did to a group because of its limits, counted
// since it was made.
type Events struct {
	// OOMKills are processes the OOM killer ended for the memory limit.
	OOMKills int64
	// ForksRefused are forks and clones refused for the pids limit.
	ForksRefused int64
}

// Events reads the group's counters.
func (g *Group) Events() (Events, error) {
	var ev Events
	var err error
	memFile := "memory.events"
	if g.version == V1 {
		memFile = "memory.oom_control"
	}
	if ev.OOMKills, err = readKey(filepath.Join(g.memory, memFile), "oom_kill"); err != nil {
		return ev, err
	}
	if ev.ForksRefused, err = readKey(filepath.Join(g.pids, "pids.events"), "max"); err != nil {
		return ev, err
	}
	return ev, nil
}

// Close ends every process in the group with SIGKILL and removes it. It
// may be called more than once; the group cannot be used after.
func (g *Group) Close() error {
	var errs []error
	for _, d := range g.dirs {
		if err := end(d, g.version); err != nil {
			errs = append(errs, err)
		}
	}
	g.dirs = nil
	return errors.Join(errs...)
}

// endAttempts bounds how often end kills and retries before it gives up:
// each round kills every process listed, so only processes forked in
// between survive one, and the pids limit bounds those.
const endAttempts = 1000

// end kills every process in dir (and any group under it) and removes it.
// A process killed is gone from its group once it has exited, which is
// soon after the signal: until then rmdir answers EBUSY, and end tries
// again.
func end(dir string, v Version) error {
	// cgroup v2 (Linux 5.14 on) kills the whole group at once, with no pid
	// read first that could be reused by the time it is signalled; the loop
	// below then only waits for the group to empty.
	if v == V2 {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("cgroups: killing %s: %w", dir, err)
		}
	}
	var last error
	for range endAttempts {
		sub, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		for _, e := range sub {
			if e.IsDir() {
				if err := end(filepath.Join(dir, e.Name()), v); err != nil {
					return err
				}
			}
		}
		pids, err := readPids(filepath.Join(dir, "cgroup.procs"))
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		last = os.Remove(dir)
		if last == nil || errors.Is(last, fs.ErrNotExist) {
			return nil
		}
		if !errors.Is(last, syscall.EBUSY) {
			break
		}
		// Let the killed processes exit before the next try.
		time.Sleep(time.Millisecond)
	}
	return fmt.Errorf("cgroups: removing %s: %w", dir, last)
}

func readPids(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("cgroups: %s: %q is not a pid", path, f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// readKey reads the value of key in a flat keyed file ("key value" lines);
// 0 when the file lacks it (an older kernel).
func readKey(path, key string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("cgroups: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cgroups: %s: %s is %q, not a count", path, key, v)
			}
			return n, nil
		}
	}
	return 0, nil
}
