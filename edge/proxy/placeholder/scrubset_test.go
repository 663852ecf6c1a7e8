package placeholder

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/tests/kit/leakcheck"
)

// tricky is a value escaping changes everywhere: '/', '+', '=', space, '&',
// quotes, a backslash, '<', a non-ASCII letter.
const (
	trickyPrefix = "sk-test-"
	tricky       = trickyPrefix + "Qm7v/R2+x=Hw 4s&Lp\"9<Kz\\é0Tn5bW8yJd3F"
	trickyPh     = "sk-test-PHPHPHPHPHPHPHPHPHPHPHPHPHPHPHPH"
)

func trickySet() *Set {
	return NewSet([]Secret{{Value: secrets.NewValue(tricky), Placeholder: trickyPh, Public: len(trickyPrefix)}})
}

// trickyReal is tricky as leakcheck looks for it.
var trickyReal = leakcheck.Real{Key: "tricky", Value: tricky, Public: len(trickyPrefix), Fragment: FragmentBytes}

// Every form an upstream may echo a value in is scrubbed, wherever in the
// answer it sits, and nothing of it can be read back: the leakcheck reader
// decodes the answer every way it knows and finds no 12 secret bytes.
func TestSetScrubsEveryForm(t *testing.T) {
	set := trickySet()
	var sc Scrubber
	sc.Reset(fixedSource{set})
	for _, f := range leakcheck.Forms(tricky) {
		for lead := range 5 {
			answer := []byte(strings.Repeat("a", lead) + "echo: " + f.Text + " end")
			if got := leakcheck.Find(answer, trickyReal); len(got) == 0 {
				t.Fatalf("%s: the check itself finds nothing in the unscrubbed answer", f.Name)
			}
			out, n := sc.Whole(answer)
			if got := leakcheck.Find(out, trickyReal); len(got) > 0 || n == 0 {
				t.Errorf("%s at %d: %d replaced, and the answer holds the value: %s: %q", f.Name, lead, n, strings.Join(got, "; "), out)
			}
			if !bytes.Contains(out, []byte(trickyPh)) || !bytes.HasSuffix(out, []byte(" end")) {
				t.Errorf("%s at %d: the placeholder is not in its place: %q", f.Name, lead, out)
			}
		}
	}
}

// A hex value comes back in the other case.
func TestSetScrubsAHexValueInEitherCase(t *testing.T) {
	const v = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	set := NewSet([]Secret{{Value: secrets.NewValue(v), Placeholder: trickyPh}})
	var sc Scrubber
	sc.Reset(fixedSource{set})
	for _, s := range []string{v, strings.ToUpper(v), strings.ToUpper(v[:20])} {
		out, _ := sc.Whole([]byte("sha: " + s))
		if got := leakcheck.Find(out, leakcheck.Real{Key: "hex", Value: v, Fragment: FragmentBytes}); len(got) > 0 {
			t.Errorf("%q: it holds %s: %q", s, strings.Join(got, "; "), out)
		}
	}
}

// Any FragmentBytes consecutive secret bytes are scrubbed, in every form,
// at every offset of the value and of the answer; fewer are not, nor is
// the public prefix with fewer secret bytes after it, so the scrubber
// confirms nothing shorter.
func TestSetScrubsEveryFragmentAndNothingShorter(t *testing.T) {
	set := trickySet()
	var sc Scrubber
	sc.Reset(fixedSource{set})
	secret := tricky[len(trickyPrefix):]
	for i := 0; i+FragmentBytes <= len(secret); i++ {
		frag := secret[i : i+FragmentBytes]
		for name, f := range map[string]string{"literal": frag, "hex": hex.EncodeToString([]byte(frag)), "query": url.QueryEscape(frag)} {
			for lead := range gramStep + 1 {
				answer := strings.Repeat("~", lead) + f + "!"
				out, n := sc.Whole([]byte(answer))
				if n != 1 || string(out) != strings.Repeat("~", lead)+trickyPh+"!" {
					t.Fatalf("%s fragment at %d, answer offset %d: %q", name, i, lead, out)
				}
			}
		}
		short := frag[:FragmentBytes-1]
		if out, n := sc.Whole([]byte("~" + short + "~")); n != 0 {
			t.Fatalf("%d secret bytes were scrubbed: %q", len(short), out)
		}
	}
	known := trickyPrefix + secret[:FragmentBytes-1]
	if _, n := sc.Whole([]byte(known)); n != 0 {
		t.Errorf("the public prefix and %d secret bytes were scrubbed", FragmentBytes-1)
	}
}

// The confirm-the-last-character attack: an upstream quotes the value cut
// short of its last byte, and the task, which knows the placeholder's
// prefix, echoes its guesses of the rest through it. The quote reaches it
// scrubbed; every guess comes back scrubbed the same way, the right one
// included, so nothing tells them apart.
func TestSetConfirmsNoGuess(t *testing.T) {
	set := trickySet()
	var sc Scrubber
	sc.Reset(fixedSource{set})
	quote, _ := sc.Whole([]byte(`{"error":"invalid key ` + tricky[:len(tricky)-1] + `"}`))
	if got := leakcheck.Find(quote, trickyReal); len(got) > 0 {
		t.Fatalf("the cut quote reached the task (%s): %q", strings.Join(got, "; "), quote)
	}
	learned := bytes.TrimSuffix(bytes.TrimPrefix(quote, []byte(`{"error":"invalid key `)), []byte(`"}`))
	shapes := map[string]string{}
	for _, c := range "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789" {
		guess := append(bytes.Clone(learned), byte(c))
		out, _ := sc.Whole(guess)
		shapes[string(bytes.TrimSuffix(out, []byte{byte(c)}))] += string(c)
	}
	if len(shapes) != 1 {
		t.Errorf("the guesses come back in %d different shapes: %v", len(shapes), shapes)
	}
	// With only the public prefix and a guess, as little.
	for i := 0; i < FragmentBytes-1; i++ {
		right := trickyPrefix + tricky[len(trickyPrefix):len(trickyPrefix)+i+1]
		if _, n := sc.Whole([]byte(right)); n != 0 {
			t.Fatalf("%d secret bytes after the prefix were confirmed", i+1)
		}
	}
}

// Streamed in reads of every size, a value in every form comes out the
// same as scrubbed whole: a form split across reads is held back and
// found.
func TestSetStreamsEveryFormAcrossReads(t *testing.T) {
	set := trickySet()
	var sc Scrubber
	sc.Reset(fixedSource{set})
	var body bytes.Buffer
	for _, f := range leakcheck.Forms(tricky) {
		body.WriteString("<" + f.Text + ">\n")
	}
	whole, _ := sc.Whole(body.Bytes())
	for _, size := range []int{1, 2, 3, 7, 13, 64} {
		s := sc.Stream(&chunkReader{data: body.Bytes(), sizes: []int{size}})
		got, err := io.ReadAll(s)
		s.Release()
		if err != nil || !bytes.Equal(got, whole) {
			t.Fatalf("reads of %d: differs from the whole answer scrubbed (%v)", size, err)
		}
		if f := leakcheck.Find(got, trickyReal); len(f) > 0 {
			t.Fatalf("reads of %d: it holds the value: %s", size, strings.Join(f, "; "))
		}
	}
}

// A short value is scrubbed whole, in its forms of six bytes or more.
func TestSetScrubsAShortValueWhole(t *testing.T) {
	set := NewSet([]Secret{{Value: secrets.NewValue("pa55/w"), Placeholder: trickyPh}})
	var sc Scrubber
	sc.Reset(fixedSource{set})
	for _, s := range []string{"pa55/w", "pa55%2Fw", base64.StdEncoding.EncodeToString([]byte("u:pa55/w")), hex.EncodeToString([]byte("pa55/w"))} {
		if out, n := sc.Whole([]byte(" " + s + " ")); n != 1 || strings.Contains(string(out), s) {
			t.Errorf("%q: %q", s, out)
		}
	}
	if out, n := sc.Whole([]byte("pa55/")); n != 0 {
		t.Errorf("part of a short value was scrubbed: %q", out)
	}
}

type fixedSource struct{ set *Set }

func (f fixedSource) Set() *Set { return f.set }

// literalScrub is the scrubber before sets: each value's literal bytes
// only, found with bytes.Index. It is the baseline BenchmarkScrubSet
// compares with.
type literalScrub struct {
	values [][]byte
	ph     string
}

func (l literalScrub) find(b []byte, out []Match) []Match {
	out = out[:0]
	for _, v := range l.values {
		for pos := 0; ; {
			i := bytes.Index(b[pos:], v)
			if i < 0 {
				break
			}
			out = append(out, Match{Start: pos + i, End: pos + i + len(v), Owner: Owner{Placeholder: l.ph}})
			pos += i + len(v)
		}
	}
	return out
}

func (l literalScrub) settled(b []byte) int { return max(len(b)-256, 0) }

func (l literalScrub) replace(ms []Match, values []string) ([]string, error) {
	values = values[:0]
	for _, m := range ms {
		values = append(values, m.Owner.Placeholder)
	}
	return values, nil
}

// randomValue is a credential-like value: a prefix and 40 letters, digits
// and a few of '/', '+', '='.
func randomValue(r *rand.Rand) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/+="
	b := []byte("tok_")
	for range 40 {
		b = append(b, alphabet[r.IntN(len(alphabet))])
	}
	return string(b)
}

// BenchmarkScrubSet: a 1 MiB answer (text, read 32 KiB at a time) streamed
// through the scrubber: literal-1 is the scrubber before sets (one value's
// literal bytes), set-1 and set-64 the set of one and of 64 values in every
// form and fragment. The bound: set-64 costs at most twice
// literal-1.
func BenchmarkScrubSet(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	var all []Secret
	for i := range 64 {
		all = append(all, Secret{Value: secrets.NewValue(randomValue(r)), Placeholder: fmt.Sprintf("tok_PH%038d", i), Public: 4})
	}
	text := bytes.Repeat([]byte("lorem ipsum dolor sit amet, consectetur adipiscing elit\n"), 600)[:chunk]
	const total = 1 << 20
	run := func(b *testing.B, rw func() rewriter) {
		b.SetBytes(total)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			s := newPooledScanner(&repeatReader{read: text, left: total}, rw())
			n, err := io.Copy(io.Discard, struct{ io.Reader }{s})
			s.Release()
			if err != nil || n != total {
				b.Fatalf("%d bytes, %v", n, err)
			}
		}
	}
	b.Run("literal-1", func(b *testing.B) {
		run(b, func() rewriter {
			return literalScrub{values: [][]byte{[]byte(all[0].Value.Reveal())}, ph: all[0].Placeholder}
		})
	})
	for _, n := range []int{1, 64} {
		set := NewSet(all[:n])
		b.Run(fmt.Sprintf("set-%d", n), func(b *testing.B) {
			var sc Scrubber
			run(b, func() rewriter { sc.Reset(fixedSource{set}); return &sc })
		})
	}
	b.Run("build-64", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			NewSet(all)
		}
	})
}
