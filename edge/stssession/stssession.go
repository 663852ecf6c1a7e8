// Package stssession owns the per-run AWS sessions behind keys of kind aws
// that name a role (aws.assumeRole): one STS AssumeRole session per run and
// key, named after the run so CloudTrail attributes every call to it,
// renewed before it ends while the run lives, and forgotten when its
// attempt ends (Drop). The sessions are minted with edge's own AWS credentials; a task
// never sees them (the proxy signs with them).
package stssession

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/shared/clock"
)

// Request is one AssumeRole call.
type Request struct {
	Role        policy.AssumeRole
	SessionName string
}

// Credentials are a session's. Each part is a secrets.Value, and the whole
// prints, logs and encodes as redacted: a value never reaches a log by
// accident, even inside something else printed.
type Credentials struct {
	AccessKeyID, SecretAccessKey, SessionToken secrets.Value
	Expires                                    time.Time
}

const redactedCredentials = "stssession.Credentials(REDACTED)"

func (Credentials) String() string   { return redactedCredentials }
func (Credentials) GoString() string { return redactedCredentials }

// Format keeps every verb, %+v and %#v included, from printing a field.
func (Credentials) Format(f fmt.State, _ rune) { fmt.Fprint(f, redactedCredentials) }

// LogValue is what slog records.
func (Credentials) LogValue() slog.Value { return slog.StringValue(redactedCredentials) }

// MarshalJSON keeps encoders (and slog's JSON handler) from writing a field.
func (Credentials) MarshalJSON() ([]byte, error) { return json.Marshal(redactedCredentials) }

// AssumeRoler calls STS. Errors name the role, never a credential.
type AssumeRoler interface {
	AssumeRole(ctx context.Context, req Request) (Credentials, error)
}

// SessionName is the RoleSessionName of runID's sessions: "runfleet-"
// followed by the run id, cut to STS's 64 characters (a run id is letters,
// digits, '.', '_' and '-', all of which STS takes); a longer one keeps
// its first 46 characters and a hash of the whole.
func SessionName(runID string) string {
	name := "runfleet-" + runID
	if len(name) > 64 {
		// Cut, then told apart from other ids cut alike by a hash of the
		// whole id.
		sum := sha256.Sum256([]byte(runID))
		name = name[:55] + "-" + hex.EncodeToString(sum[:4])
	}
	return name
}

// RefreshBefore is how long before its end a session is renewed: longer
// than a slow STS call and any request signed with it in flight, short
// against STS's 15-minute minimum.
const RefreshBefore = 5 * time.Minute

// Sessions holds the live sessions by run and key.
type Sessions struct {
	sts   AssumeRoler
	clock clock.Clock

	mu       sync.Mutex
	sessions map[sessionKey]*session
}

type sessionKey struct {
	runID string
	ref   policy.KeyRef
}

// session is one run's session of one key; mu makes its renewals one at a
// time (the requests that find it due wait for the one call).
type session struct {
	mu      sync.Mutex
	creds   Credentials
	minted  bool
	dropped atomic.Bool // set by Drop without waiting for mu
}

// New returns an empty set of sessions minted through sts.
func New(sts AssumeRoler, clk clock.Clock) *Sessions {
	if clk == nil {
		clk = clock.Real{}
	}
	return &Sessions{sts: sts, clock: clk, sessions: map[sessionKey]*session{}}
}

// ErrDropped: the run's sessions were dropped while a call was minting one.
var ErrDropped = errors.New("stssession: the run's sessions were dropped")

// Get returns the run's session of ref under role, minting it on first use
// and renewing it once it is within RefreshBefore of its end. A renewal
// that fails while the session still has time left is an error all the
// same: the caller refuses rather than sign with credentials about to end.
func (s *Sessions) Get(ctx context.Context, runID string, ref policy.KeyRef, role policy.AssumeRole) (Credentials, error) {
	k := sessionKey{runID, ref}
	s.mu.Lock()
	se, ok := s.sessions[k]
	if !ok {
		se = &session{}
		s.sessions[k] = se
	}
	s.mu.Unlock()

	se.mu.Lock()
	defer se.mu.Unlock()
	if se.dropped.Load() {
		return Credentials{}, ErrDropped
	}
	if se.minted && s.clock.Now().Before(se.creds.Expires.Add(-RefreshBefore)) {
		return se.creds, nil
	}
	creds, err := s.sts.AssumeRole(ctx, Request{Role: role, SessionName: SessionName(runID)})
	if err == nil && (creds.AccessKeyID.IsZero() || creds.SecretAccessKey.IsZero() || creds.SessionToken.IsZero() || creds.Expires.IsZero()) {
		err = fmt.Errorf("stssession: AssumeRole of %s answered without complete credentials", role.RoleARN)
	}
	if err != nil {
		if !se.minted {
			s.forget(k, se) // a session that never was is not held
		}
		return Credentials{}, err
	}
	// Drop marks the session before it waits for this call: a session
	// minted for a run dropped meanwhile is never handed out.
	if se.dropped.Load() {
		return Credentials{}, ErrDropped
	}
	se.creds, se.minted = creds, true
	return creds, nil
}

// forget removes se from the map unless another has taken its place.
func (s *Sessions) forget(k sessionKey, se *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions[k] == se {
		delete(s.sessions, k)
	}
}

// Drop forgets every session of the run: nothing signs with them again.
// (STS cannot revoke a session early; the role's own "revoke sessions"
// does that for all of them. A dropped session ends at its expiry, unused.)
func (s *Sessions) Drop(runID string) {
	s.mu.Lock()
	var dropped []*session
	for k, se := range s.sessions {
		if k.runID == runID {
			dropped = append(dropped, se)
			delete(s.sessions, k)
		}
	}
	s.mu.Unlock()
	for _, se := range dropped {
		se.dropped.Store(true)
		se.mu.Lock()
		se.creds = Credentials{}
		se.mu.Unlock()
	}
}

// Len is the number of sessions held, for tests and metrics.
func (s *Sessions) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// Client is AssumeRoler over the AWS SDK's STS client.
type Client struct{ api *sts.Client }

// DefaultRegion is STS's region when edge's AWS configuration names none.
const DefaultRegion = "us-east-1"

// NewClient calls STS with edge's own AWS configuration.
func NewClient(cfg aws.Config) *Client {
	if cfg.Region == "" {
		cfg.Region = DefaultRegion
	}
	return &Client{api: sts.NewFromConfig(cfg)}
}

// AssumeRole calls sts:AssumeRole.
func (c *Client) AssumeRole(ctx context.Context, req Request) (Credentials, error) {
	in := &sts.AssumeRoleInput{
		RoleArn:         aws.String(req.Role.RoleARN),
		RoleSessionName: aws.String(req.SessionName),
		DurationSeconds: aws.Int32(int32(req.Role.Duration / time.Second)),
	}
	if req.Role.ExternalID != "" {
		in.ExternalId = aws.String(req.Role.ExternalID)
	}
	if req.Role.SessionPolicy != "" {
		in.Policy = aws.String(req.Role.SessionPolicy)
	}
	out, err := c.api.AssumeRole(ctx, in)
	if err != nil {
		// The SDK's error names the operation, the status and AWS's own
		// message (which names the role and the caller, never a secret).
		return Credentials{}, fmt.Errorf("sts:AssumeRole of %s: %w", req.Role.RoleARN, err)
	}
	cr := out.Credentials
	if cr == nil {
		return Credentials{}, fmt.Errorf("sts:AssumeRole of %s answered no credentials", req.Role.RoleARN)
	}
	return Credentials{
		AccessKeyID: secrets.NewValue(aws.ToString(cr.AccessKeyId)), SecretAccessKey: secrets.NewValue(aws.ToString(cr.SecretAccessKey)),
		SessionToken: secrets.NewValue(aws.ToString(cr.SessionToken)), Expires: aws.ToTime(cr.Expiration),
	}, nil
}
