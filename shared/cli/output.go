package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/runfleet/runfleet/shared/fleetapi"
)

// ui is where a command writes: stdout for its result (a table, a JSON
// document, a run's output), stderr for errors and, only on a terminal,
// progress. Colour goes only to a terminal, never with NO_COLOR set.
type ui struct {
	out, err           io.Writer
	outColor, errColor bool
	// progress: stderr is a terminal, so progress lines go there.
	progress bool
	// bothTTY: stdout and stderr are one terminal, where a progress line
	// must start on a fresh line after output that did not end one.
	bothTTY bool
	midLine bool
	now     func() time.Time
	// term defuses a run's output on its way to a terminal (terminal.go);
	// nil when stdout is not one: the output is then the task's exactly.
	term *termFilter
}

func newUI(env Env) *ui {
	color := env.Getenv(EnvNoColor) == "" && env.Getenv("TERM") != "dumb"
	var term *termFilter
	if env.StdoutTTY {
		term = &termFilter{}
	}
	return &ui{
		term: term,
		out:  env.Stdout, err: env.Stderr,
		outColor: color && env.StdoutTTY, errColor: color && env.StderrTTY,
		progress: env.StderrTTY, bothTTY: env.StdoutTTY && env.StderrTTY,
		now: env.Now,
	}
}

// ANSI colours.
const (
	red    = "31"
	green  = "32"
	yellow = "33"
	grey   = "90"
	bold   = "1"
)

func paint(on bool, color, s string) string {
	if !on || color == "" || s == "" {
		return s
	}
	return "\x1b[" + color + "m" + s + "\x1b[0m"
}

// errorf writes an error line to stderr, always. Like notef and
// progressf, it sanitizes its arguments: a reason, a detail, a host's id
// or an API's message may come from a host or a task.
func (u *ui) errorf(format string, args ...any) {
	u.freshLine()
	fmt.Fprintf(u.err, "%s %s\n", paint(u.errColor, red, "runfleet:"), fmt.Sprintf(format, sanitized(args)...))
}

// notef writes a line to stderr, always: a result that is not data (a
// confirmation, a hint how to go on).
func (u *ui) notef(format string, args ...any) {
	u.freshLine()
	fmt.Fprintf(u.err, format+"\n", sanitized(args)...)
}

// progressf writes a progress line to stderr when it is a terminal.
func (u *ui) progressf(format string, args ...any) {
	if !u.progress {
		return
	}
	u.freshLine()
	fmt.Fprintf(u.err, "%s\n", paint(u.errColor, grey, fmt.Sprintf(format, sanitized(args)...)))
}

// sanitized is args with each string, error and Stringer sanitized.
func sanitized(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			a = sanitize(v)
		case error:
			a = sanitize(v.Error())
		case fmt.Stringer:
			a = sanitize(v.String())
		}
		out[i] = a
	}
	return out
}

func (u *ui) freshLine() {
	if u.bothTTY && u.midLine {
		fmt.Fprintln(u.err)
		u.midLine = false
	}
}

// output writes a run's output text to stdout: as it is, or defused when
// stdout is a terminal.
func (u *ui) output(text string) error {
	if u.term != nil {
		text = u.term.write(text)
	}
	if text == "" {
		return nil
	}
	_, err := io.WriteString(u.out, text)
	u.midLine = !strings.HasSuffix(text, "\n")
	return err
}

// document writes v as one JSON document (--json of a list, get, ...).
func (u *ui) document(v any) error {
	enc := json.NewEncoder(u.out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// jsonLine is one line of --json on a followed run.
type jsonLine struct {
	Type string `json:"type"`
	ID   string `json:"id,omitempty"`
	Data any    `json:"data"`
}

func (u *ui) line(l jsonLine) error {
	enc := json.NewEncoder(u.out)
	enc.SetEscapeHTML(false)
	return enc.Encode(l)
}

// cell is a table cell: its text and its colour on a terminal.
type cell struct {
	text, color string
}

func plain(s string) cell { return cell{text: s} }

// table writes aligned columns under a header, to stdout. Widths count
// characters, not bytes nor colour codes.
func (u *ui) table(header []string, rows [][]cell) {
	widths := make([]int, len(header))
	for i, h := range header {
		widths[i] = utf8.RuneCountInString(h)
	}
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(c.text))
		}
	}
	var b strings.Builder
	write := func(cells []cell) {
		var line strings.Builder
		for i, c := range cells {
			text := sanitize(c.text)
			line.WriteString(paint(u.outColor, c.color, text))
			if i < len(cells)-1 {
				line.WriteString(strings.Repeat(" ", widths[i]-utf8.RuneCountInString(text)+2))
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " "))
		b.WriteString("\n")
	}
	head := make([]cell, len(header))
	for i, h := range header {
		head[i] = cell{text: h, color: bold}
	}
	write(head)
	for _, r := range rows {
		write(r)
	}
	io.WriteString(u.out, b.String())
}

// fields writes "name  value" lines, aligned (a get's view of one thing).
func (u *ui) fields(rows [][2]cell) {
	width := 0
	for _, r := range rows {
		width = max(width, len(r[0].text))
	}
	var b strings.Builder
	for _, r := range rows {
		if r[1].text == "" {
			continue
		}
		fmt.Fprintf(&b, "%s%s  %s\n", paint(u.outColor, bold, r[0].text), strings.Repeat(" ", width-len(r[0].text)),
			paint(u.outColor, r[1].color, sanitize(r[1].text)))
	}
	io.WriteString(u.out, b.String())
}

// sanitize keeps a value a host or a task chose from moving the cursor
// or colouring a table: control characters, C1 included (a terminal obeys
// U+009B as CSI), become spaces.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return ' '
		}
		return r
	}, s)
}

// statusColor is a run's (or a probe's) status colour.
func statusColor(status string) string {
	switch status {
	case fleetapi.StatusSucceeded, fleetapi.ProbeOK:
		return green
	case fleetapi.StatusFailed, fleetapi.StatusLost, fleetapi.ProbeAuthFail, fleetapi.ProbeUnreachable, fleetapi.ProbeBadResponse:
		return red
	case fleetapi.StatusCanceled:
		return grey
	}
	return yellow
}

// ago is how long before now t was, as a person reads it.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	case d < 30*24*time.Hour:
		return fmt.Sprintf("%dd ago", int(d.Hours()/24))
	}
	return t.Local().Format("2006-01-02")
}

// stamp is a time and how long ago it was.
func stamp(now, t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return fmt.Sprintf("%s (%s)", t.Local().Format(time.RFC3339), ago(now, t))
}

// bytesOf is a byte count as a person reads it.
func bytesOf(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
