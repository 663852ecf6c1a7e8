package stssession

// Client against moto's STS, through the awsfront kit: moto checks every
// signature and IAM policy, so what Client sends is what a real STS would
// judge (as far as moto 5.2.1 judges it; each test says where moto stops).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/smithy-go"

	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/tests/kit/awsfront"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

// The front is started by the first test that needs it (the fake-STS tests
// of this package do not) and closed by TestMain once every test is done.
var (
	stsFrontOnce sync.Once
	stsFront     *awsfront.Front
	stsFrontErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if stsFront != nil {
		if err := stsFront.Close(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// liveFront is the binary's front, started on first use. A front that
// cannot start (moto_server missing) fails the test, saying why.
func liveFront(t *testing.T) *awsfront.Front {
	t.Helper()
	stsFrontOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		stsFront, stsFrontErr = awsfront.Start(ctx, awsfront.Config{})
	})
	if stsFrontErr != nil {
		t.Fatal(stsFrontErr)
	}
	return stsFront
}

func staticCreds(c aws.Credentials) aws.CredentialsProvider {
	return credentials.StaticCredentialsProvider{Value: c}
}

// motoAssumedRole is what moto keeps of one AssumeRole it answered (its
// sts AssumedRole model, read from /moto-api/data.json).
type motoAssumedRole struct {
	SessionName     string  `json:"session_name"`
	RoleARN         string  `json:"role_arn"`
	ExternalID      *string `json:"external_id"`
	Policy          *string `json:"policy"`
	AccessKeyID     string  `json:"access_key_id"`
	SecretAccessKey string  `json:"secret_access_key"`
	SessionToken    string  `json:"session_token"`
}

// motoAssumedRoles returns the sessions moto minted under sessionName.
func motoAssumedRoles(t *testing.T, f *awsfront.Front, sessionName string) []motoAssumedRole {
	t.Helper()
	resp, err := (&http.Client{Transport: &http.Transport{}, Timeout: 20 * time.Second}).Get(f.Moto.URL + "/moto-api/data.json")
	if err != nil {
		t.Fatalf("reading moto's state: %v", err)
	}
	defer resp.Body.Close()
	var all map[string]map[string][]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&all); err != nil {
		t.Fatalf("moto's state: %v", err)
	}
	var out []motoAssumedRole
	for _, raw := range all["sts"]["AssumedRole"] {
		var r motoAssumedRole
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatalf("moto's AssumedRole: %v", err)
		}
		if r.SessionName == sessionName {
			out = append(out, r)
		}
	}
	return out
}

// assertNoCredential fails if msg holds any part of the given credentials.
func assertNoCredential(t *testing.T, what, msg string, creds ...aws.Credentials) {
	t.Helper()
	for _, c := range creds {
		for name, v := range map[string]string{"access key id": c.AccessKeyID, "secret": c.SecretAccessKey, "session token": c.SessionToken} {
			if v != "" && strings.Contains(msg, v) {
				t.Errorf("%s: the error holds a %s: %s", what, name, msg)
			}
		}
	}
}

var asiaPattern = regexp.MustCompile(`^ASIA[A-Z0-9]{16}$`)

// Client.AssumeRole with edge's own identity, allowed the role: temporary
// ASIA credentials with a token that end `duration` from now, and the
// session they open is the role's, named after the run, and works (moto
// checks the key, the token and the signature of a call made with them).
func TestClientAssumeRoleMintsAWorkingSession(t *testing.T) {
	f := liveFront(t)
	ctx := context.Background()
	c := NewClient(f.AWSConfig(staticCreds(f.Identity.Edge)))
	runID := motoserver.Unique("run-")
	const duration = 20 * time.Minute // not STS's 1h default: the duration is sent
	before := time.Now()
	creds, err := c.AssumeRole(ctx, Request{Role: policy.AssumeRole{RoleARN: f.Identity.RoleARN, Duration: duration}, SessionName: SessionName(runID)})
	after := time.Now()
	if err != nil {
		t.Fatalf("AssumeRole of %s as edge: %v", f.Identity.RoleARN, err)
	}
	id, secret, token := creds.AccessKeyID.Reveal(), creds.SecretAccessKey.Reveal(), creds.SessionToken.Reveal()
	if !asiaPattern.MatchString(id) || secret == "" || token == "" {
		t.Fatalf("credentials: id %q (want ASIA and 16 more), secret %d chars, token %d chars", id, len(secret), len(token))
	}
	// moto stamps the expiry from its own clock (this machine's) to the
	// second.
	const slack = 5 * time.Second
	if lo, hi := before.Add(duration-slack), after.Add(duration+slack); creds.Expires.Before(lo) || creds.Expires.After(hi) {
		t.Errorf("expires %s, want %s after the call (%s to %s)", creds.Expires, duration, lo, hi)
	}
	// Edge's own key made the call.
	if r := lastRecord(t, f, f.Identity.Edge.AccessKeyID); r.Status != http.StatusOK || r.SecurityToken {
		t.Errorf("the front saw the AssumeRole as %+v", r)
	}

	session := aws.Credentials{AccessKeyID: id, SecretAccessKey: secret, SessionToken: token}
	out, err := sts.NewFromConfig(f.AWSConfig(staticCreds(session))).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if err != nil {
		t.Fatalf("GetCallerIdentity with the session: %v", err)
	}
	want := "arn:aws:sts::" + f.Identity.AccountID + ":assumed-role/" + awsfront.RoleName + "/runfleet-" + runID
	if got := aws.ToString(out.Arn); got != want {
		t.Errorf("the session is %s, want %s", got, want)
	}
	if r := lastRecord(t, f, id); r.Status != http.StatusOK || !r.SecurityToken {
		t.Errorf("the front saw the call with the session as %+v", r)
	}
	// The token is part of the session: moto refuses the key with another.
	other := session
	other.SessionToken = "x" + token
	if _, err := sts.NewFromConfig(f.AWSConfig(staticCreds(other))).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}); awsErrorCode(err) != "InvalidClientTokenId" {
		t.Errorf("the session's key with another token: %v", err)
	}
	// moto minted exactly this one session under the run's name.
	if got := motoAssumedRoles(t, f, SessionName(runID)); len(got) != 1 || got[0].AccessKeyID != id || got[0].RoleARN != f.Identity.RoleARN {
		t.Errorf("moto's sessions named %s: %+v", SessionName(runID), got)
	}
}

// What STS refuses comes back as an error that names the role, says why
// (AWS's code and message) and holds no credential: neither the caller's
// nor any session's (none is minted).
func TestClientAssumeRoleRefusals(t *testing.T) {
	f := liveFront(t)
	ctx := context.Background()
	// A role that trusts edge but is not among those edge's identity may
	// assume (its IAM policy names RoleARN only).
	other := createRole(t, f, motoserver.Unique("runfleet-other-"), trustEdge(f, ""))
	for name, tc := range map[string]struct {
		caller aws.Credentials
		role   string
	}{
		// The real user is allowed everything, sts:AssumeRole on the role
		// included; the role's trust names edge's user only.
		"a caller the role does not trust": {f.Identity.Real, f.Identity.RoleARN},
		"a role edge may not assume":       {f.Identity.Edge, other},
		"a role that does not exist":       {f.Identity.Edge, "arn:aws:iam::" + f.Identity.AccountID + ":role/runfleet-no-such-role"},
	} {
		runID := motoserver.Unique("refused-")
		c := NewClient(f.AWSConfig(staticCreds(tc.caller)))
		creds, err := c.AssumeRole(ctx, Request{Role: policy.AssumeRole{RoleARN: tc.role, Duration: time.Hour}, SessionName: SessionName(runID)})
		if err == nil {
			t.Errorf("%s: AssumeRole of %s succeeded", name, tc.role)
			continue
		}
		if !creds.AccessKeyID.IsZero() || !creds.SecretAccessKey.IsZero() || !creds.SessionToken.IsZero() {
			t.Errorf("%s: an error with credentials", name)
		}
		msg := err.Error()
		if !strings.Contains(msg, tc.role) || awsErrorCode(err) != "AccessDenied" {
			t.Errorf("%s: error %q does not name %s and AccessDenied (code %q)", name, msg, tc.role, awsErrorCode(err))
		}
		assertNoCredential(t, name, msg, f.Identity.Real, f.Identity.Edge)
		if got := motoAssumedRoles(t, f, SessionName(runID)); len(got) != 0 {
			t.Errorf("%s: moto minted %d sessions", name, len(got))
		}
	}
}

// The external id and the session policy reach STS. moto checks the
// external id against a StringEquals condition of the role's trust (a
// wrong one is refused; moto lets a missing one through, so that is not
// asserted here) and records both with the session. It does not narrow the
// session by the session policy (moto's assumed-role keys act with the
// role's policies alone), so only that the policy was received is
// asserted.
func TestClientSendsExternalIDAndSessionPolicy(t *testing.T) {
	f := liveFront(t)
	ctx := context.Background()
	const externalID = "fleet-7f3a"
	roleARN := createRole(t, f, motoserver.Unique("runfleet-ext-"), trustEdge(f, externalID))
	allowEdgeToAssume(t, f, roleARN)
	const sessionPolicy = `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"arn:aws:s3:::reports/*"}]}`
	c := NewClient(f.AWSConfig(staticCreds(f.Identity.Edge)))

	runID := motoserver.Unique("ext-")
	creds, err := c.AssumeRole(ctx, Request{Role: policy.AssumeRole{RoleARN: roleARN, ExternalID: externalID, SessionPolicy: sessionPolicy, Duration: time.Hour}, SessionName: SessionName(runID)})
	if err != nil {
		t.Fatalf("AssumeRole with the role's external id: %v", err)
	}
	got := motoAssumedRoles(t, f, SessionName(runID))
	if len(got) != 1 || got[0].AccessKeyID != creds.AccessKeyID.Reveal() {
		t.Fatalf("moto's sessions named %s: %+v", SessionName(runID), got)
	}
	if s := got[0]; s.ExternalID == nil || *s.ExternalID != externalID || s.Policy == nil || *s.Policy != sessionPolicy {
		t.Errorf("moto received external id %v and policy %v, want %q and %q", orNil(s.ExternalID), orNil(s.Policy), externalID, sessionPolicy)
	}

	// Neither is sent when the role names none.
	runID = motoserver.Unique("plain-")
	if _, err := c.AssumeRole(ctx, Request{Role: policy.AssumeRole{RoleARN: f.Identity.RoleARN, Duration: time.Hour}, SessionName: SessionName(runID)}); err != nil {
		t.Fatal(err)
	}
	if got := motoAssumedRoles(t, f, SessionName(runID)); len(got) != 1 || got[0].ExternalID != nil || got[0].Policy != nil {
		t.Errorf("a role without external id or session policy: moto received %+v", got)
	}

	// A wrong external id is refused by the role's trust; the error names
	// the role but not the id (the role owner's shared check).
	const wrongID = "fleet-0000"
	runID = motoserver.Unique("ext-wrong-")
	_, err = c.AssumeRole(ctx, Request{Role: policy.AssumeRole{RoleARN: roleARN, ExternalID: wrongID, Duration: time.Hour}, SessionName: SessionName(runID)})
	if err == nil || awsErrorCode(err) != "AccessDenied" || !strings.Contains(err.Error(), roleARN) {
		t.Fatalf("AssumeRole with a wrong external id: %v", err)
	}
	if strings.Contains(err.Error(), wrongID) {
		t.Errorf("the error quotes the external id: %v", err)
	}
	assertNoCredential(t, "wrong external id", err.Error(), f.Identity.Edge)
}

// lastRecord is the last request the front saw signed with keyID.
func lastRecord(t *testing.T, f *awsfront.Front, keyID string) awsfront.Record {
	t.Helper()
	recs := f.Records()
	for i := len(recs) - 1; i >= 0; i-- {
		if recs[i].AccessKeyID == keyID {
			return recs[i]
		}
	}
	t.Fatalf("the front saw no request signed with %s", keyID)
	return awsfront.Record{}
}

func awsErrorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

func orNil(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}

// realIAM is IAM in the front's moto as the real user (allowed
// everything), straight to moto: the front answers for no IAM name.
func realIAM(f *awsfront.Front) *iam.Client {
	cfg := f.Moto.AWSConfig()
	cfg.Credentials = staticCreds(f.Identity.Real)
	return iam.NewFromConfig(cfg)
}

// trustEdge is a trust policy naming edge's user, with an external id
// condition when externalID is set.
func trustEdge(f *awsfront.Front, externalID string) string {
	cond := ""
	if externalID != "" {
		cond = `,"Condition":{"StringEquals":{"sts:ExternalId":"` + externalID + `"}}`
	}
	return `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":"` + f.Identity.EdgeUserARN + `"},"Action":"sts:AssumeRole"` + cond + `}]}`
}

// createRole creates a role with trust and returns its ARN.
func createRole(t *testing.T, f *awsfront.Front, name, trust string) string {
	t.Helper()
	out, err := realIAM(f).CreateRole(context.Background(), &iam.CreateRoleInput{RoleName: aws.String(name), AssumeRolePolicyDocument: aws.String(trust)})
	if err != nil {
		t.Fatalf("CreateRole %s: %v", name, err)
	}
	return aws.ToString(out.Role.Arn)
}

// allowEdgeToAssume lets edge's user assume roleARN too.
func allowEdgeToAssume(t *testing.T, f *awsfront.Front, roleARN string) {
	t.Helper()
	doc := `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"sts:AssumeRole","Resource":"` + roleARN + `"}]}`
	if _, err := realIAM(f).PutUserPolicy(context.Background(), &iam.PutUserPolicyInput{
		UserName: aws.String(awsfront.EdgeUserName), PolicyName: aws.String(motoserver.Unique("assume-")), PolicyDocument: aws.String(doc),
	}); err != nil {
		t.Fatalf("PutUserPolicy: %v", err)
	}
}
