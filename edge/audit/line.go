package audit

import (
	"math"
	"strconv"
	"time"
	"unicode/utf8"
)

// appendLine appends e as one JSON object, the line's schema (field names,
// order, omissions) being what encoding/json makes of
//
//	struct {
//		Entry
//		DurationMs float64 `json:"durationMs"`
//		UpstreamMs float64 `json:"upstreamMs,omitempty"`
//	}
//
// with its escaping (HTML-safe, U+2028/U+2029, invalid UTF-8 as U+FFFD).
// Written by hand because the proxy records one line per request and
// reflection was most of Record's cost (issue 4's profile); a test holds it
// to encoding/json's output.
func appendLine(b []byte, e *Entry) []byte {
	b = append(b, `{"ts":"`...)
	b = e.TS.AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	if e.Task != "" {
		b = append(b, `,"task":`...)
		b = appendString(b, e.Task)
	}
	b = append(b, `,"action":`...)
	b = appendString(b, string(e.Action))
	if e.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendString(b, e.Reason)
	}
	if len(e.Keys) > 0 {
		b = append(b, `,"keys":[`...)
		for i, k := range e.Keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
		}
		b = append(b, ']')
	}
	b = append(b, `,"host":`...)
	b = appendString(b, e.Host)
	if e.Method != "" {
		b = append(b, `,"method":`...)
		b = appendString(b, e.Method)
	}
	if e.Path != "" {
		b = append(b, `,"path":`...)
		b = appendString(b, e.Path)
	}
	if e.Status != 0 {
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(e.Status), 10)
	}
	b = append(b, `,"bytesIn":`...)
	b = strconv.AppendInt(b, e.BytesIn, 10)
	b = append(b, `,"bytesOut":`...)
	b = strconv.AppendInt(b, e.BytesOut, 10)
	if e.Scrubbed != 0 {
		b = append(b, `,"scrubbed":`...)
		b = strconv.AppendInt(b, int64(e.Scrubbed), 10)
	}
	if e.Via != "" {
		b = append(b, `,"via":`...)
		b = appendString(b, e.Via)
	}
	if e.Rule != "" {
		b = append(b, `,"rule":`...)
		b = appendString(b, e.Rule)
	}
	if e.Alert != "" {
		b = append(b, `,"alert":`...)
		b = appendString(b, e.Alert)
	}
	if a := e.AWS; a != nil {
		b = append(b, `,"aws":{"region":`...)
		b = appendString(b, a.Region)
		b = append(b, `,"service":`...)
		b = appendString(b, a.Service)
		b = append(b, `,"payload":`...)
		b = appendString(b, a.Payload)
		if a.Presigned {
			b = append(b, `,"presigned":true`...)
		}
		b = append(b, '}')
	}
	if c := e.SSH; c != nil {
		b = append(b, `,"ssh":{"request":`...)
		b = appendString(b, c.Request)
		if c.Command != "" {
			b = append(b, `,"command":`...)
			b = appendString(b, c.Command)
		}
		if c.Repository != "" {
			b = append(b, `,"repository":`...)
			b = appendString(b, c.Repository)
		}
		if c.ExitStatus != nil {
			b = append(b, `,"exitStatus":`...)
			b = strconv.AppendInt(b, int64(*c.ExitStatus), 10)
		}
		b = append(b, '}')
	}
	b = append(b, `,"durationMs":`...)
	b = appendMillis(b, e.Duration.Microseconds())
	if up := e.Upstream.Microseconds(); up != 0 {
		b = append(b, `,"upstreamMs":`...)
		b = appendMillis(b, up)
	}
	return append(b, '}')
}

// appendMillis writes µs/1000 as encoding/json writes the float64 ms()
// gives: the shortest decimal that reads back as it, which for a whole
// number of microseconds is the number itself with at most three decimals
// (trailing zeros dropped). Formatting the float was half of the line's
// cost.
func appendMillis(b []byte, us int64) []byte {
	if us <= -1<<50 || us >= 1<<50 {
		return appendFloat(b, float64(us)/1000) // past exact decimals
	}
	if us < 0 {
		b = append(b, '-')
		us = -us
	}
	b = strconv.AppendInt(b, us/1000, 10)
	if frac := us % 1000; frac != 0 {
		digits := [3]byte{byte('0' + frac/100), byte('0' + frac/10%10), byte('0' + frac%10)}
		n := 3
		for digits[n-1] == '0' {
			n--
		}
		b = append(b, '.')
		b = append(b, digits[:n]...)
	}
	return b
}

// appendFloat is encoding/json's float64: ES6 number formatting.
func appendFloat(b []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

const hexDigits = "0123456789abcdef"

// AppendJSONString appends s as encoding/json encodes a string (HTML-safe,
// U+2028/U+2029 escaped, invalid UTF-8 as U+FFFD), for the other
// hand-written JSON on the proxy's path: runs' ledger records
// (edge/ledger), whose hash covers exactly those bytes.
func AppendJSONString(b []byte, s string) []byte { return appendString(b, s) }

// appendString is encoding/json's string encoding with HTML escaping.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= ' ' && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
