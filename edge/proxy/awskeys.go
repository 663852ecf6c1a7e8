package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy/awssig"
	"github.com/runfleet/runfleet/edge/proxy/placeholder"
	"github.com/runfleet/runfleet/edge/secrets"
)

// An AWS key's placeholders are kept as one string among the task's other
// placeholders (placeholderStore, registry.placeholders): this prefix, then
// the id, secret and token joined by ':' (a character none of their
// alphabets has). Such a string is never scanned for (it appears in no
// request): the AWS index finds a request's signature by its access key id.
const awsStoredPrefix = "aws1:"

func storeAWS(a placeholder.AWSPlaceholders) string {
	return awsStoredPrefix + a.AccessKeyID + ":" + a.SecretAccessKey + ":" + a.SessionToken
}

// storedAWS reads what storeAWS wrote; false for any other placeholder.
func storedAWS(s string) (placeholder.AWSPlaceholders, bool) {
	rest, ok := strings.CutPrefix(s, awsStoredPrefix)
	if !ok {
		return placeholder.AWSPlaceholders{}, false
	}
	parts := strings.Split(rest, ":")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return placeholder.AWSPlaceholders{}, false
	}
	return placeholder.AWSPlaceholders{AccessKeyID: parts[0], SecretAccessKey: parts[1], SessionToken: parts[2]}, true
}

// awsOwner is whose an AWS placeholder access key id is.
type awsOwner struct {
	task string
	ref  policy.KeyRef
	ph   placeholder.AWSPlaceholders
}

// awsCredentialsJSON is an aws key's value in the secrets source.
type awsCredentialsJSON struct {
	AccessKeyID     string `json:"accessKeyId"`
	SecretAccessKey string `json:"secretAccessKey"`
	SessionToken    string `json:"sessionToken"`
}

// errAWSValue: the secrets source's value for an aws key is not AWS
// credentials. The message names the key and what is wrong, never the
// value.
type errAWSValue struct {
	ref  policy.KeyRef
	what string
}

func (e *errAWSValue) Error() string {
	return fmt.Sprintf(`the value of %s is not AWS credentials (%s): want JSON {"accessKeyId": "AKIA...", "secretAccessKey": "...", "sessionToken": "..." (temporary credentials only)}`, e.ref, e.what)
}

// parseAWSValue reads an aws key's value. The decode error is not wrapped:
// it may quote the value.
func parseAWSValue(ref policy.KeyRef, v secrets.Value) (awssig.Credentials, error) {
	var c awsCredentialsJSON
	dec := json.NewDecoder(strings.NewReader(v.Reveal()))
	dec.DisallowUnknownFields()
	if dec.Decode(&c) != nil || dec.Decode(&struct{}{}) != io.EOF {
		return awssig.Credentials{}, &errAWSValue{ref, "not a JSON object of those fields"}
	}
	switch {
	case c.AccessKeyID == "":
		return awssig.Credentials{}, &errAWSValue{ref, "accessKeyId is missing"}
	case c.SecretAccessKey == "":
		return awssig.Credentials{}, &errAWSValue{ref, "secretAccessKey is missing"}
	case !validAccessKeyID(c.AccessKeyID):
		return awssig.Credentials{}, &errAWSValue{ref, "accessKeyId is not 16 to 128 capital letters and digits"}
	case strings.ContainsAny(c.SecretAccessKey+c.SessionToken, "\r\n\x00"):
		return awssig.Credentials{}, &errAWSValue{ref, "a field holds a line break"}
	}
	return awssig.Credentials{AccessKeyID: c.AccessKeyID, SecretAccessKey: c.SecretAccessKey, SessionToken: c.SessionToken}, nil
}

func validAccessKeyID(s string) bool {
	if len(s) < 16 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// parsedAWSValue is an aws key's value as last read and parsed
// (Proxy.awsParsed, by key).
type parsedAWSValue struct {
	raw   string
	creds awssig.Credentials
}

// errNoSTS: a key names a role, and edge was started without an STS client.
var errNoSTS = errors.New("edge has no AWS credentials of its own to call STS with (Config.AWSSessions is nil)")

// awsCredentials are the real credentials of a granted aws key for runID
// now: the secrets source's value, or the run's STS session of the key's
// role (minted or renewed as needed). secrets.ErrNotFound when the source
// has no value. Each value is handed to cfg.Observe before it is returned,
// so logs are redacted of it before anything can print it.
func (p *Proxy) awsCredentials(ctx context.Context, runID string, g *policy.Granted) (awssig.Credentials, error) {
	var creds awssig.Credentials
	if role := g.AWS.AssumeRole; role != nil {
		if p.cfg.AWSSessions == nil {
			return creds, errNoSTS
		}
		s, err := p.cfg.AWSSessions.Get(ctx, runID, g.Ref, *role)
		if err != nil {
			return creds, err
		}
		creds = awssig.Credentials{AccessKeyID: s.AccessKeyID.Reveal(), SecretAccessKey: s.SecretAccessKey.Reveal(), SessionToken: s.SessionToken.Reveal()}
	} else {
		v, err := p.cfg.Secrets.Value(ctx, g.Ref.Project, g.Ref.Key)
		if err != nil {
			return creds, err
		}
		// The value is read at every request (a rotation applies at once)
		// but parsed, and observed, only when it changed.
		raw := v.Reveal()
		if last, ok := p.awsParsed.Load(g.Ref); ok && last.(*parsedAWSValue).raw == raw {
			return last.(*parsedAWSValue).creds, nil
		}
		if creds, err = parseAWSValue(g.Ref, v); err != nil {
			return creds, err
		}
		defer p.awsParsed.Store(g.Ref, &parsedAWSValue{raw: raw, creds: creds})
	}
	if p.cfg.Observe != nil {
		for _, s := range [...]string{creds.AccessKeyID, creds.SecretAccessKey, creds.SessionToken} {
			if s != "" {
				p.cfg.Observe(secrets.NewValue(s))
			}
		}
	}
	return creds, nil
}

// learnAWS makes the run's answers scrubbed of the key's real credentials,
// each replaced by its placeholder (the id keeps its public "AKIA" or
// "ASIA").
func (t *task) learnAWS(ref policy.KeyRef, ph placeholder.AWSPlaceholders, creds awssig.Credentials) {
	values := [3]learnt{
		{ref: ref, prefix: ph.AccessKeyID[:4], placeholder: ph.AccessKeyID, value: secrets.NewValue(creds.AccessKeyID)},
		{ref: ref, placeholder: ph.SecretAccessKey, value: secrets.NewValue(creds.SecretAccessKey)},
	}
	n := 2
	if creds.SessionToken != "" {
		// A task of long-term placeholders has no token placeholder; the
		// secret's stands in for it.
		tokenPH := ph.SessionToken
		if tokenPH == "" {
			tokenPH = ph.SecretAccessKey
		}
		values[2] = learnt{ref: ref, placeholder: tokenPH, value: secrets.NewValue(creds.SessionToken)}
		n = 3
	}
	t.values.learn(values[:n]...)
}
