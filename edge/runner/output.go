package runner

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// An attempt's output in the run log: its terminal's output as output
// events, up to runner.maxOutputBytes and while the data dir keeps room for
// runs' ends. Past either the attempt is killed (output_limit,
// storage_full), and what was not recorded is counted and said in an event.

// pump turns the terminal's output into events until it ends, up to
// runner.maxOutputBytes; past it the task is killed (output_limit). Output
// that cannot be recorded is counted, and said so in an event at its end.
func (r *Runner) pump(t *task, ptmx *os.File) {
	buf := make([]byte, hostproto.MaxEventData)
	chunks := runlog.NewChunker(hostproto.MaxEventData)
	var total int64
	limited := false
	var out outputRecord
	for {
		n, err := ptmx.Read(buf)
		if n > 0 && !limited {
			data := buf[:n]
			if room := r.cfg.MaxOutputBytes - total; int64(n) > room {
				data, limited = data[:room], true
			}
			total += int64(len(data))
			r.appendOutput(t, &out, chunks.Write(data))
			if limited {
				r.terminate(t, hostproto.ReasonOutputLimit, fmt.Sprintf("the attempt wrote more than runner.maxOutputBytes (%d bytes)", r.cfg.MaxOutputBytes), true)
			}
		}
		if err != nil {
			break
		}
	}
	r.appendOutput(t, &out, chunks.Flush())
	r.recordUnrecorded(t, &out)
}

// outputRecord is how an attempt's output fared in the run log; it belongs
// to the attempt's pump.
type outputRecord struct {
	// stopped: the data dir has no room for more output (it would fall
	// under the space kept for ends, or a write was refused for want of
	// space), and no more of this attempt's output is recorded.
	stopped bool
	// unrecorded bytes of output, and why the first of them were not.
	unrecorded int64
	cause      string
}

// appendOutput records texts as output events. Output that would take the
// data dir under the part of the reserve kept for ends is not recorded:
// its attempt stops recording and is killed (storage_full), so that its
// end, and what others' ends need, can still be written.
func (r *Runner) appendOutput(t *task, out *outputRecord, texts []string) {
	if len(texts) == 0 {
		return
	}
	var size int64
	for _, s := range texts {
		size += int64(len(s))
	}
	if out.stopped {
		out.unrecorded += size
		return
	}
	// Twice the text: its JSON escaping and the run log's pages (bbolt
	// copies what it changes) take about as much again.
	if free, err := r.logDisk.FreeBytes(); err == nil && free-2*size < endReserveBytes(r.cfg.MinFreeBytes) {
		r.stopRecording(t, out, size, fmt.Sprintf("recording more output would take the host's data dir (%s free) under the %s its reserve (runner.minFreeBytes, %s) keeps for recording runs' ends",
			humanBytes(free), humanBytes(endReserveBytes(r.cfg.MinFreeBytes)), humanBytes(r.cfg.MinFreeBytes)))
		return
	}
	now := r.clock.Now()
	entries := make([]runlog.Entry, len(texts))
	for i, s := range texts {
		data, _ := json.Marshal(s)
		entries[i] = runlog.Entry{Type: hostproto.EventOutput, Data: data, TS: now}
	}
	_, err := r.log.Append(t.runID, entries...)
	if err == nil {
		return
	}
	if noSpace(err) {
		r.stopRecording(t, out, size, "the host's data dir is full")
		return
	}
	// Another failure may pass: the output goes on being tried, and what
	// is lost is counted.
	r.logs.Error(condRecordOutput, "recording output", fieldRun, t.runID, fieldError, err.Error())
	out.unrecorded += size
	if out.cause == "" {
		out.cause = "the host could not write its run log"
	}
}

// stopRecording ends the recording of the attempt's output, and the
// attempt with it: storage_full, its process group killed at once.
func (r *Runner) stopRecording(t *task, out *outputRecord, size int64, cause string) {
	out.stopped, out.cause = true, cause
	out.unrecorded += size
	r.logs.Warn(condOutputStopped, "a run's output can no longer be recorded: ending it storage_full", fieldRun, t.runID, fieldReason, cause)
	r.terminate(t, hostproto.ReasonStorageFull, cause+": the run's output could no longer be recorded", true)
}

// recordUnrecorded writes, once the attempt's output has ended, one event
// saying how much of it was not recorded and why, and puts the count in
// the end's detail of a run ended storage_full.
func (r *Runner) recordUnrecorded(t *task, out *outputRecord) {
	if out.unrecorded == 0 {
		return
	}
	t.mu.Lock()
	if t.endReason == hostproto.ReasonStorageFull {
		t.endDetail += fmt.Sprintf(" (%d bytes not recorded)", out.unrecorded)
	}
	t.mu.Unlock()
	entry := r.limitEntry(hostproto.LimitReached{Limit: hostproto.LimitStorage, UnrecordedBytes: out.unrecorded,
		Detail: fmt.Sprintf("%d bytes of output were not recorded: %s", out.unrecorded, out.cause)})
	if err := r.record(t.runID, func() error { _, err := r.log.Append(t.runID, entry); return err }); err != nil {
		r.logs.Error(condRecordOutput, "recording that output was not recorded", fieldRun, t.runID, fieldError, err.Error())
	}
}
