// Package leakcheck reads what a task received as an attacker would: it
// decodes it every way an answer commonly encodes a credential (as it is,
// any case, percent- and JSON-unescaped, hex and base64 runs at every
// offset) and reports whether a real value, or any fragment of one of a
// given length, can be read back out. Tests of the secrets proxy assert
// with it that an answer carries nothing of a value; it shares no code with
// the proxy's scrubber, so a form the scrubber forgets is one it finds.
package leakcheck

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"strings"
	"unicode/utf16"
)

// Find reports the first reading of received (its name, e.g. "base64 std
// at offset 2") that holds the value whole or any run of fragment
// consecutive bytes of its secret part, value[public:]; "" when none does.
// A secret part shorter than fragment is looked for whole.
func Find(received []byte, value string, public, fragment int) string {
	secret := value[public:]
	var windows []string
	if len(secret) <= fragment {
		windows = []string{value}
	} else {
		for i := 0; i+fragment <= len(secret); i++ {
			windows = append(windows, secret[i:i+fragment])
		}
	}
	for _, r := range Readings(received) {
		for _, w := range windows {
			if bytes.Contains(r.Text, []byte(w)) || bytes.Contains(bytes.ToLower(r.Text), []byte(strings.ToLower(w))) && hexDigits(w) {
				return r.Name
			}
		}
	}
	return ""
}

// A Reading is received decoded one way.
type Reading struct {
	Name string
	Text []byte
}

// Readings is every decoding of b that Find looks in.
func Readings(b []byte) []Reading {
	out := []Reading{{"as received", b}}
	out = append(out, Reading{"percent-decoded", percentDecode(b, false)}, Reading{"form-decoded", percentDecode(b, true)})
	out = append(out, Reading{"JSON-unescaped", jsonUnescape(b)})
	out = append(out, Reading{"JSON-unescaped, then percent-decoded", percentDecode(jsonUnescape(b), false)})
	for off := range 2 {
		out = append(out, Reading{"hex runs at offset " + strconv.Itoa(off), decodeRuns(b, isHex, off, 2, func(s []byte) []byte {
			d, _ := hex.DecodeString(string(s))
			return d
		})})
	}
	for _, enc := range []struct {
		name string
		e    *base64.Encoding
		in   func(byte) bool
	}{
		{"base64", base64.StdEncoding, func(c byte) bool { return isAlnum(c) || c == '+' || c == '/' }},
		{"base64url", base64.URLEncoding, func(c byte) bool { return isAlnum(c) || c == '-' || c == '_' }},
	} {
		e := enc.e.WithPadding(base64.NoPadding)
		for off := range 4 {
			out = append(out, Reading{enc.name + " runs at offset " + strconv.Itoa(off), decodeRuns(b, enc.in, off, 4, func(s []byte) []byte {
				d, _ := e.DecodeString(string(s))
				return d
			})})
		}
	}
	return out
}

// decodeRuns decodes every maximal run of bytes in, from its off-th byte
// on, whole groups of group bytes at a time, joined by a NUL.
func decodeRuns(b []byte, in func(byte) bool, off, group int, decode func([]byte) []byte) []byte {
	var out []byte
	for i := 0; i < len(b); {
		if !in(b[i]) {
			i++
			continue
		}
		j := i
		for j < len(b) && in(b[j]) {
			j++
		}
		if run := b[i:j]; len(run) > off {
			run = run[off:]
			run = run[:len(run)/group*group]
			out = append(out, decode(run)...)
			out = append(out, 0)
		}
		i = j
	}
	return out
}

func percentDecode(b []byte, plus bool) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		switch {
		case b[i] == '%' && i+2 < len(b) && isHex(b[i+1]) && isHex(b[i+2]):
			d, _ := hex.DecodeString(string(b[i+1 : i+3]))
			out = append(out, d...)
			i += 2
		case b[i] == '+' && plus:
			out = append(out, ' ')
		default:
			out = append(out, b[i])
		}
	}
	return out
}

func jsonUnescape(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 == len(b) {
			out = append(out, b[i])
			continue
		}
		i++
		switch c := b[i]; c {
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'u':
			if i+4 < len(b) {
				if r, err := strconv.ParseUint(string(b[i+1:i+5]), 16, 16); err == nil {
					i += 4
					r1 := rune(r)
					if utf16.IsSurrogate(r1) && i+6 < len(b) && b[i+1] == '\\' && b[i+2] == 'u' {
						if r2, err := strconv.ParseUint(string(b[i+3:i+7]), 16, 16); err == nil {
							r1 = utf16.DecodeRune(r1, rune(r2))
							i += 6
						}
					}
					out = append(out, string(r1)...)
					continue
				}
			}
			out = append(out, '\\', 'u')
		default:
			out = append(out, c) // \" \\ \/
		}
	}
	return out
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func hexDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isHex(s[i]) {
			return false
		}
	}
	return true
}
