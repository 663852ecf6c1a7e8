package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/runfleet/runfleet/edge/internal/atomicfile"
	"github.com/runfleet/runfleet/edge/policy"
)

// runIDPattern bounds a run id: it names a file and is the proxy user name.
var runIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func checkRunID(runID string) error {
	if !runIDPattern.MatchString(runID) {
		return fmt.Errorf("proxy: run id %q: letters, digits, '.', '_' and '-' only, at most 128", runID)
	}
	return nil
}

// placeholderFile is one task's placeholders on disk (0600, under the data
// dir that only edge's user can read). Versioned: it outlives edge restarts.
type placeholderFile struct {
	Version      int               `json:"version"`
	RunID        string            `json:"runId"`
	Placeholders map[string]string `json:"placeholders"` // "project/KEY" -> placeholder
}

// placeholderStore persists placeholders, one file per task, so they are
// stable across restarts for the task's whole life.
type placeholderStore struct {
	dir string
}

func (s placeholderStore) path(runID string) string { return filepath.Join(s.dir, runID+".json") }

// loadAll reads every task's placeholders.
func (s placeholderStore) loadAll() (map[string]map[policy.KeyRef]string, error) {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("proxy: placeholders: %w", err)
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("proxy: placeholders: %w", err)
	}
	out := map[string]map[policy.KeyRef]string{}
	for _, e := range entries {
		name := e.Name()
		if atomicfile.IsTemp(name) {
			os.Remove(filepath.Join(s.dir, name)) // a crash's leftover
			continue
		}
		if !strings.HasSuffix(name, ".json") {
			continue
		}
		runID := strings.TrimSuffix(name, ".json")
		if checkRunID(runID) != nil {
			continue
		}
		m, err := s.load(runID)
		if err != nil {
			return nil, err
		}
		out[runID] = m
	}
	return out, nil
}

func (s placeholderStore) load(runID string) (map[policy.KeyRef]string, error) {
	b, err := os.ReadFile(s.path(runID))
	if err != nil {
		return nil, fmt.Errorf("proxy: placeholders of %s: %w", runID, err)
	}
	var f placeholderFile
	// The decode error is not wrapped: it may quote a placeholder.
	if json.Unmarshal(b, &f) != nil || f.Version != 1 || f.RunID != runID {
		return nil, fmt.Errorf("proxy: placeholders of %s: %s is not a version 1 placeholder file", runID, s.path(runID))
	}
	m := make(map[policy.KeyRef]string, len(f.Placeholders))
	for id, ph := range f.Placeholders {
		project, key, ok := strings.Cut(id, "/")
		if !ok {
			return nil, fmt.Errorf("proxy: placeholders of %s: bad key id %q", runID, id)
		}
		m[policy.KeyRef{Project: project, Key: key}] = ph
	}
	return m, nil
}

// save writes a task's placeholders atomically (temp file, fsync, rename,
// directory fsync: a placeholder handed to a task survives a crash).
func (s placeholderStore) save(runID string, m map[policy.KeyRef]string) error {
	f := placeholderFile{Version: 1, RunID: runID, Placeholders: map[string]string{}}
	for ref, ph := range m {
		f.Placeholders[ref.String()] = ph
	}
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(s.path(runID), b, 0o600); err != nil {
		return fmt.Errorf("proxy: saving placeholders: %w", err)
	}
	return nil
}

func (s placeholderStore) remove(runID string) error {
	if err := os.Remove(s.path(runID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("proxy: dropping placeholders: %w", err)
	}
	return nil
}
