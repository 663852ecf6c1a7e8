// Package audit owns the secrets proxy's decision record: one JSON line per
// decision under <dataDir>/logs/, rotated by size, and the Prometheus
// counters and latency histograms of the same decisions. An Entry names keys
// by "project/KEY" and never holds a value or a placeholder: the proxy
// redacts paths before they get here. Each flushed batch is also handed to
// runs' egress ledgers (Config.Ledger), off the requests' goroutines.
package audit

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/runfleet/runfleet/shared/clock"
)

// Action is what the proxy did.
type Action string

// Actions. Forwarded is a request on an intercepted connection that carried
// no placeholder: not in the list, but every decision gets a line.
const (
	Substituted Action = "substituted"
	Forwarded   Action = "forwarded"
	Blocked     Action = "blocked"
	Withheld    Action = "withheld"
	Tunnelled   Action = "tunnelled"
	Denied      Action = "denied"
	// Warned: a request a rule in warn mode would have refused, let
	// through (Rule names the rule).
	Warned Action = "warned"
)

// Entry is one audit line.
type Entry struct {
	TS     time.Time `json:"ts"`
	Task   string    `json:"task,omitempty"`
	Action Action    `json:"action"`
	// Reason says why a request was blocked, withheld or denied.
	Reason string   `json:"reason,omitempty"`
	Keys   []string `json:"keys,omitempty"`
	// Host is the CONNECT authority (host:port), placeholders redacted;
	// "unparseable (N bytes)" for a target that did not parse.
	Host string `json:"host"`
	// Method is the request's (or CONNECT's) method, placeholders redacted;
	// empty for a transparent connection's own line (there was no CONNECT).
	Method string `json:"method,omitempty"`
	// Path is the request path without its query, placeholders redacted.
	Path   string `json:"path,omitempty"`
	Status int    `json:"status,omitempty"`
	// BytesIn counts bytes from the task (request body, or tunnel upload);
	// BytesOut bytes to the task.
	BytesIn  int64 `json:"bytesIn"`
	BytesOut int64 `json:"bytesOut"`
	// Scrubbed counts the real values taken out of the answer (each
	// replaced by its placeholder before the task got it).
	Scrubbed int `json:"scrubbed,omitempty"`
	// Via is ViaTransparent for what reached the proxy without the task
	// asking (a connection redirected from the task's network), empty for
	// the explicit proxy.
	Via string `json:"via,omitempty"`
	// Rule names the request rule that decided (policy's
	// "projects.<p>.keys.<KEY>.rules[i]", or ".default" when none
	// matched): the one that allowed or refused the request, or, for
	// Warned, the one that would have refused it. Empty when no key of
	// the request has rules.
	Rule string `json:"rule,omitempty"`
	// Alert is an egress.Alert* kind when the decision shows a key
	// escaping its bounds: another run's placeholder, a placeholder toward
	// a domain its key does not reach, a real value sent by the task.
	Alert string `json:"alert,omitempty"`
	// Query is the request's query with every value masked
	// (egress.MaskedValue) and placeholders redacted: the run's ledger
	// keeps it with Path; the host-wide audit line does not.
	Query string `json:"-"`
	// AWS is the SigV4 signing of a request re-signed with an AWS key
	// (the key is Keys' one), or refused before it was.
	AWS *AWSSigning `json:"aws,omitempty"`
	// SSH is what a task asked of edge's SSH front: a command it ran or
	// was refused, or another request refused.
	SSH *SSHCommand `json:"ssh,omitempty"`
	// Duration is the whole decision; Upstream the part spent waiting for
	// the upstream's response head.
	Duration time.Duration `json:"-"`
	Upstream time.Duration `json:"-"`

	// ledgerOnly marks an entry RecordLedgerOnly queued: handed to
	// Config.Ledger, neither written nor counted.
	ledgerOnly bool
}

// AWSSigning is a SigV4 request's credential scope and payload mode, as
// the task signed it.
type AWSSigning struct {
	Region  string `json:"region"`
	Service string `json:"service"`
	// Payload is how the signature covers the body: "literal" (a hash),
	// "UNSIGNED-PAYLOAD", or one of the STREAMING-* modes; "presigned" is
	// not a mode, so a presigned URL says so apart.
	Payload   string `json:"payload"`
	Presigned bool   `json:"presigned,omitempty"`
}

// SSHCommand is one request on a task's SSH connection.
type SSHCommand struct {
	// Request is the SSH request: "exec", "shell", "subsystem sftp",
	// "pty-req", "channel direct-tcpip"...
	Request string `json:"request"`
	// Command and Repository are an exec's git command and its
	// repository, normalised, when it parsed as one (a refused line's first
	// word otherwise, quoted).
	Command    string `json:"command,omitempty"`
	Repository string `json:"repository,omitempty"`
	// ExitStatus is the command's, nil when it sent none (a signal ended
	// it).
	ExitStatus *int `json:"exitStatus,omitempty"`
}

// ViaTransparent is Entry.Via for a redirected connection.
const ViaTransparent = "transparent"

// ViaDNS is Entry.Via for a name the task's DNS refused
// (RecordLedgerOnly: never an audit line).
const ViaDNS = "dns"

// FileName is the live audit file under Dir; rotated files add ".1", ".2"...
const FileName = "proxy-audit.jsonl"

// Rotation defaults (Config.MaxBytes and Keep; edge.json's proxy.audit):
// the live file and the rotated ones hold about
// DefaultMaxBytes*(DefaultKeep+1) of audit lines.
const (
	DefaultMaxBytes = 64 << 20
	DefaultKeep     = 5
)

// Config configures a Log.
type Config struct {
	// Dir is <dataDir>/logs, created 0700. Required.
	Dir string
	// MaxBytes rotates the file before it passes this size; zero means
	// DefaultMaxBytes.
	MaxBytes int64
	// Keep is how many rotated files stay; zero means DefaultKeep.
	Keep int
	// Registerer receives the metrics; nil means none are registered.
	Registerer prometheus.Registerer
	// Clock stamps entries that have no TS; nil means the real clock.
	Clock clock.Clock
	// Logger reports write failures (an audit line that cannot be written is
	// an operator's problem, not the request's). Required.
	Logger *slog.Logger
	// Redact, when set, gets every encoded line (one whole line, its
	// newline included) before it is written, and returns what is written
	// instead: edge's last line of defence against a real value in the
	// file (redact.Set.Redact). It runs on the flushing goroutine, never a
	// request's; nil writes lines as they are.
	Redact func(line []byte) []byte
	// Ledger, when set, is handed each flushed batch once its lines are
	// written: every entry in the order it was recorded, batches one after
	// another, never two at once, on the flushing goroutine (the flush
	// timer's, Flush's caller's, or, past maxPending, the recording
	// goroutine's). It must not block (hand the entries on: runs' egress
	// ledgers, edge/ledger), must not change batch, and must not keep it
	// past its return (the slice is reused): it copies the entries it
	// keeps. Nil: no ledger, and RecordLedgerOnly does nothing.
	Ledger func(batch []Entry)
}

// Log writes audit lines and keeps the metrics. Safe for concurrent use.
//
// Record queues an entry; the batch is encoded, written and counted by the
// flush FlushEvery later (or by Flush, a scrape of the metrics, rotation and
// Close), so a request pays neither the encoding nor a write (issue 4's
// profile put both on the proxy's critical path) nor the metrics' atomics,
// which every request's goroutine contended for (issue 27's). Nothing is dropped: past maxPending queued
// entries, the recording goroutine writes the batch itself.
//
// What a crash can lose: a clean shutdown (Close) writes every recorded line
// and syncs the file. A process that dies without Close loses the lines
// still queued: at most those recorded in the last FlushEvery, and never
// more than maxPending. A machine that stops (power, kernel) may also lose
// lines written but not yet on disk: the file is not synced per batch.
type Log struct {
	cfg     Config
	metrics *metrics

	// mu guards the queue and its timer.
	mu      sync.Mutex
	pending []Entry
	flusher clock.Timer // the pending flush, nil when nothing is queued

	// fileMu guards the file; a batch is taken and written under it, so
	// batches reach the file in the order they were recorded.
	fileMu sync.Mutex
	file   *os.File
	buf    *bufio.Writer
	size   int64
	line   []byte  // encoding scratch
	spare  []Entry // the other queue, swapped in by a flush
}

// FlushEvery bounds how long an audit line may sit in memory before it is
// written: lines are batched so the proxy does not pay a write per request.
const FlushEvery = 100 * time.Millisecond

// maxPending bounds the queue (a few hundred KiB); reached, the recording
// goroutine writes the batch instead of waiting for the flush.
const maxPending = 4096

// Open creates Dir and opens the live file for appending.
func Open(cfg Config) (*Log, error) {
	if cfg.Dir == "" {
		return nil, errors.New("audit: Dir is required")
	}
	if cfg.Logger == nil {
		return nil, errors.New("audit: Logger is required")
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.Keep == 0 {
		cfg.Keep = DefaultKeep
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	l := &Log{cfg: cfg, metrics: newMetrics()}
	if err := l.openLocked(); err != nil {
		return nil, err
	}
	if err := l.metrics.register(cfg.Registerer, l); err != nil {
		l.file.Close()
		return nil, err
	}
	return l, nil
}

func (l *Log) path() string { return filepath.Join(l.cfg.Dir, FileName) }

func (l *Log) openLocked() error {
	f, err := os.OpenFile(l.path(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit: %w", err)
	}
	l.file, l.size = f, fi.Size()
	l.buf = bufio.NewWriterSize(f, 64<<10)
	return nil
}

// Field caps: the text fields a task can choose (method, path and query,
// host, an SSH request's name, command and repository) and the reason
// quoting them are cut to these many bytes, so a line and a ledger record
// stay small whatever a task sends. The caller redacts first: a cut never
// leaves part of a placeholder that redaction would have found.
const (
	MaxMethodBytes = 64
	MaxHostBytes   = 300 // a DNS name (253) and a port, with room
	MaxPathBytes   = 2048
	MaxReasonBytes = 1024
)

// clip cuts s to at most n bytes, at a UTF-8 character boundary, marking
// the cut with "…".
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	n -= len("…")
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// Record queues e to be written and counted. The proxy calls it once per
// request, so its common path is an append under a lock: the flush writes
// the line and counts it in the metrics (a scrape flushes first, so it
// counts every decision recorded before it).
func (l *Log) Record(e Entry) { l.queue(e) }

// RecordLedgerOnly queues e for Config.Ledger alone: no line is written
// and no metric counts it. It is for a decision that is a run's but not
// the proxy's (a name the task's DNS refused), which the run's ledger
// keeps in order with the proxy's. Without a Ledger it does nothing.
func (l *Log) RecordLedgerOnly(e Entry) {
	if l.cfg.Ledger == nil {
		return
	}
	e.ledgerOnly = true
	l.queue(e)
}

func (l *Log) queue(e Entry) {
	if e.TS.IsZero() {
		e.TS = l.cfg.Clock.Now()
	}
	e.TS = e.TS.UTC()
	e.Method, e.Host = clip(e.Method, MaxMethodBytes), clip(e.Host, MaxHostBytes)
	e.Path, e.Query, e.Reason = clip(e.Path, MaxPathBytes), clip(e.Query, MaxPathBytes), clip(e.Reason, MaxReasonBytes)
	if c := e.SSH; c != nil && (len(c.Request) > MaxMethodBytes || len(c.Command) > MaxPathBytes || len(c.Repository) > MaxPathBytes) {
		// A copy: the caller's is not ours to change. The request is the
		// ledger record's method, its repository the record's path.
		cut := *c
		cut.Request, cut.Command, cut.Repository = clip(c.Request, MaxMethodBytes), clip(c.Command, MaxPathBytes), clip(c.Repository, MaxPathBytes)
		e.SSH = &cut
	}
	l.mu.Lock()
	l.pending = append(l.pending, e)
	full := len(l.pending) >= maxPending
	if l.flusher == nil && !full {
		l.flusher = l.cfg.Clock.AfterFunc(FlushEvery, l.flush)
	}
	l.mu.Unlock()
	if full {
		l.flush()
	}
}

// Flush writes every recorded line now, and hands every recorded entry
// to Config.Ledger before it returns.
func (l *Log) Flush() { l.flush() }

func (l *Log) flush() {
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	l.mu.Lock()
	batch := l.pending
	l.pending, l.spare = l.spare[:0], nil
	if l.flusher != nil {
		l.flusher.Stop()
		l.flusher = nil
	}
	l.mu.Unlock()
	for i := range batch {
		if !batch[i].ledgerOnly {
			l.writeLocked(&batch[i])
		}
	}
	l.flushFileLocked()
	l.metrics.observeBatch(batch)
	if l.cfg.Ledger != nil && len(batch) > 0 {
		l.cfg.Ledger(batch)
	}
	clear(batch) // no strings held until the next batch
	l.spare = batch[:0]
}

// writeLocked encodes e and writes it to the file's buffer, rotating the
// file first when the line would pass MaxBytes. After Close, lines only go.
func (l *Log) writeLocked(e *Entry) {
	if l.file == nil {
		return
	}
	l.line = append(appendLine(l.line[:0], e), '\n')
	line := l.line
	if l.cfg.Redact != nil {
		line = l.cfg.Redact(line)
	}
	if l.size > 0 && l.size+int64(len(line)) > l.cfg.MaxBytes {
		if err := l.rotateLocked(); err != nil {
			l.cfg.Logger.Error("audit: rotating", slog.String("error", err.Error()))
			if l.file == nil {
				return
			}
		}
	}
	n, err := l.buf.Write(line)
	l.size += int64(n)
	if err != nil {
		l.cfg.Logger.Error("audit: writing", slog.String("error", err.Error()))
	}
}

func (l *Log) flushFileLocked() {
	if l.buf == nil {
		return
	}
	if err := l.buf.Flush(); err != nil {
		l.cfg.Logger.Error("audit: writing", slog.String("error", err.Error()))
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// rotateLocked shifts name.N-1 to name.N down to the live file, dropping
// what passes Keep, and opens a fresh live file.
func (l *Log) rotateLocked() error {
	l.flushFileLocked()
	l.file.Close()
	l.file, l.buf = nil, nil
	base := l.path()
	os.Remove(base + "." + strconv.Itoa(l.cfg.Keep))
	for i := l.cfg.Keep - 1; i >= 1; i-- {
		os.Rename(base+"."+strconv.Itoa(i), base+"."+strconv.Itoa(i+1))
	}
	if l.cfg.Keep > 0 {
		if err := os.Rename(base, base+".1"); err != nil {
			return err
		}
	} else {
		os.Remove(base)
	}
	return l.openLocked()
}

// Close writes what is recorded, syncs and closes the file; later Records
// only count.
func (l *Log) Close() error {
	l.flush()
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	if l.file == nil {
		return nil
	}
	err := errors.Join(l.file.Sync(), l.file.Close())
	l.file, l.buf = nil, nil
	if err != nil {
		return fmt.Errorf("audit: closing: %w", err)
	}
	return nil
}
