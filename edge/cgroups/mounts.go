package cgroups

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// mount is one cgroup file system mounted on this host, from mountinfo.
type mount struct {
	// root is the cgroup the mount shows at its point; point is where.
	root, point string
	// v2 is a cgroup2 mount; controllers are a v1 mount's.
	v2          bool
	controllers []string
}

type mountTable []mount

// readMounts reads the cgroup mounts of /proc/self/mountinfo (see proc(5)):
// "id parent dev root point options [optional...] - fstype source super".
func readMounts(path string) (mountTable, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	defer f.Close()
	var t mountTable
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 6 || len(fields) < sep+4 {
			continue
		}
		fstype, super := fields[sep+1], fields[sep+3]
		m := mount{root: unescape(fields[3]), point: unescape(fields[4])}
		switch fstype {
		case "cgroup2":
			m.v2 = true
		case "cgroup":
			m.controllers = strings.Split(super, ",")
		default:
			continue
		}
		t = append(t, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cgroups: reading %s: %w", path, err)
	}
	return t, nil
}

// unescape undoes mountinfo's octal escapes of space, tab, newline and
// backslash ("\040").
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// v2Dir is the directory of this process's own v2 cgroup.
func (t mountTable) v2Dir(own ownCgroups) (string, bool) {
	path, ok := own.v2, own.hasV2
	if !ok {
		return "", false
	}
	for _, m := range t {
		if m.v2 {
			if dir, ok := m.dir(path); ok {
				return dir, true
			}
		}
	}
	return "", false
}

// v1Dir is the directory of this process's own cgroup in the v1 hierarchy
// of controller.
func (t mountTable) v1Dir(controller string, own ownCgroups) (string, bool) {
	path, ok := own.v1[controller]
	if !ok {
		return "", false
	}
	for _, m := range t {
		if !m.v2 && slices.Contains(m.controllers, controller) {
			if dir, ok := m.dir(path); ok {
				return dir, true
			}
		}
	}
	return "", false
}

// dir is where cgroup path shows under the mount, if it does.
func (m mount) dir(path string) (string, bool) {
	if m.root == "/" {
		return filepath.Join(m.point, path), true
	}
	if path == m.root {
		return m.point, true
	}
	if rest, ok := strings.CutPrefix(path, m.root+"/"); ok {
		return filepath.Join(m.point, rest), true
	}
	return "", false
}

// ownCgroups are this process's cgroups, from /proc/self/cgroup: the v2
// path ("0::/path") and each v1 controller's ("4:memory:/path").
type ownCgroups struct {
	v2    string
	hasV2 bool
	v1    map[string]string
}

func readOwn(path string) (ownCgroups, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return ownCgroups{}, fmt.Errorf("cgroups: %w", err)
	}
	own := ownCgroups{v1: map[string]string{}}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			own.v2, own.hasV2 = parts[2], true
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			own.v1[c] = parts[2]
		}
	}
	return own, nil
}
