package awsfront

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// keyring holds the secrets the front checks signatures with, by access
// key id. Safe for concurrent use.
type keyring struct {
	mu   sync.Mutex
	keys map[string]aws.Credentials
}

func (k *keyring) add(c aws.Credentials) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.keys == nil {
		k.keys = map[string]aws.Credentials{}
	}
	k.keys[c.AccessKeyID] = c
}

// lookup returns the credentials of id, checking that token (the request's
// X-Amz-Security-Token, "" when absent) is theirs, as moto does
// (iam/access_control.py create_access_key).
func (k *keyring) lookup(id, token string) (aws.Credentials, error) {
	k.mu.Lock()
	c, ok := k.keys[id]
	k.mu.Unlock()
	if !ok {
		return aws.Credentials{}, fmt.Errorf("awsfront: access key %s: %w", id, ErrUnknownKey)
	}
	if token != c.SessionToken {
		return aws.Credentials{}, fmt.Errorf("awsfront: access key %s: %w", id, ErrToken)
	}
	return c, nil
}

// maxSTSAnswer bounds how much of an STS answer the front reads to learn
// temporary credentials; STS answers are a few KiB.
const maxSTSAnswer = 1 << 20

// learnSTS reads the temporary credentials in an STS answer (AssumeRole,
// GetSessionToken, ...) into the keyring, so that the front can check
// requests signed with them (presigned, streaming) as moto would. The
// answer still reaches the client whole.
func (k *keyring) learnSTS(resp *http.Response) error {
	head, err := io.ReadAll(io.LimitReader(resp.Body, maxSTSAnswer))
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	if err != nil {
		return fmt.Errorf("awsfront: reading an STS answer: %w", err)
	}
	dec := xml.NewDecoder(bytes.NewReader(head))
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			// Not XML (or cut at the limit): nothing to learn.
			return nil
		}
		start, ok := tok.(xml.StartElement)
		if !ok || start.Name.Local != "Credentials" {
			continue
		}
		var c struct {
			AccessKeyID     string `xml:"AccessKeyId"`
			SecretAccessKey string `xml:"SecretAccessKey"`
			SessionToken    string `xml:"SessionToken"`
		}
		if err := dec.DecodeElement(&c, &start); err != nil {
			return nil
		}
		if c.AccessKeyID != "" && c.SecretAccessKey != "" {
			k.add(aws.Credentials{AccessKeyID: strings.TrimSpace(c.AccessKeyID), SecretAccessKey: strings.TrimSpace(c.SecretAccessKey),
				SessionToken: strings.TrimSpace(c.SessionToken), Source: "awsfront learned from STS"})
		}
	}
}
