package runner

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// killGroupID sends SIGKILL to every process whose real, effective, saved or
// filesystem group id is gid: the run's own group, which only its processes
// have (an unprivileged task cannot change its group ids), so this ends
// what a task started outside its process group or session.
func killGroupID(gid uint32) error {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return fmt.Errorf("listing processes: %w", err)
	}
	var errs []error
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 1 {
			continue
		}
		status, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue // gone meanwhile
		}
		if hasGroupID(status, gid) {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("killing pid %d: %w", pid, err))
			}
		}
	}
	return errors.Join(errs...)
}

// hasGroupID reads the "Gid:" line of /proc/<pid>/status (real, effective,
// saved, filesystem).
func hasGroupID(status []byte, gid uint32) bool {
	for _, line := range bytes.Split(status, []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, []byte("Gid:"))
		if !ok {
			continue
		}
		for _, f := range bytes.Fields(rest) {
			if n, err := strconv.ParseUint(string(f), 10, 32); err == nil && uint32(n) == gid {
				return true
			}
		}
		return false
	}
	return false
}
