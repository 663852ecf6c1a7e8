// Package throttle rate-limits log lines about one condition (a run log
// that cannot be written, a disk under its reserve): the first line of a
// condition is logged in full, further ones within the interval are only
// counted, and at the end of each interval in which some were held back one
// summary line says how many. A condition that repeats dozens of times a
// second thus costs about one line per interval, and none is lost without
// a count. Intervals run on an injected clock.
package throttle

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
)

// FieldSuppressed names the count of held-back lines in a summary line.
const FieldSuppressed = "suppressed"

// Log is a rate-limited logger. It is safe for concurrent use.
type Log struct {
	logger *slog.Logger
	clock  clock.Clock
	every  time.Duration

	mu      sync.Mutex
	windows map[string]*window
}

// window is one condition's current interval: the line it was opened
// with (repeated by the summary) and how many lines it held back.
type window struct {
	level      slog.Level
	msg        string
	args       []any
	suppressed int
}

// New returns a Log writing to logger, at most one line per condition and
// interval every (plus one summary), timed by clk.
func New(logger *slog.Logger, clk clock.Clock, every time.Duration) *Log {
	return &Log{logger: logger, clock: clk, every: every, windows: map[string]*window{}}
}

// Error logs msg at error level, unless a line about the condition key was
// logged less than an interval ago: then it is counted for the summary.
func (l *Log) Error(key, msg string, args ...any) { l.Log(slog.LevelError, key, msg, args...) }

// Warn is Error at warning level.
func (l *Log) Warn(key, msg string, args ...any) { l.Log(slog.LevelWarn, key, msg, args...) }

// Log logs msg at level under the condition key (see Error).
func (l *Log) Log(level slog.Level, key, msg string, args ...any) {
	l.mu.Lock()
	if w := l.windows[key]; w != nil {
		w.suppressed++
		// The summary repeats the newest line's fields, which say how
		// the condition stands now.
		w.level, w.msg, w.args = level, msg, args
		l.mu.Unlock()
		return
	}
	l.windows[key] = &window{level: level, msg: msg, args: args}
	l.mu.Unlock()
	l.logger.Log(context.Background(), level, msg, args...)
	l.clock.AfterFunc(l.every, func() { l.close(key) })
}

// close ends key's interval: with lines held back, it logs the summary and
// opens the next interval (the condition is still going on); without, the
// condition's next line is logged in full.
func (l *Log) close(key string) {
	l.mu.Lock()
	w := l.windows[key]
	if w == nil || w.suppressed == 0 {
		delete(l.windows, key)
		l.mu.Unlock()
		return
	}
	level, msg, n := w.level, w.msg, w.suppressed
	args := append(append([]any(nil), w.args...), FieldSuppressed, n, "interval", l.every.String())
	w.suppressed = 0
	l.mu.Unlock()
	l.logger.Log(context.Background(), level, msg+" (repeated; the count says how often since the last line)", args...)
	l.clock.AfterFunc(l.every, func() { l.close(key) })
}
