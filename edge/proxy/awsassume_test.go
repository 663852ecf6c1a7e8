package proxy

// aws keys that name a role, against moto's real STS behind the awsfront
// kit (moto checks every signature, session token and IAM policy): the
// proxy's STS sessions are minted with edge's own identity, one per run
// and attempt, renewed by the sessions' clock, and only ever seen by the
// upstream, never by the task, its answers or edge's logs.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/stssession"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/awsfront"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

// The names the task reaches: STS at the front, S3 at an upstream of the
// test's own that echoes what it was signed with, as AWS's
// SignatureDoesNotMatch error does.
const (
	assumeSTSName = "sts.us-east-1.amazonaws.com"
	assumeS3Name  = "s3.us-east-1.amazonaws.com"
)

// The package has a TestMain (clients_test.go) this file does not own, so
// the front, whose moto takes a second to start and bootstrap, is shared by
// subtests of one test and closed by its cleanup.
func TestAWSAssumeRoleAgainstMotoSTS(t *testing.T) {
	front := awsfront.StartT(t, awsfront.Config{})
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *assumeEnv)
	}{
		{"a run's session signs its requests", testAssumeSessionSigns},
		{"each run has its own session", testAssumeEachRunItsOwn},
		{"a new attempt mints a new session", testAssumeNewAttemptNewSession},
		{"a session is renewed before it ends", testAssumeRenewal},
		{"a role STS refuses refuses the registration", testAssumeRefusedRole},
		{"a refused registration holds no session", testAssumeRefusedRegistrationHoldsNoSession},
		{"answers never hold the session's credentials", testAssumeAnswersScrubbed},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newAssumeEnv(t, front)) })
	}
}

// assumeEnv is a proxy whose policy holds two aws keys naming a role:
// ROLE, the role edge's identity may assume (reaching STS at the front and
// the echoing S3), and REFUSED, a role it may not. Config.AWSSessions
// calls the front's STS with edge's identity, on a fake clock of its own
// (the proxy judges the task's signatures by the real one).
type assumeEnv struct {
	*env
	front    *awsfront.Front
	echo     *testUpstream
	clk      *clock.Fake
	sessions *stssession.Sessions
	// sts and s3 are host:port of the two names.
	sts, s3     string
	refusedRole string
	// runs and placeholders are what the test used, for the leak checks.
	runs         []string
	placeholders []string
}

func newAssumeEnv(t *testing.T, front *awsfront.Front) *assumeEnv {
	t.Helper()
	_, frontPort, err := net.SplitHostPort(front.Addr)
	must(t, err)
	echo := startUpstream(t, front.CA, false, assumeS3Name)
	echo.mu.Lock()
	echo.handler = assumeEchoSignature
	echo.mu.Unlock()
	a := &assumeEnv{
		front: front, echo: echo,
		sts: assumeSTSName + ":" + frontPort, s3: assumeS3Name + ":" + itoa(echo.port),
		refusedRole: "arn:aws:iam::" + front.Identity.AccountID + ":role/runfleet-not-for-edge",
	}
	keys := fmt.Sprintf(`{"acme": {"keys": {
		"ROLE": {"kind": "aws", "domains": [%q, %q], "aws": {"regions": ["us-east-1"], "services": ["sts", "s3"],
			"assumeRole": {"roleArn": %q, "duration": "1h"}}},
		"REFUSED": {"kind": "aws", "domains": [%q], "aws": {"regions": ["us-east-1"], "services": ["sts"], "envPrefix": "REFUSED_AWS_",
			"assumeRole": {"roleArn": %q}}}}}}`, a.sts, a.s3, front.Identity.RoleARN, a.sts, a.refusedRole)
	a.env = newEnv(t, envOptions{uca: front.CA, keys: keys, secrets: map[string]string{},
		pins: map[string]string{assumeSTSName: "127.0.0.1", assumeS3Name: "127.0.0.1"}})
	a.clk = clock.NewFake(time.Now())
	a.sessions = stssession.New(stssession.NewClient(front.AWSConfig(credentials.StaticCredentialsProvider{Value: front.Identity.Edge})), a.clk)
	// newEnv has no option for it; nothing has read it yet (nothing is
	// registered), and every request comes after this write.
	a.proxy.cfg.AWSSessions = a.sessions
	t.Cleanup(func() { a.assertNothingLeaked(t) })
	return a
}

// admit registers runID with the declared keys (the host's admission), and
// starts its attempt; it returns the proxy URL and the task's variables.
func (a *assumeEnv) admit(t *testing.T, runID string, keys ...string) (*url.URL, map[string]string) {
	t.Helper()
	a.runs = append(a.runs, runID)
	must(t, a.proxy.Register(runID, a.declareKeys(t, keys...)))
	u, err := a.proxy.StartAttempt(runID)
	must(t, err)
	return u, a.vars(t, runID)
}

func (a *assumeEnv) declareKeys(t *testing.T, keys ...string) []runspec.Declared {
	t.Helper()
	var declared []runspec.Secret
	for _, k := range keys {
		declared = append(declared, runspec.Secret{ProjectID: "acme", Key: k})
	}
	return a.declare(declared...)
}

// vars is the task's environment from TaskKeys.
func (a *assumeEnv) vars(t *testing.T, runID string) map[string]string {
	t.Helper()
	keys, err := a.proxy.TaskKeys(runID)
	must(t, err)
	out := map[string]string{}
	for _, k := range keys {
		out[k.Var] = k.Placeholder
		a.placeholders = append(a.placeholders, k.Placeholder)
	}
	return out
}

// assumeTaskCreds are the task's placeholder credentials.
func assumeTaskCreds(vars map[string]string) aws.Credentials {
	return aws.Credentials{AccessKeyID: vars["AWS_ACCESS_KEY_ID"], SecretAccessKey: vars["AWS_SECRET_ACCESS_KEY"], SessionToken: vars["AWS_SESSION_TOKEN"]}
}

// whoAmI is the task's GetCallerIdentity, by the SDK with its placeholders
// through the proxy to STS at the front; it returns the ARN and what the
// front saw meanwhile.
func (a *assumeEnv) whoAmI(t *testing.T, proxyURL *url.URL, vars map[string]string) (string, []awsfront.Record) {
	t.Helper()
	mark := len(a.front.Records())
	c := sts.NewFromConfig(aws.Config{
		Region: "us-east-1", Credentials: credentials.StaticCredentialsProvider{Value: assumeTaskCreds(vars)},
		HTTPClient: a.goClient(proxyURL, false), RetryMaxAttempts: 1,
	}, func(o *sts.Options) { o.BaseEndpoint = aws.String("https://" + a.sts) })
	out, err := c.GetCallerIdentity(context.Background(), &sts.GetCallerIdentityInput{})
	if err != nil {
		t.Fatalf("the task's GetCallerIdentity: %v", err)
	}
	return aws.ToString(out.Arn), a.front.Records()[mark:]
}

// assumedARN is the ARN of runID's session of the role.
func (a *assumeEnv) assumedARN(runID string) string {
	return "arn:aws:sts::" + a.front.Identity.AccountID + ":assumed-role/" + awsfront.RoleName + "/" + stssession.SessionName(runID)
}

// assumeRoleCalls are the front's records of edge's own STS calls.
func (a *assumeEnv) assumeRoleCalls(recs []awsfront.Record) []awsfront.Record {
	var out []awsfront.Record
	for _, r := range recs {
		if r.AccessKeyID == a.front.Identity.Edge.AccessKeyID {
			out = append(out, r)
		}
	}
	return out
}

// taskCall is the one record in recs that is not edge's own call: the
// task's request as it reached the front. It must be signed with a
// session's key (ASIA) and carry a token (moto checked it is the key's).
func (a *assumeEnv) taskCall(t *testing.T, recs []awsfront.Record) awsfront.Record {
	t.Helper()
	var out []awsfront.Record
	for _, r := range recs {
		if r.AccessKeyID != a.front.Identity.Edge.AccessKeyID {
			out = append(out, r)
		}
	}
	if len(out) != 1 {
		t.Fatalf("the front saw %d requests of the task, want 1: %+v", len(out), out)
	}
	r := out[0]
	if !strings.HasPrefix(r.AccessKeyID, "ASIA") || !r.SecurityToken || r.Status != http.StatusOK || r.Upstream != awsfront.Answered {
		t.Fatalf("the task's request reached the front as %+v", r)
	}
	return r
}

// motoSessions are the sessions moto minted for runID (its sts
// AssumedRole model, read from /moto-api/data.json), oldest first.
func (a *assumeEnv) motoSessions(t *testing.T, runID string) []assumeMotoSession {
	t.Helper()
	resp, err := (&http.Client{Transport: &http.Transport{}, Timeout: 20 * time.Second}).Get(a.front.Moto.URL + "/moto-api/data.json")
	must(t, err)
	defer resp.Body.Close()
	var all map[string]map[string][]assumeMotoSession
	must(t, json.NewDecoder(resp.Body).Decode(&all))
	var out []assumeMotoSession
	for _, s := range all["sts"]["AssumedRole"] {
		if s.SessionName == stssession.SessionName(runID) {
			out = append(out, s)
		}
	}
	return out
}

type assumeMotoSession struct {
	SessionName     string `json:"session_name"`
	AccessKeyID     string `json:"access_key_id"`
	SecretAccessKey string `json:"secret_access_key"`
	SessionToken    string `json:"session_token"`
}

// assertNothingLeaked: no session credential of any run the test used,
// nor edge's own secret or the placeholders' secrets, reached edge's log
// or audit, and the front never saw a placeholder.
func (a *assumeEnv) assertNothingLeaked(t *testing.T) {
	t.Helper()
	values := []string{a.front.Identity.Edge.SecretAccessKey, a.front.Identity.Real.SecretAccessKey}
	for _, runID := range a.runs {
		for _, s := range a.motoSessions(t, runID) {
			values = append(values, s.AccessKeyID, s.SecretAccessKey, s.SessionToken)
		}
	}
	a.assertNoLeak(values...)
	for _, r := range a.front.Records() {
		for _, ph := range a.placeholders {
			if r.AccessKeyID == ph || strings.Contains(r.RawQuery, ph) {
				t.Errorf("the front saw a placeholder: %+v", r)
			}
		}
	}
}

// Register mints the run's session (one AssumeRole with edge's key), the
// task gets temporary-shaped placeholders, and its SDK's call through the
// proxy reaches STS signed with the session's key and token, as the
// role's session named after the run.
func testAssumeSessionSigns(t *testing.T, a *assumeEnv) {
	runID := motoserver.Unique("assume-")
	mark := len(a.front.Records())
	proxyURL, vars := a.admit(t, runID, "ROLE")
	if calls := a.assumeRoleCalls(a.front.Records()[mark:]); len(calls) != 1 || calls[0].Status != http.StatusOK {
		t.Fatalf("registration made edge's STS calls %+v, want one AssumeRole", calls)
	}
	if a.sessions.Len() != 1 {
		t.Fatalf("%d sessions held after one registration", a.sessions.Len())
	}
	if id, tok := vars["AWS_ACCESS_KEY_ID"], vars["AWS_SESSION_TOKEN"]; !awsTempIDPattern.MatchString(id) || !awsTokenPattern.MatchString(tok) || !awsSecretPattern.MatchString(vars["AWS_SECRET_ACCESS_KEY"]) {
		t.Fatalf("the task's variables are not temporary credentials' placeholders: %q, token %d chars", id, len(tok))
	}
	minted := a.motoSessions(t, runID)
	if len(minted) != 1 {
		t.Fatalf("moto minted %d sessions for the run, want 1", len(minted))
	}

	arn, recs := a.whoAmI(t, proxyURL, vars)
	if want := a.assumedARN(runID); arn != want {
		t.Errorf("the task is %s, want %s", arn, want)
	}
	if len(a.assumeRoleCalls(recs)) != 0 {
		t.Errorf("a request within the session's life called AssumeRole again")
	}
	if r := a.taskCall(t, recs); r.AccessKeyID != minted[0].AccessKeyID {
		t.Errorf("the front saw key %s, want the session's %s", r.AccessKeyID, minted[0].AccessKeyID)
	}
	// The task never held them: its variables are none of the session's.
	for _, v := range vars {
		if v == minted[0].AccessKeyID || v == minted[0].SecretAccessKey || v == minted[0].SessionToken {
			t.Errorf("the task's environment holds a credential of the session")
		}
	}
}

// A second run gets a session of its own: named after it, with its own key.
func testAssumeEachRunItsOwn(t *testing.T, a *assumeEnv) {
	run1, run2 := motoserver.Unique("assume-"), motoserver.Unique("assume-")
	u1, v1 := a.admit(t, run1, "ROLE")
	u2, v2 := a.admit(t, run2, "ROLE")
	if v1["AWS_ACCESS_KEY_ID"] == v2["AWS_ACCESS_KEY_ID"] {
		t.Fatal("two runs got one placeholder")
	}
	arn1, recs1 := a.whoAmI(t, u1, v1)
	arn2, recs2 := a.whoAmI(t, u2, v2)
	if arn1 != a.assumedARN(run1) || arn2 != a.assumedARN(run2) {
		t.Errorf("the runs are %s and %s, want %s and %s", arn1, arn2, a.assumedARN(run1), a.assumedARN(run2))
	}
	if k1, k2 := a.taskCall(t, recs1).AccessKeyID, a.taskCall(t, recs2).AccessKeyID; k1 == k2 {
		t.Errorf("both runs were signed with %s", k1)
	}
	if a.sessions.Len() != 2 {
		t.Errorf("%d sessions held for two runs", a.sessions.Len())
	}
}

// EndAttempt forgets the run's session; the retry's registration mints a
// new one (the front sees another AssumeRole and then a new key), and the
// task keeps its placeholders.
func testAssumeNewAttemptNewSession(t *testing.T, a *assumeEnv) {
	runID := motoserver.Unique("assume-")
	u, vars := a.admit(t, runID, "ROLE")
	_, recs := a.whoAmI(t, u, vars)
	first := a.taskCall(t, recs).AccessKeyID

	a.proxy.EndAttempt(runID)
	if a.sessions.Len() != 0 {
		t.Fatalf("%d sessions held after the attempt ended", a.sessions.Len())
	}
	mark := len(a.front.Records())
	u2, vars2 := a.admit(t, runID, "ROLE")
	if calls := a.assumeRoleCalls(a.front.Records()[mark:]); len(calls) != 1 {
		t.Fatalf("the retry's registration made %d AssumeRole calls, want 1", len(calls))
	}
	if assumeTaskCreds(vars2) != assumeTaskCreds(vars) {
		t.Error("the retry got other placeholders")
	}
	if u2.String() == u.String() {
		t.Error("the retry got the first attempt's proxy credential")
	}
	arn, recs := a.whoAmI(t, u2, vars2)
	if arn != a.assumedARN(runID) {
		t.Errorf("the retry is %s", arn)
	}
	second := a.taskCall(t, recs).AccessKeyID
	if second == first {
		t.Errorf("the retry was signed with the first attempt's session %s", first)
	}
	if minted := a.motoSessions(t, runID); len(minted) != 2 || minted[0].AccessKeyID != first || minted[1].AccessKeyID != second {
		t.Errorf("moto minted %d sessions for the run, want its two attempts' (%s then %s)", len(minted), first, second)
	}
}

// Once the sessions' clock reaches the session's end less RefreshBefore,
// the next request renews it (one AssumeRole) and is signed with the new
// session; before that point none is.
func testAssumeRenewal(t *testing.T, a *assumeEnv) {
	runID := motoserver.Unique("assume-")
	u, vars := a.admit(t, runID, "ROLE")
	// The session as held (no call: it is far from its end).
	held, err := a.sessions.Get(context.Background(), runID, policy.KeyRef{Project: "acme", Key: "ROLE"}, policy.AssumeRole{RoleARN: a.front.Identity.RoleARN, Duration: time.Hour})
	must(t, err)
	if d := held.Expires.Sub(a.clk.Now()); d < 55*time.Minute || d > 61*time.Minute {
		t.Fatalf("the session ends %s after the sessions' clock, want about 1h (duration)", d)
	}
	refresh := held.Expires.Add(-stssession.RefreshBefore)

	a.clk.Set(refresh.Add(-time.Second))
	_, recs := a.whoAmI(t, u, vars)
	if calls := a.assumeRoleCalls(recs); len(calls) != 0 {
		t.Fatalf("a request a second before the refresh point made %d AssumeRole calls", len(calls))
	}
	first := a.taskCall(t, recs).AccessKeyID
	if first != held.AccessKeyID.Reveal() {
		t.Fatalf("signed with %s, not the held session", first)
	}

	a.clk.Set(refresh)
	arn, recs := a.whoAmI(t, u, vars)
	if calls := a.assumeRoleCalls(recs); len(calls) != 1 || calls[0].Status != http.StatusOK {
		t.Fatalf("the request at the refresh point made edge's STS calls %+v, want one AssumeRole", calls)
	}
	renewed := a.taskCall(t, recs).AccessKeyID
	if renewed == first {
		t.Errorf("after the renewal the request was signed with the old session %s", first)
	}
	if arn != a.assumedARN(runID) {
		t.Errorf("the renewed session is %s", arn)
	}
	if a.sessions.Len() != 1 {
		t.Errorf("%d sessions held after a renewal", a.sessions.Len())
	}
}

// A role edge may not assume: Register fails with an error naming the key
// and the role (the host's broker_not_ready, not key_not_granted), holding
// no credential, and registers nothing: no task, no placeholder, no
// session.
func testAssumeRefusedRole(t *testing.T, a *assumeEnv) {
	runID := motoserver.Unique("refused-")
	mark := len(a.front.Records())
	err := a.proxy.Register(runID, a.declareKeys(t, "REFUSED"))
	if err == nil {
		t.Fatal("Register of a key whose role edge may not assume succeeded")
	}
	msg := err.Error()
	if !strings.Contains(msg, a.refusedRole) || !strings.Contains(msg, "acme/REFUSED") || !strings.Contains(msg, "AccessDenied") {
		t.Errorf("the error does not name the key, the role and STS's refusal: %s", msg)
	}
	var notGranted *policy.NotGrantedError
	if errors.As(err, &notGranted) {
		t.Errorf("the error is a key_not_granted refusal: %v", err)
	}
	for _, c := range []aws.Credentials{a.front.Identity.Edge, a.front.Identity.Real} {
		if strings.Contains(msg, c.AccessKeyID) || strings.Contains(msg, c.SecretAccessKey) {
			t.Errorf("the error holds a credential of edge's: %s", msg)
		}
	}
	if calls := a.assumeRoleCalls(a.front.Records()[mark:]); len(calls) != 1 || calls[0].Status != http.StatusForbidden {
		t.Errorf("edge's STS calls: %+v, want one refused AssumeRole", calls)
	}
	a.assertNotRegistered(t, runID)
}

// A run declaring a key whose session is minted and one whose role STS
// refuses is refused as a whole, and the first key's session is not kept
// for the run that never registered (the host never ends an attempt it
// never started, so nothing else would drop it).
func testAssumeRefusedRegistrationHoldsNoSession(t *testing.T, a *assumeEnv) {
	runID := motoserver.Unique("refused-")
	a.runs = append(a.runs, runID)
	if err := a.proxy.Register(runID, a.declareKeys(t, "ROLE", "REFUSED")); err == nil {
		t.Fatal("Register with a refused role among its keys succeeded")
	}
	a.assertNotRegistered(t, runID)
}

// assertNotRegistered: the proxy holds nothing of runID.
func (a *assumeEnv) assertNotRegistered(t *testing.T, runID string) {
	t.Helper()
	if _, err := a.proxy.TaskKeys(runID); !errors.Is(err, ErrUnknownTask) {
		t.Errorf("TaskKeys of the refused run: %v, want ErrUnknownTask", err)
	}
	if _, err := a.proxy.StartAttempt(runID); !errors.Is(err, ErrUnknownTask) {
		t.Errorf("StartAttempt of the refused run: %v, want ErrUnknownTask", err)
	}
	a.proxy.reg.mu.Lock()
	_, held := a.proxy.reg.placeholders[runID]
	a.proxy.reg.mu.Unlock()
	for _, o := range *a.proxy.reg.aws.Load() {
		held = held || o.task == runID
	}
	if held {
		t.Error("the refused run has placeholders")
	}
	if _, err := os.Stat(filepath.Join(a.dir, "secrets-proxy", "placeholders", runID+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused run's placeholders are on disk (%v)", err)
	}
	if a.sessions.Len() != 0 {
		t.Errorf("%d sessions held for a run that was refused", a.sessions.Len())
	}
}

// An upstream that echoes what a request was signed with (AWS's
// SignatureDoesNotMatch names the access key id; this one adds the token)
// answers the task with its placeholders, never the session's
// credentials, while it did get the session's. moto's own refusal of a
// call with the session says no more than the role and the run.
func testAssumeAnswersScrubbed(t *testing.T, a *assumeEnv) {
	runID := motoserver.Unique("assume-")
	u, vars := a.admit(t, runID, "ROLE")
	minted := a.motoSessions(t, runID)
	if len(minted) != 1 {
		t.Fatalf("moto minted %d sessions for the run", len(minted))
	}
	real := minted[0]

	empty := sha256.Sum256(nil)
	emptyHash := hex.EncodeToString(empty[:])
	req, err := http.NewRequest(http.MethodGet, "https://"+a.s3+"/acme-reports/q1.csv", nil)
	must(t, err)
	req.Header.Set("X-Amz-Content-Sha256", emptyHash)
	must(t, v4.NewSigner().SignHTTP(context.Background(), assumeTaskCreds(vars), req, emptyHash, "s3", "us-east-1", time.Now()))
	resp, err := a.goClient(u, false).Do(req)
	must(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	must(t, err)
	answer := string(body)
	for k, vs := range resp.Header {
		answer += "\n" + k + ": " + strings.Join(vs, ", ")
	}
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("the echoing upstream's answer: %d %s", resp.StatusCode, answer)
	}
	got := a.echo.requests()
	if len(got) != 1 || !strings.Contains(got[0].Header.Get("Authorization"), "Credential="+real.AccessKeyID+"/") || got[0].Header.Get("X-Amz-Security-Token") != real.SessionToken {
		t.Fatalf("the echoing upstream was not sent the session's key and token: %d requests", len(got))
	}
	for name, v := range map[string]string{"access key id": real.AccessKeyID, "session token": real.SessionToken, "secret": real.SecretAccessKey} {
		if strings.Contains(answer, v) {
			t.Errorf("the task's answer holds the session's %s", name)
		}
	}
	if !strings.Contains(answer, "<AWSAccessKeyId>"+vars["AWS_ACCESS_KEY_ID"]+"</AWSAccessKeyId>") || !strings.Contains(answer, "<SecurityToken>"+vars["AWS_SESSION_TOKEN"]+"</SecurityToken>") {
		t.Errorf("the echoed key id and token are not the task's placeholders: %s", answer)
	}

	// moto refuses the session sts:AssumeRole of the role (its trust names
	// edge's user only); what the task reads of it names no credential.
	c := sts.NewFromConfig(aws.Config{
		Region: "us-east-1", Credentials: credentials.StaticCredentialsProvider{Value: assumeTaskCreds(vars)},
		HTTPClient: a.goClient(u, false), RetryMaxAttempts: 1,
	}, func(o *sts.Options) { o.BaseEndpoint = aws.String("https://" + a.sts) })
	_, err = c.AssumeRole(context.Background(), &sts.AssumeRoleInput{RoleArn: aws.String(a.front.Identity.RoleARN), RoleSessionName: aws.String("nested")})
	if err == nil || !strings.Contains(err.Error(), "AccessDenied") || !strings.Contains(err.Error(), stssession.SessionName(runID)) {
		t.Fatalf("the session's own AssumeRole: %v", err)
	}
	for _, v := range []string{real.AccessKeyID, real.SecretAccessKey, real.SessionToken} {
		if strings.Contains(err.Error(), v) {
			t.Errorf("moto's refusal, as the task read it, holds a credential of the session: %v", err)
		}
	}
}

// assumeEchoSignature answers as S3's SignatureDoesNotMatch, naming the
// access key id the request was signed with and its string to sign, and
// (beyond what S3 says) its session token, in the body and a header.
func assumeEchoSignature(w http.ResponseWriter, r *http.Request) {
	auth := r.Header.Get("Authorization")
	id := ""
	if _, rest, ok := strings.Cut(auth, "Credential="); ok {
		id, _, _ = strings.Cut(rest, "/")
	}
	token := r.Header.Get("X-Amz-Security-Token")
	w.Header().Set("Content-Type", "application/xml")
	w.Header().Set("X-Echo-Authorization", auth)
	w.WriteHeader(http.StatusForbidden)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>SignatureDoesNotMatch</Code><Message>The request signature we calculated does not match the signature you provided.</Message><AWSAccessKeyId>%s</AWSAccessKeyId><SecurityToken>%s</SecurityToken><Authorization>%s</Authorization><RequestId>echo</RequestId></Error>`, id, token, auth)
}
