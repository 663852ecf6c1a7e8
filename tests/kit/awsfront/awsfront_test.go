package awsfront

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/smithy-go"

	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

// front is shared by the tests of this file: one moto with its bootstrap.
// Tests keep to their own buckets (motoserver.Unique) and, since they move
// the shared clock or read the shared records, do not run in parallel.
var (
	front *Front
	clock testClock
)

func TestMain(m *testing.M) {
	os.Exit(Run(m, Config{Now: clock.Now}, func(f *Front) { front = f }))
}

func static(c aws.Credentials) aws.CredentialsProvider {
	return credentials.StaticCredentialsProvider{Value: c}
}

func s3Client(c aws.Credentials) *s3.Client { return s3.NewFromConfig(front.AWSConfig(static(c))) }

// newBucket creates a bucket of the test's own with the real key.
func newBucket(t *testing.T) string {
	t.Helper()
	b := motoserver.Unique("awsfront-")
	if _, err := s3Client(front.Identity.Real).CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(b)}); err != nil {
		t.Fatalf("CreateBucket: %v", err)
	}
	return b
}

// objectSHA256 reads an object back through the front with the real key;
// "" when there is no such object.
func objectSHA256(t *testing.T, bucket, key string) string {
	t.Helper()
	out, err := s3Client(front.Identity.Real).GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	var noKey *s3types.NoSuchKey
	if errors.As(err, &noKey) {
		return ""
	}
	if err != nil {
		t.Fatalf("GetObject %s/%s: %v", bucket, key, err)
	}
	defer out.Body.Close()
	h := sha256.New()
	if _, err := io.Copy(h, out.Body); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// apiCode is the AWS error code of err, "" if none.
func apiCode(err error) string {
	var api smithy.APIError
	if errors.As(err, &api) {
		return api.ErrorCode()
	}
	return ""
}

// lastRecord is the front's last record for path (escaped, as sent).
func lastRecord(t *testing.T, method, path string) Record {
	t.Helper()
	recs := front.Records()
	for i := len(recs) - 1; i >= 0; i-- {
		if recs[i].Method == method && recs[i].Path == path {
			return recs[i]
		}
	}
	t.Fatalf("the front saw no %s %s", method, path)
	return Record{}
}

// s3Answer is a response's status and S3 error code.
func s3Answer(t *testing.T, resp *http.Response) (int, string) {
	t.Helper()
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	code := ""
	if i := bytes.Index(body, []byte("<Code>")); i >= 0 {
		rest := body[i+len("<Code>"):]
		code = string(rest[:bytes.Index(rest, []byte("<"))])
	}
	return resp.StatusCode, code
}

// TestMotoRefusesAWrongSecret: after the bootstrap moto checks header
// signatures itself; the front forwards them untouched.
func TestMotoRefusesAWrongSecret(t *testing.T) {
	ctx := context.Background()
	wrong := front.Identity.Real
	wrong.SecretAccessKey = "x" + wrong.SecretAccessKey[1:]

	_, err := sts.NewFromConfig(front.AWSConfig(static(wrong))).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if apiCode(err) != "SignatureDoesNotMatch" {
		t.Fatalf("GetCallerIdentity with a wrong secret: %v", err)
	}
	if r := lastRecord(t, "POST", "/"); r.Upstream != Answered || r.Status != http.StatusForbidden || r.FrontChecked || r.AccessKeyID != wrong.AccessKeyID {
		t.Fatalf("record of the refused call: %+v", r)
	}

	out, err := sts.NewFromConfig(front.AWSConfig(static(front.Identity.Real))).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if err != nil {
		t.Fatalf("GetCallerIdentity with the real secret: %v", err)
	}
	if aws.ToString(out.Arn) != front.Identity.RealUserARN || aws.ToString(out.Account) != front.Identity.AccountID {
		t.Fatalf("caller %s in %s", aws.ToString(out.Arn), aws.ToString(out.Account))
	}

	// S3 checks the same way (moto's S3IAMRequest).
	_, err = s3Client(wrong).ListBuckets(ctx, &s3.ListBucketsInput{})
	if apiCode(err) != "SignatureDoesNotMatch" {
		t.Fatalf("ListBuckets with a wrong secret: %v", err)
	}
	unknown := aws.Credentials{AccessKeyID: "AKIAPLACEHOLDER00000", SecretAccessKey: "placeholder"}
	if _, err = s3Client(unknown).ListBuckets(ctx, &s3.ListBucketsInput{}); apiCode(err) != "InvalidAccessKeyId" {
		t.Fatalf("ListBuckets with a key moto did not issue: %v", err)
	}
}

// TestStreamingUploadLands: a good aws-chunked upload, in each streaming
// mode, passes the front's checks and lands in moto as the data sent.
func TestStreamingUploadLands(t *testing.T) {
	bucket := newBucket(t)
	for i, c := range []chunked{
		{mode: streamingSigned},
		{mode: streamingSignedTrailer, checksum: true},
		{mode: streamingUnsignedTrailer, checksum: true},
		{mode: streamingUnsignedTrailer, checksum: true, unknownLength: true},
	} {
		c.size, c.chunk, c.seed = 300<<10+5, 64<<10, byte(i)
		name := c.mode
		if c.unknownLength {
			name += "+transfer-encoding-chunked"
		}
		key := "streamed-" + strings.ToLower(name)
		t.Run(name, func(t *testing.T) {
			req := c.request(t, "https://"+bucket+".s3.us-east-1.amazonaws.com/"+key, front.Identity.Real, clock.Now())
			resp, err := front.HTTPClient().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if status, code := s3Answer(t, resp); status != http.StatusOK {
				t.Fatalf("upload: %d %s", status, code)
			}
			r := lastRecord(t, "PUT", "/"+key)
			if !r.FrontChecked || r.BodyBytes != c.size || r.Upstream != Answered || r.Payload != c.mode {
				t.Fatalf("record: %+v", r)
			}
			if got, want := objectSHA256(t, bucket, key), patternSHA256(c.seed, c.size); got != want {
				t.Fatalf("object in moto has SHA-256 %s, sent %s", got, want)
			}
		})
	}
}

// TestTamperedStreamingIsRefused: a chunk, a trailer signature or a
// checksum that fails is answered with S3's error by the front; moto never
// hears of the request (the body is within Precheck) and nothing lands.
func TestTamperedStreamingIsRefused(t *testing.T) {
	bucket := newBucket(t)
	for _, tc := range []struct {
		name   string
		c      chunked
		status int
		code   string
	}{
		{"chunk", chunked{mode: streamingSigned, tamper: 3}, 403, "SignatureDoesNotMatch"},
		{"chunk with trailer", chunked{mode: streamingSignedTrailer, checksum: true, tamper: 1}, 403, "SignatureDoesNotMatch"},
		{"trailer signature", chunked{mode: streamingSignedTrailer, checksum: true, badTrailerSig: true}, 403, "SignatureDoesNotMatch"},
		{"signed checksum", chunked{mode: streamingSignedTrailer, checksum: true, badChecksum: true}, 400, "BadDigest"},
		{"unsigned checksum", chunked{mode: streamingUnsignedTrailer, checksum: true, badChecksum: true}, 400, "BadDigest"},
		{"unsigned data", chunked{mode: streamingUnsignedTrailer, checksum: true, tamper: 2}, 400, "BadDigest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.c.size, tc.c.chunk, tc.c.seed = 200<<10, 64<<10, 9
			key := motoserver.Unique("tampered-")
			resp, err := front.HTTPClient().Do(tc.c.request(t, "https://"+bucket+".s3.us-east-1.amazonaws.com/"+key, front.Identity.Real, clock.Now()))
			if err != nil {
				t.Fatal(err)
			}
			if status, code := s3Answer(t, resp); status != tc.status || code != tc.code {
				t.Fatalf("got %d %s, want %d %s", status, code, tc.status, tc.code)
			}
			if r := lastRecord(t, "PUT", "/"+key); r.Upstream != NotForwarded || r.Refusal != tc.code || r.Status != tc.status {
				t.Fatalf("record: %+v", r)
			}
			if got := objectSHA256(t, bucket, key); got != "" {
				t.Fatal("the refused upload landed in moto")
			}
		})
	}
}

// TestTamperPastPrecheckCutsOff: a body longer than Precheck is already
// on its way to moto when a late chunk fails; the front cuts it off, moto
// never gets it whole, and nothing lands.
func TestTamperPastPrecheckCutsOff(t *testing.T) {
	bucket := newBucket(t)
	c := chunked{mode: streamingSigned, size: 3 << 20, chunk: 256 << 10, seed: 3, tamper: 12}
	key := motoserver.Unique("cut-")
	resp, err := front.HTTPClient().Do(c.request(t, "https://s3.us-east-1.amazonaws.com/"+bucket+"/"+key, front.Identity.Real, clock.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if status, code := s3Answer(t, resp); status != 403 || code != "SignatureDoesNotMatch" {
		t.Fatalf("got %d %s", status, code)
	}
	if r := lastRecord(t, "PUT", "/"+bucket+"/"+key); r.Upstream != CutOff || r.BodyBytes != 11*256<<10 {
		t.Fatalf("record: %+v", r)
	}
	if got := objectSHA256(t, bucket, key); got != "" {
		t.Fatal("the cut-off upload landed in moto")
	}
}

// TestLiteralDigestIsChecked: moto signs over x-amz-content-sha256 as
// given and never hashes the body; the front does.
func TestLiteralDigestIsChecked(t *testing.T) {
	bucket := newBucket(t)
	put := func(key string, body, signedBody []byte) (int, string) {
		req, err := http.NewRequest(http.MethodPut, "https://"+bucket+".s3.amazonaws.com/"+key, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		digest := sha256Hex(signedBody)
		req.Header.Set("X-Amz-Content-Sha256", digest)
		if err := v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true }).
			SignHTTP(context.Background(), front.Identity.Real, req, digest, "s3", Region, clock.Now()); err != nil {
			t.Fatal(err)
		}
		resp, err := front.HTTPClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return s3Answer(t, resp)
	}
	if status, code := put("good", []byte("the body"), []byte("the body")); status != 200 {
		t.Fatalf("good digest: %d %s", status, code)
	}
	if status, code := put("bad", []byte("the bodY"), []byte("the body")); status != 400 || code != "XAmzContentSHA256Mismatch" {
		t.Fatalf("changed body: %d %s", status, code)
	}
	if r := lastRecord(t, "PUT", "/bad"); r.Upstream != NotForwarded {
		t.Fatalf("record: %+v", r)
	}
	if objectSHA256(t, bucket, "bad") != "" {
		t.Fatal("a body that failed its digest landed")
	}
}

// TestPresigned: the front checks a presigned URL (signature, key, expiry
// by its clock) and moto gets the request re-signed in header form.
func TestPresigned(t *testing.T) {
	ctx := context.Background()
	bucket := newBucket(t)
	presign := s3.NewPresignClient(s3Client(front.Identity.Real))

	put, err := presign.PresignPutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("p/one two")})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPut, put.URL, strings.NewReader("presigned body"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := front.HTTPClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if status, code := s3Answer(t, resp); status != 200 {
		t.Fatalf("presigned PUT: %d %s", status, code)
	}

	get, err := presign.PresignGetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("p/one two")},
		s3.WithPresignExpires(15*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	fetch := func(url string) (int, string, string) {
		resp, err := front.HTTPClient().Get(url)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == 200 {
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return 200, "", string(b)
		}
		status, code := s3Answer(t, resp)
		return status, code, ""
	}
	if status, code, body := fetch(get.URL); status != 200 || body != "presigned body" {
		t.Fatalf("presigned GET: %d %s %q", status, code, body)
	}
	if r := lastRecord(t, "GET", "/p/one%20two"); r.Auth != AuthPresigned || !r.FrontChecked || r.Upstream != Answered || r.AccessKeyID != front.Identity.Real.AccessKeyID {
		t.Fatalf("record: %+v", r)
	}

	sig := get.URL[strings.Index(get.URL, "X-Amz-Signature=")+len("X-Amz-Signature="):][:64]
	forged := strings.Replace(get.URL, sig, strings.Repeat("0", 64), 1)
	if status, code, _ := fetch(forged); status != 403 || code != "SignatureDoesNotMatch" {
		t.Fatalf("forged signature: %d %s", status, code)
	}
	if r := lastRecord(t, "GET", "/p/one%20two"); r.Upstream != NotForwarded {
		t.Fatalf("a forged URL reached moto: %+v", r)
	}

	stranger, err := s3.NewPresignClient(s3Client(aws.Credentials{AccessKeyID: "AKIAPLACEHOLDER00000", SecretAccessKey: "placeholder"})).
		PresignGetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("p/one two")})
	if err != nil {
		t.Fatal(err)
	}
	if status, code, _ := fetch(stranger.URL); status != 403 || code != "InvalidAccessKeyId" {
		t.Fatalf("unknown key: %d %s", status, code)
	}

	clock.advance(t, 14*time.Minute)
	if status, code, _ := fetch(get.URL); status != 200 {
		t.Fatalf("before expiry: %d %s", status, code)
	}
	clock.advance(t, 2*time.Minute)
	if status, code, _ := fetch(get.URL); status != 403 || code != "AccessDenied" {
		t.Fatalf("after expiry: %d %s", status, code)
	}
	if r := lastRecord(t, "GET", "/p/one%20two"); r.Upstream != NotForwarded || r.Refusal != "AccessDenied" {
		t.Fatalf("an expired URL reached moto: %+v", r)
	}
}

// TestAssumeRole: edge's identity may only assume the role; the role's
// temporary credentials act in S3, and the front learns them from the STS
// answer, so a URL presigned with them checks too.
func TestAssumeRole(t *testing.T) {
	ctx := context.Background()
	bucket := newBucket(t)
	edge := front.AWSConfig(static(front.Identity.Edge))
	if _, err := s3.NewFromConfig(edge).PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("k"), Body: strings.NewReader("x")}); apiCode(err) != "AccessDenied" {
		t.Fatalf("PutObject as edge's own identity: %v", err)
	}
	out, err := sts.NewFromConfig(edge).AssumeRole(ctx, &sts.AssumeRoleInput{RoleArn: aws.String(front.Identity.RoleARN), RoleSessionName: aws.String("task")})
	if err != nil {
		t.Fatalf("AssumeRole: %v", err)
	}
	role := aws.Credentials{AccessKeyID: aws.ToString(out.Credentials.AccessKeyId), SecretAccessKey: aws.ToString(out.Credentials.SecretAccessKey), SessionToken: aws.ToString(out.Credentials.SessionToken)}
	if _, err := s3Client(role).PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("k"), Body: strings.NewReader("role")}); err != nil {
		t.Fatalf("PutObject with the role: %v", err)
	}
	if r := lastRecord(t, "PUT", "/k"); !r.SecurityToken || r.AccessKeyID != role.AccessKeyID {
		t.Fatalf("record: %+v", r)
	}
	get, err := s3.NewPresignClient(s3Client(role)).PresignGetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("k")})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := front.HTTPClient().Get(get.URL)
	if err != nil {
		t.Fatal(err)
	}
	if status, code := s3Answer(t, resp); status != 200 {
		t.Fatalf("GET presigned with the role's credentials: %d %s", status, code)
	}
	// A token that is not the key's is refused, as moto refuses it.
	bad := strings.Replace(get.URL, "X-Amz-Security-Token=", "X-Amz-Security-Token=x", 1)
	resp, err = front.HTTPClient().Get(bad)
	if err != nil {
		t.Fatal(err)
	}
	if status, code := s3Answer(t, resp); status != 400 || code != "InvalidToken" {
		t.Fatalf("another token: %d %s", status, code)
	}
}

// TestLargeBodiesStreamThroughMoto: 64 MiB up as signed aws-chunked and
// back down, whole and unchanged.
func TestLargeBodiesStreamThroughMoto(t *testing.T) {
	bucket := newBucket(t)
	c := chunked{mode: streamingSignedTrailer, checksum: true, size: 64 << 20, chunk: 1 << 20, seed: 64}
	resp, err := front.HTTPClient().Do(c.request(t, "https://"+bucket+".s3.us-east-1.amazonaws.com/big", front.Identity.Real, clock.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if status, code := s3Answer(t, resp); status != 200 {
		t.Fatalf("upload: %d %s", status, code)
	}
	if got, want := objectSHA256(t, bucket, "big"), patternSHA256(c.seed, c.size); got != want {
		t.Fatalf("64 MiB came back with SHA-256 %s, sent %s", got, want)
	}
}

// TestResolveAndNames: what edge is configured with covers what tests use.
func TestResolveAndNames(t *testing.T) {
	m := front.Resolve("mybucket.s3.us-east-1.amazonaws.com")
	ip := front.Addr[:strings.LastIndex(front.Addr, ":")]
	for _, n := range []string{"sts.amazonaws.com", "sts.us-east-1.amazonaws.com", "s3.us-east-1.amazonaws.com", "dynamodb.us-east-1.amazonaws.com", "mybucket.s3.us-east-1.amazonaws.com"} {
		if m[n] != ip {
			t.Errorf("Resolve()[%s] = %q, want %s", n, m[n], ip)
		}
	}
	for n := range m {
		if strings.Contains(n, "*") {
			t.Errorf("Resolve has the wildcard %s, which edge cannot pin", n)
		}
	}
	for n, want := range map[string]bool{
		"mybucket.s3.amazonaws.com": true, "s3.amazonaws.com": true, "a.b.s3.amazonaws.com": false,
		".s3.amazonaws.com": false, "sts.eu-west-1.amazonaws.com": false, "example.com": false,
	} {
		if front.Covers(n) != want {
			t.Errorf("Covers(%s) = %v", n, !want)
		}
	}
	pem, err := os.ReadFile(front.CAFile)
	if err != nil || !bytes.Equal(pem, front.CA.PEM) {
		t.Fatalf("CA file: %v", err)
	}
	if _, err := front.HTTPClient().Get("https://example.com/"); err == nil || !strings.Contains(err.Error(), "not a name the front answers") {
		t.Fatalf("HTTPClient dialled a name the front does not answer: %v", err)
	}
}

// TestMotoLeavesTheseChecksToTheFront pins the premise of the front: sent
// to moto 5.2.1 directly, a body that differs from its literal digest, a
// tampered chunk, and a bad trailer signature with a bad checksum all
// land, and a presigned URL answers 500. If a later moto checks one of
// these itself, this fails; the front's check may then stay (it is
// independent of moto) but the package comment should say so.
func TestMotoLeavesTheseChecksToTheFront(t *testing.T) {
	bucket := newBucket(t)
	direct := func(req *http.Request) int {
		t.Helper()
		req.Host = req.URL.Host
		req.URL.Scheme, req.URL.Host = front.motoURL.Scheme, front.motoURL.Host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		status, _ := s3Answer(t, resp)
		return status
	}
	signer := v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true })

	req, err := http.NewRequest(http.MethodPut, "https://"+bucket+".s3.amazonaws.com/digest", strings.NewReader("the bodY"))
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256Hex([]byte("the body"))
	req.Header.Set("X-Amz-Content-Sha256", digest)
	if err := signer.SignHTTP(context.Background(), front.Identity.Real, req, digest, "s3", Region, clock.Now()); err != nil {
		t.Fatal(err)
	}
	if status := direct(req); status != 200 || objectSHA256(t, bucket, "digest") == "" {
		t.Errorf("a body differing from its digest: moto answered %d", status)
	}

	for key, c := range map[string]chunked{
		"chunk":   {mode: streamingSigned, tamper: 2},
		"trailer": {mode: streamingSignedTrailer, checksum: true, badChecksum: true, badTrailerSig: true},
	} {
		c.size, c.chunk, c.seed = 200<<10, 64<<10, 1
		if status := direct(c.request(t, "https://"+bucket+".s3.us-east-1.amazonaws.com/"+key, front.Identity.Real, clock.Now())); status != 200 || objectSHA256(t, bucket, key) == "" {
			t.Errorf("%s: moto answered %d", key, status)
		}
	}

	req, err = http.NewRequest(http.MethodGet, "https://"+bucket+".s3.amazonaws.com/digest", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Amz-Expires", "900")
	url, _, err := signer.PresignHTTP(context.Background(), front.Identity.Real, req, unsignedPayload, "s3", Region, clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	if req, err = http.NewRequest(http.MethodGet, url, nil); err != nil {
		t.Fatal(err)
	}
	if status := direct(req); status != 500 {
		t.Errorf("presigned GET: moto answered %d", status)
	}
}

// TestKeysMotoMisreads: S3 keys and list queries whose URL moto reads
// differently from the client that signed it (motoview.go) work through
// the front, path style and virtual-hosted, header-signed and presigned;
// the front checked the client's signature and re-signed for moto.
func TestKeysMotoMisreads(t *testing.T) {
	ctx := context.Background()
	bucket := newBucket(t)
	keys := []string{"plain", "a b", "a+b", "a=b", "a%b", "ü/é", "a:b", "a,b", "a;b", "a'b", "a(b)", "a!b", "a*b", "a@b",
		"a$b", "a&b", "a//b", "a?b", "a#b", "a\"b", "a<b>", "a[b]", "a{b}", "a|b", "a^b", "a`b", "a\\b", "dir/sub/x"}
	for _, pathStyle := range []bool{false, true} {
		c := s3.NewFromConfig(front.AWSConfig(static(front.Identity.Real)), func(o *s3.Options) { o.UsePathStyle = pathStyle })
		presign := s3.NewPresignClient(c)
		for _, k := range keys {
			body := "body of " + k
			if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(k), Body: strings.NewReader(body)}); err != nil {
				t.Errorf("path style %v: PutObject %q: %v", pathStyle, k, err)
				continue
			}
			out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(k)})
			if err != nil {
				t.Errorf("path style %v: GetObject %q: %v", pathStyle, k, err)
				continue
			}
			got, _ := io.ReadAll(out.Body)
			out.Body.Close()
			if string(got) != body {
				t.Errorf("path style %v: %q holds %q", pathStyle, k, got)
			}
			url, err := presign.PresignGetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(k)})
			if err != nil {
				t.Fatal(err)
			}
			resp, err := front.HTTPClient().Get(url.URL)
			if err != nil {
				t.Fatal(err)
			}
			if status, code := s3Answer(t, resp); status != 200 {
				t.Errorf("path style %v: presigned GET %q: %d %s", pathStyle, k, status, code)
			}
		}
		for _, in := range []s3.ListObjectsV2Input{
			{Prefix: aws.String("dir/")},
			{Prefix: aws.String("dir/"), Delimiter: aws.String("/")},
			{Prefix: aws.String("a+"), Delimiter: aws.String("/")},
			{Prefix: aws.String("ü/")},
		} {
			in.Bucket = aws.String(bucket)
			out, err := c.ListObjectsV2(ctx, &in)
			if err != nil {
				t.Errorf("path style %v: ListObjectsV2 prefix %q delimiter %q: %v", pathStyle, aws.ToString(in.Prefix), aws.ToString(in.Delimiter), err)
				continue
			}
			if len(out.Contents)+len(out.CommonPrefixes) == 0 {
				t.Errorf("path style %v: ListObjectsV2 prefix %q delimiter %q: nothing listed", pathStyle, aws.ToString(in.Prefix), aws.ToString(in.Delimiter))
			}
		}
	}
	if r := lastRecord(t, "GET", "/"); !r.Resigned || !r.FrontChecked || r.Upstream != Answered {
		t.Fatalf("record of a list moto misreads: %+v", r)
	}
	if r := lastRecord(t, "PUT", "/a%2Bb"); !r.Resigned || r.Upstream != Answered {
		t.Fatalf("record of a key moto misreads: %+v", r)
	}
	// What moto reads right, moto checks: the client's own signature.
	if r := lastRecord(t, "PUT", "/a%20b"); r.Resigned {
		t.Fatalf("record of a key moto reads right: %+v", r)
	}
}
