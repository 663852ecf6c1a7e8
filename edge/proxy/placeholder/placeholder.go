// Package placeholder owns the secrets proxy's placeholders as bytes:
// minting them, finding every known one in what a task sends, putting in
// what the caller decides for each occurrence, and taking real values back
// out of what a task is sent. It decides nothing: every occurrence goes to
// the caller's Substituter (policy, grants, audit and refusals are package
// proxy's), and it knows no task beyond the run id an Owner names, no
// connection and no registry.
//
//   - Mint draws a placeholder of a policy.Shape.
//   - An Index (NewIndex) finds every task's placeholders, spelt exactly
//     (Find, FindString) or in any case (FindFolded), and redacts them from
//     text to be recorded (Redacted). It is immutable and safe for
//     concurrent use; the proxy builds a new one when placeholders change.
//   - Rewrite, RewriteString and RewriteBasic replace the placeholders in a
//     request's parts, a Scanner (NewScanner) in a body as it streams,
//     holding back at most the longest placeholder less one byte. Every
//     occurrence in what is at hand is decided before any of it is
//     replaced or passed on, so a refused one stops it all.
//   - A Set (NewSet) indexes a run's real values in every form an answer
//     may carry them (spellings) to find any of them, or any fragment of
//     FragmentBytes secret bytes, in one pass. A Scrubber replaces what
//     its Source's Set finds by the placeholder in what a task is sent:
//     fields (Header), bodies read whole (Whole) or streamed (Stream),
//     WebSocket frames (Pass). When streamed bytes go on depends on their
//     number and line breaks alone, never on whether they partially match
//     a value.
//
// Finding allocates nothing when the caller's scratch has room and the text
// holds no placeholder, the common case on every request (BenchmarkFind,
// BenchmarkRewriteString). A Scanner or a Scrubber is for one goroutine at
// a time. See DESIGN.md, section "The secrets proxy", for the rest.
package placeholder

import (
	"fmt"
	"io"
	"strings"

	"github.com/runfleet/runfleet/edge/policy"
)

// Owner is whose a placeholder is: the task (its run id) and the key it
// stands for, and the placeholder itself (what a scrubbed answer gets back
// in place of the key's value).
type Owner struct {
	Task        string
	Ref         policy.KeyRef
	Placeholder string
}

const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

// Mint draws a placeholder of shape: its prefix, then
// shape.Length-len(shape.Prefix) letters and digits drawn uniformly from r
// (rejection sampling: no modulo bias). r is read 64 bytes at a time.
func Mint(r io.Reader, shape policy.Shape) (string, error) {
	return mint(r, shape.Prefix, shape.Length-len(shape.Prefix), alphabet)
}

// AWS credentials' own alphabets: an access key id's characters after its
// four-letter prefix are base32's, a secret's and a token's base64's.
const (
	awsIDAlphabet     = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
	awsSecretAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	// AWSTokenLength: real session tokens run to hundreds of characters;
	// a task's tools only carry this one.
	AWSTokenLength = 128
)

// AWSPlaceholders are the placeholder credentials of a key of kind aws,
// shaped as real ones are (SDKs check the shapes): an access key id of 20
// characters, "AKIA" for a long-term key or "ASIA" for a temporary one
// followed by 16 drawn (80 bits), a secret of 40 (240 bits) and, for a
// temporary key, a session token.
type AWSPlaceholders struct {
	AccessKeyID, SecretAccessKey, SessionToken string
}

// MintAWS draws AWS placeholder credentials from r; temporary adds the
// session token and makes the id an "ASIA" one.
func MintAWS(r io.Reader, temporary bool) (AWSPlaceholders, error) {
	prefix := "AKIA"
	if temporary {
		prefix = "ASIA"
	}
	var a AWSPlaceholders
	var err error
	if a.AccessKeyID, err = mint(r, prefix, 16, awsIDAlphabet); err != nil {
		return a, err
	}
	if a.SecretAccessKey, err = mint(r, "", 40, awsSecretAlphabet); err != nil {
		return a, err
	}
	if temporary {
		a.SessionToken, err = mint(r, "", AWSTokenLength, awsSecretAlphabet)
	}
	return a, err
}

// mint draws n characters of alphabet (whose length divides 256 or not:
// rejection sampling leaves no bias) after prefix.
func mint(r io.Reader, prefix string, n int, alphabet string) (string, error) {
	var b strings.Builder
	b.Grow(len(prefix) + n)
	b.WriteString(prefix)
	buf := make([]byte, 64)
	for n > 0 {
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", fmt.Errorf("placeholder: minting one: %w", err)
		}
		for _, c := range buf {
			if n == 0 {
				break
			}
			if int(c) < 256-256%len(alphabet) {
				b.WriteByte(alphabet[int(c)%len(alphabet)])
				n--
			}
		}
	}
	return b.String(), nil
}
