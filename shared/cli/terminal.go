package cli

import "strings"

// termFilter defuses a task's output on its way to the operator's
// terminal. A task is not trusted with the terminal it is shown on: an OSC
// sets the clipboard (52), a link that reads as another (8) or the title
// (0/2); DCS, APC, PM and SOS strings reach the terminal's own parsers; a
// CSI query (6n, 21t) makes the terminal answer as if the operator typed
// it; ESC c resets it. What is kept is what a log needs and cannot reach
// past its own line: text, \n \r \t \b, SGR (colours, bold: CSI ... m) and
// erase-in-line (CSI ... K), as the dashboard keeps SGR alone. The 8-bit
// C1 forms (U+009B for CSI, U+009D for OSC ...) are treated as their ESC
// forms: xterm and VTE obey them in UTF-8. State is kept between writes,
// since a sequence may be cut between two output events.
type termFilter struct {
	state termState
	csi   strings.Builder // a CSI's parameter and intermediate bytes
}

type termState int

const (
	tsGround     termState = iota
	tsEsc                  // after ESC
	tsEscInter             // ESC then intermediates (ESC ( B): dropped to its final
	tsCSI                  // a CSI's parameters
	tsCSIDropped           // a CSI too long or malformed: dropped to its final
	tsString               // an OSC, DCS, APC, PM or SOS body: dropped to BEL or ST
)

// maxCSI bounds a kept CSI's parameters: an SGR of 24-bit colours is ~40.
const maxCSI = 64

func (f *termFilter) write(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch f.state {
		case tsGround:
			switch {
			case r == 0x1b:
				f.state = tsEsc
			case r == 0x9b:
				f.startCSI()
			case r == 0x90 || r == 0x98 || r == 0x9d || r == 0x9e || r == 0x9f:
				f.state = tsString
			case r == '\n' || r == '\r' || r == '\t' || r == '\b':
				b.WriteRune(r)
			case r < 0x20 || (r >= 0x7f && r <= 0x9f):
				// Other C0 (SO/SI switch character sets, BEL) and C1.
			default:
				b.WriteRune(r)
			}
		case tsEsc:
			switch {
			case r == '[':
				f.startCSI()
			case r == ']' || r == 'P' || r == 'X' || r == '^' || r == '_':
				f.state = tsString
			case r == 0x1b:
			case r >= 0x20 && r <= 0x2f:
				f.state = tsEscInter
			default:
				f.state = tsGround // ESC c, ESC 7, ...: dropped with its final
			}
		case tsEscInter:
			if r < 0x20 || r > 0x2f {
				f.state = tsGround
			}
		case tsCSI, tsCSIDropped:
			switch {
			case r >= 0x40 && r <= 0x7e:
				if f.state == tsCSI && (r == 'm' || r == 'K') && plainParams(f.csi.String()) {
					b.WriteString("\x1b[")
					b.WriteString(f.csi.String())
					b.WriteRune(r)
				}
				f.state = tsGround
			case r >= 0x20 && r <= 0x3f:
				f.csi.WriteRune(r)
				if f.csi.Len() > maxCSI {
					f.state = tsCSIDropped
				}
			default:
				f.state = tsGround // not a CSI's byte: the sequence is dropped
			}
		case tsString:
			switch r {
			case 0x07, 0x9c:
				f.state = tsGround
			case 0x1b:
				f.state = tsEsc // ESC \ ends it; the \ is then dropped as a final
			}
		}
	}
	return b.String()
}

func (f *termFilter) startCSI() {
	f.state = tsCSI
	f.csi.Reset()
}

// plainParams: digits and separators only, no private marker (?, >, <, =)
// nor intermediate byte, which would make it a mode set or a query.
func plainParams(p string) bool {
	for _, r := range p {
		if (r < '0' || r > '9') && r != ';' && r != ':' {
			return false
		}
	}
	return true
}
