package leakcheck

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"testing"
)

// The values the checks are tried on: one with a public prefix and the
// characters escaping changes (quotes, a backslash, '/', '+', '=', '&',
// '%', a space, a tab, '<'), one spelt in hex digits, one with bytes past
// ASCII (é, and an emoji past U+FFFF) in every Bound bytes.
var (
	special = Real{Key: "SPECIAL", Public: 3, Value: `sk_Qm7v/R2+x=Hw 4s&Lp"9<Kz\0Tn5%bW8y` + "\t" + `Jd3F'>aG6e`}
	hexy    = Real{Key: "HEX", Value: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b"}
	wide    = Real{Key: "WIDE", Public: 3, Value: "pk_café-Zr8q😀Nw3kVb5éTmYx7Lc😀Hs2peé"}
)

// find is Find, failing t if a finding holds any Bound-byte run of r's
// secret part or r's value: the messages name forms, never bytes.
func find(t *testing.T, received string, r Real) []string {
	t.Helper()
	found := Find([]byte(received), r)
	for _, f := range found {
		for _, n := range append(r.needles(), r.Value) {
			if strings.Contains(f, n) {
				t.Fatalf("%s: a finding holds the value's bytes", r.Key)
			}
		}
	}
	return found
}

// The checks must see every form a scrubber has to take out, and must not
// see one where there is none: else the attack tests would fail for the
// right scrubber or pass for the wrong one. Every form of a value and of a
// Bound-byte run of its secret part is found, wherever it stands.
func TestFindsEveryForm(t *testing.T) {
	for _, r := range []Real{special, hexy, wide} {
		samples := []string{r.Value}
		if r.Key != wide.Key { // a run cut inside a character has no JSON form
			samples = append(samples, r.Value[r.Public+3:r.Public+3+Bound])
		}
		for _, s := range samples {
			forms := Forms(s)
			if len(forms) < 15 {
				t.Errorf("%s: only %d forms of %d bytes", r.Key, len(forms), len(s))
			}
			for _, f := range forms {
				if len(find(t, "<<"+f.Text+">>", r)) == 0 {
					t.Errorf("%s: %s of %d bytes not found", r.Key, f.Name, len(s))
				}
			}
		}
	}
}

// Realistic writings of a value (inside Basic credentials, a JSON
// document, a query string, re-encoded, cut to a fragment) are found,
// though few are a form of the value whole.
func TestFindsRealisticWritings(t *testing.T) {
	for _, r := range []Real{special, hexy} {
		sec := r.Value[r.Public:]
		for _, w := range []string{
			"Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+r.Value)),
			"Basic " + base64.StdEncoding.EncodeToString([]byte("a-longer-user:"+r.Value)),
			"t=" + base64.RawURLEncoding.EncodeToString([]byte("x"+sec[5:5+Bound]+"y")),
			"t=" + base64.StdEncoding.EncodeToString([]byte("xy"+sec[2:2+Bound])) + "&u=1",
			`{"quote": ` + jsonString(sec[:20], true) + `}`,
			`{"quote": ` + jsonASCII(sec[4:4+Bound]) + `}`,
			"next=/a?k=" + url.QueryEscape(sec) + "&x=1",
			"next=" + url.QueryEscape("/a?k="+url.QueryEscape(sec[1:1+Bound])),
			hex.EncodeToString([]byte("zz" + sec[7:7+Bound])),
			url.QueryEscape(base64.StdEncoding.EncodeToString([]byte("usr:" + r.Value))),
			"tokens-" + base64.URLEncoding.EncodeToString([]byte(sec)) + "-end",
		} {
			if len(find(t, w, r)) == 0 {
				t.Errorf("%s: a realistic writing not found: %q", r.Key, w)
			}
		}
	}
	// A hex-like run in mixed case means the same.
	mixed := []byte(hexy.Value[2 : 2+Bound+4])
	upper := false
	for i, c := range mixed {
		if c >= 'a' && c <= 'f' {
			if upper {
				mixed[i] = c - 'a' + 'A'
			}
			upper = !upper
		}
	}
	if len(find(t, "sha: "+string(mixed), hexy)) == 0 {
		t.Error("a hex-like run in mixed case not found")
	}
	// Bytes past ASCII escaped one at a time amid literal text.
	var bytewise strings.Builder
	for _, c := range []byte(wide.Value) {
		if c < 0x80 {
			bytewise.WriteByte(c)
		} else {
			fmt.Fprintf(&bytewise, `\u%04x`, c)
		}
	}
	if len(find(t, `{"k":"`+bytewise.String()+`"}`, wide)) == 0 {
		t.Error(`a value with its bytes past ASCII as \u00XX not found`)
	}
}

// Nothing is found where nothing of the secret part is: a placeholder of
// the value's shape, runs one byte shorter than the bound, the public
// prefix, in any of their forms.
func TestFindsNothingInCleanText(t *testing.T) {
	for _, r := range []Real{special, hexy, wide} {
		sec := r.Value[r.Public:]
		prefix := r.Value[:r.Public]
		placeholder := prefix + strings.Repeat("PH", 20)
		var clean []string
		for _, s := range []string{placeholder, sec[:Bound-1], sec[len(sec)-Bound+1:], prefix + sec[:Bound-1]} {
			for _, f := range Forms(s) {
				clean = append(clean, f.Text)
			}
		}
		clean = append(clean,
			"Bearer "+placeholder,
			"short runs: "+sec[:Bound-1]+" ... "+sec[Bound:2*Bound-1]+" ... "+sec[1:Bound],
			base64.StdEncoding.EncodeToString([]byte(sec[:Bound-1])),
			"the prefix alone: "+prefix+prefix,
		)
		for _, c := range clean {
			if found := find(t, c, r); len(found) > 0 {
				t.Errorf("%s: found in clean text %q: %v", r.Key, c, found)
			}
		}
	}
}

// A secret part shorter than the bound is looked for with the value
// whole: every form of it is found, and any part of it is not.
func TestFindsAShortValueWhole(t *testing.T) {
	short := Real{Key: "SHORT", Value: "pa55/w"}
	for _, f := range Forms(short.Value) {
		if len(find(t, " "+f.Text+" ", short)) == 0 {
			t.Errorf("%s not found", f.Name)
		}
	}
	for _, c := range []string{"pa55/", "a55/w", hex.EncodeToString([]byte("pa55/")), base64.StdEncoding.EncodeToString([]byte("u:pa55"))} {
		if found := find(t, c, short); len(found) > 0 {
			t.Errorf("found in %q: %v", c, found)
		}
	}
	if got := Find([]byte("pa55%2Fw"), Real{Value: "pa55/w", Fragment: 4}); len(got) == 0 {
		t.Error("a fragment bound of 4: not found")
	}
}

// recorder is a testing.TB that keeps its errors.
type recorder struct {
	testing.TB
	errors []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

// AssertClean fails with what it was checking, the key and the forms,
// and not with the value; on clean text it does not fail.
func TestAssertCleanNamesFormsNotBytes(t *testing.T) {
	rec := &recorder{TB: t}
	AssertClean(rec, "the echo", []byte("clean text"), special)
	if len(rec.errors) != 0 {
		t.Fatalf("clean text failed: %v", rec.errors)
	}
	AssertClean(rec, "the echo", []byte("echo: "+jsonString(special.Value, true)+" and "+hex.EncodeToString([]byte(special.Value[5:30]))), special)
	if len(rec.errors) != 1 {
		t.Fatalf("%d errors, want 1", len(rec.errors))
	}
	msg := rec.errors[0]
	for _, want := range []string{"the echo: ", "SPECIAL", "the whole value as JSON", "12-byte runs of its secret part", "hex"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the message does not say %q: %s", want, msg)
		}
	}
	for _, n := range append(special.needles(), special.Value[special.Public:special.Public+6]) {
		if strings.Contains(msg, n) {
			t.Fatal("the message holds bytes of the value")
		}
	}
}
