package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/filewatch"
)

// WatcherConfig configures a Watcher.
type WatcherConfig struct {
	// Path is edge.json. Required.
	Path string
	// Clock paces the file polling; zero means the real clock.
	Clock clock.Clock
	// PollInterval between checks of the file's stamp (filewatch); zero
	// means 2s.
	PollInterval time.Duration
	// Logger receives one line per reload or refused reload. Required.
	Logger *slog.Logger
}

// Validate reports a missing field.
func (c *WatcherConfig) Validate() error {
	if c.Path == "" {
		return errors.New("policy watcher: Path is required")
	}
	if c.Logger == nil {
		return errors.New("policy watcher: Logger is required")
	}
	return nil
}

// Watcher holds the policy in force and replaces it when edge.json changes
// (polled) or when asked (SIGHUP). A new policy that does not load keeps the
// old one, and the reason is logged. Safe for concurrent use.
type Watcher struct {
	cfg     WatcherConfig
	current atomic.Pointer[Policy]
	mu      sync.Mutex // serialises reloads; guards file
	file    *filewatch.File[*Policy]
}

// NewWatcher loads the policy at cfg.Path; it fails if that policy does not
// load, since edge must not start without one.
func NewWatcher(cfg WatcherConfig) (*Watcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 2 * time.Second
	}
	w := &Watcher{cfg: cfg, file: filewatch.New(cfg.Path, LoadFile)}
	w.file.Reload()
	p, err := w.file.Reading()
	if err != nil {
		return nil, err
	}
	w.current.Store(p)
	return w, nil
}

// LoadFile loads edge.json and compiles its policy.
func LoadFile(path string) (*Policy, error) {
	c, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	p, err := Compile(c.Policy)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return p, nil
}

// Current is the policy in force; never nil.
func (w *Watcher) Current() *Policy { return w.current.Load() }

// AllowName is the CA's AllowName hook: a leaf only for a name some key of
// the policy in force may reach.
func (w *Watcher) AllowName(name string) bool { return w.Current().AllowsName(name) }

// Reload reads the file now. On error the policy in force stays and the
// error says why.
func (w *Watcher) Reload() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.file.Reload()
	return w.applyLocked()
}

// applyLocked puts the file's last reading in force, or keeps the policy
// in force when that reading did not load.
func (w *Watcher) applyLocked() error {
	p, err := w.file.Reading()
	if err != nil {
		w.cfg.Logger.Error("policy reload refused; keeping the policy in force", slog.String("path", w.cfg.Path), slog.String("error", err.Error()))
		return err
	}
	w.current.Store(p)
	w.cfg.Logger.Info("policy reloaded", slog.String("path", w.cfg.Path), slog.Int("keys", len(p.keys)))
	return nil
}

// pollOnce reloads when the file changed: its identity (a rename over it),
// size or modification time.
func (w *Watcher) pollOnce() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if reread, err := w.file.Check(); err != nil || !reread {
		return
	}
	_ = w.applyLocked()
}

// Run polls the file every PollInterval and reloads on each value received
// from hup (main passes its SIGHUP channel; nil for none) until ctx ends.
func (w *Watcher) Run(ctx context.Context, hup <-chan os.Signal) {
	ticks := make(chan struct{})
	go func() {
		defer close(ticks)
		for clock.Sleep(w.cfg.Clock, w.cfg.PollInterval, ctx.Done()) {
			select {
			case ticks <- struct{}{}:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ticks:
			if !ok {
				return
			}
			w.pollOnce()
		case <-hup:
			_ = w.Reload()
		}
	}
}
