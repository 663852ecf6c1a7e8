package awssig

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// aws-sdk-go-v2's signer is the oracle: a request it signs with the task's
// credentials must verify, and re-signing it must give what it gives
// signing the same request with the real credentials (the signed header
// sets agree, since the SDK signs every header it is given and the token
// follows the credentials on both sides).

var signTime = time.Date(2025, 3, 1, 12, 34, 56, 0, time.UTC)

type sdkCase struct {
	name, service, region string
	build                 func() *http.Request
	payloadHash           string // what the SDK is told
	task, real            aws.Credentials
}

func (c sdkCase) sdkOpts(o *v4.SignerOptions) {
	o.DisableURIPathEscaping = s3Family(c.service)
}

func toCreds(c aws.Credentials) Credentials {
	return Credentials{c.AccessKeyID, c.SecretAccessKey, c.SessionToken}
}

var (
	taskLongTerm = aws.Credentials{AccessKeyID: "AKIAPLACEHOLDER00009", SecretAccessKey: "pLaCeHoLdErLoNgTeRmpLaCeHoLdErLoNgTeRm00"}
	realLongTerm = aws.Credentials{AccessKeyID: "AKIAREALREALREAL0003", SecretAccessKey: "rEaLlOnGtErMrEaLlOnGtErMrEaLlOnGtErM0000"}
	realTemp     = aws.Credentials{AccessKeyID: realCreds.AccessKeyID, SecretAccessKey: realCreds.SecretAccessKey, SessionToken: realCreds.SessionToken}
)

func newReq(method, u, body string) *http.Request {
	var r *http.Request
	var err error
	if body == "" {
		r, err = http.NewRequest(method, u, nil)
	} else {
		r, err = http.NewRequest(method, u, strings.NewReader(body))
	}
	if err != nil {
		panic(err)
	}
	return r
}

var headerCases = []sdkCase{
	{
		name: "s3 GET literal hash, key needing escapes", service: "s3", region: "us-west-2",
		payloadHash: emptyHash, task: taskLongTerm, real: realTemp,
		build: func() *http.Request {
			r := newReq("GET", "https://examplebucket.s3.us-west-2.amazonaws.com/photos/2024/a%20b%2Bc~%C3%A9%3A.jpg?versionId=3%2FL4kqtJl%2Bx&x-id=GetObject&response-content-type=text%2Fplain%3B%20charset%3Dutf-8", "")
			r.Header.Set("Range", "bytes=0-9")
			r.Header.Set("X-Amz-Content-Sha256", emptyHash)
			return r
		},
	},
	{
		name: "s3 PUT unsigned payload", service: "s3", region: "eu-central-1",
		payloadHash: unsignedPayload, task: taskCreds, real: realLongTerm,
		build: func() *http.Request {
			r := newReq("PUT", "https://s3.eu-central-1.amazonaws.com/bucket/dir//x%2By.txt", "hello, world")
			r.Header.Set("Content-Type", "text/plain")
			r.Header.Set("X-Amz-Content-Sha256", unsignedPayload)
			r.Header.Set("X-Amz-Meta-Note", "  spaced   out  value ")
			r.Header.Add("X-Amz-Meta-Many", "one")
			r.Header.Add("X-Amz-Meta-Many", " two ")
			return r
		},
	},
	{
		name: "dynamodb POST JSON", service: "dynamodb", region: "us-east-1",
		payloadHash: tSHA([]byte(`{"TableName":"t","Key":{"id":{"S":"a b"}}}`)), task: taskCreds, real: realTemp,
		build: func() *http.Request {
			r := newReq("POST", "https://dynamodb.us-east-1.amazonaws.com/", `{"TableName":"t","Key":{"id":{"S":"a b"}}}`)
			r.Header.Set("Content-Type", "application/x-amz-json-1.0")
			r.Header.Set("X-Amz-Target", "DynamoDB_20120810.GetItem")
			return r
		},
	},
	{
		name: "sts POST form", service: "sts", region: "us-east-1",
		payloadHash: tSHA([]byte("Action=GetCallerIdentity&Version=2011-06-15")), task: taskLongTerm, real: realLongTerm,
		build: func() *http.Request {
			r := newReq("POST", "https://sts.amazonaws.com/", "Action=GetCallerIdentity&Version=2011-06-15")
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
			return r
		},
	},
	{
		name: "execute-api path and query needing encoding", service: "execute-api", region: "ap-southeast-2",
		payloadHash: emptyHash, task: taskCreds, real: realTemp,
		build: func() *http.Request {
			r := newReq("GET", "https://abc123.execute-api.ap-southeast-2.amazonaws.com/prod/items/a%20b%3Ac/caf%C3%A9/%2Fslash/~x?b=2&a=x+y&a=%2F&empty=&flag&sp%20ace=%21%2A%27%28%29", "")
			r.Header.Add("X-Custom", "first")
			r.Header.Add("X-Custom", "second  value")
			return r
		},
	},
}

func TestSDKHeaderSignatures(t *testing.T) {
	for _, c := range headerCases {
		t.Run(c.name, func(t *testing.T) {
			r := c.build()
			if err := v4.NewSigner().SignHTTP(context.Background(), c.task, r, c.payloadHash, c.service, c.region, signTime, c.sdkOpts); err != nil {
				t.Fatal(err)
			}
			sr := onWire(t, r)
			body, _ := io.ReadAll(sr.Body)
			bodyHash := tSHA(body)

			sig := mustParse(t, sr)
			if sig.Presigned || sig.AccessKeyID != c.task.AccessKeyID || sig.Service != c.service || sig.Region != c.region || !sig.Time.Equal(signTime) {
				t.Fatalf("parsed %+v", sig)
			}
			if err := Verify(sr, sig, "another secret entirely, forty chars....", bodyHash); !errors.Is(err, ErrMismatch) {
				t.Fatalf("other secret: %v", err)
			}
			if _, err := Resign(sr, sig, toCreds(c.real), bodyHash); !errors.Is(err, ErrNotVerified) {
				t.Fatalf("Resign after a failed Verify: %v", err)
			}
			if err := Verify(sr, sig, c.task.SecretAccessKey, bodyHash); err != nil {
				t.Fatalf("task secret: %v", err)
			}
			seed, err := Resign(sr, sig, toCreds(c.real), bodyHash)
			if err != nil {
				t.Fatal(err)
			}

			want := c.build()
			if err := v4.NewSigner().SignHTTP(context.Background(), c.real, want, c.payloadHash, c.service, c.region, signTime, c.sdkOpts); err != nil {
				t.Fatal(err)
			}
			if got, w := sr.Header.Get("Authorization"), want.Header.Get("Authorization"); got != w {
				t.Fatalf("Authorization\n got %s\nwant %s", got, w)
			}
			if got, w := sr.Header.Values("X-Amz-Security-Token"), want.Header.Values("X-Amz-Security-Token"); strings.Join(got, ",") != strings.Join(w, ",") {
				t.Fatalf("token header %d values, want %d", len(got), len(w))
			}
			if !strings.HasSuffix(sr.Header.Get("Authorization"), "Signature="+seed) {
				t.Fatal("seed is not the new signature")
			}
			// And the package's own Verify accepts it with the real secret.
			sig2 := mustParse(t, sr)
			if err := Verify(sr, sig2, c.real.SecretAccessKey, bodyHash); err != nil {
				t.Fatalf("re-signed: %v", err)
			}
		})
	}
}

// TestSignedHeaderTamper: changing a signed header fails, an unsigned one
// does not; a missing body hash where one is needed is named.
func TestSignedHeaderTamper(t *testing.T) {
	c := headerCases[0]
	r := c.build()
	if err := v4.NewSigner().SignHTTP(context.Background(), c.task, r, c.payloadHash, c.service, c.region, signTime, c.sdkOpts); err != nil {
		t.Fatal(err)
	}
	sr := onWire(t, r)
	sig := mustParse(t, sr)
	sr.Header.Set("User-Agent", "something else")
	if err := Verify(sr, sig, c.task.SecretAccessKey, ""); err != nil {
		t.Fatalf("unsigned header changed: %v", err)
	}
	sr.Header.Set("Range", "bytes=0-99")
	if err := Verify(sr, sig, c.task.SecretAccessKey, ""); !errors.Is(err, ErrMismatch) {
		t.Fatalf("signed header changed: %v", err)
	}
	sr.Header.Set("Range", "bytes=0-9")
	sr.URL.RawQuery += "&extra=1"
	if err := Verify(sr, sig, c.task.SecretAccessKey, ""); !errors.Is(err, ErrMismatch) {
		t.Fatalf("query changed: %v", err)
	}

	d := headerCases[2] // dynamodb: no x-amz-content-sha256
	r = d.build()
	if err := v4.NewSigner().SignHTTP(context.Background(), d.task, r, d.payloadHash, d.service, d.region, signTime); err != nil {
		t.Fatal(err)
	}
	sr = onWire(t, r)
	sig = mustParse(t, sr)
	var me *MalformedError
	if err := Verify(sr, sig, d.task.SecretAccessKey, ""); !errors.As(err, &me) || me.Reason != "payload_hash_malformed" {
		t.Fatalf("no body hash: %v", err)
	}
	if err := Verify(sr, sig, d.task.SecretAccessKey, tSHA([]byte("other body"))); !errors.Is(err, ErrMismatch) {
		t.Fatalf("wrong body hash: %v", err)
	}
}

type presignCase struct {
	sdkCase
	expires  string
	bodyHash string // for Verify/Resign: "" where the payload hash is implied
}

var presignCases = []presignCase{
	{
		sdkCase: sdkCase{
			name: "s3 GET presigned", service: "s3", region: "us-west-2",
			payloadHash: unsignedPayload, task: taskCreds, real: realTemp,
			build: func() *http.Request {
				return newReq("GET", "https://examplebucket.s3.us-west-2.amazonaws.com/reports/Q1%202025%2Bfinal.pdf?response-content-disposition=attachment%3B%20filename%3D%22r.pdf%22", "")
			},
		},
		expires: "900",
	},
	{
		sdkCase: sdkCase{
			name: "s3 PUT presigned, token dropped", service: "s3", region: "eu-west-1",
			payloadHash: unsignedPayload, task: taskCreds, real: realLongTerm,
			build: func() *http.Request {
				r := newReq("PUT", "https://s3.eu-west-1.amazonaws.com/bucket/key", "")
				r.Header.Set("Content-Type", "application/octet-stream")
				return r
			},
		},
		expires: "3600",
	},
	{
		sdkCase: sdkCase{
			name: "sts GetCallerIdentity presigned (EKS token)", service: "sts", region: "us-east-1",
			payloadHash: emptyHash, task: taskLongTerm, real: realTemp,
			build: func() *http.Request {
				r := newReq("GET", "https://sts.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15", "")
				r.Header.Set("X-K8s-Aws-Id", "my-cluster")
				return r
			},
		},
		expires: "60", bodyHash: emptyHash,
	},
}

func (c presignCase) presign(t *testing.T, creds aws.Credentials) (string, http.Header) {
	r := c.build()
	q := r.URL.Query()
	q.Set("X-Amz-Expires", c.expires)
	r.URL.RawQuery = q.Encode()
	u, h, err := v4.NewSigner().PresignHTTP(context.Background(), creds, r, c.payloadHash, c.service, c.region, signTime, c.sdkOpts)
	if err != nil {
		t.Fatal(err)
	}
	return u, h
}

func TestSDKPresigned(t *testing.T) {
	for _, c := range presignCases {
		t.Run(c.name, func(t *testing.T) {
			u, h := c.presign(t, c.task)
			r := c.build()
			var err error
			if r.URL, err = url.Parse(u); err != nil {
				t.Fatal(err)
			}
			for k, v := range h {
				if k != "Host" {
					r.Header[k] = v
				}
			}
			sr := onWire(t, r)
			sig := mustParse(t, sr)
			mode := Literal // the body's hash, which for sts is the empty body's
			if c.service == "s3" {
				mode = Unsigned
			}
			if !sig.Presigned || strconv.Itoa(int(sig.Expires/time.Second)) != c.expires || sig.AccessKeyID != c.task.AccessKeyID || sig.Payload != mode {
				t.Fatalf("parsed %+v", sig)
			}
			if err := Verify(sr, sig, "another secret entirely, forty chars....", c.bodyHash); !errors.Is(err, ErrMismatch) {
				t.Fatalf("other secret: %v", err)
			}
			if err := Verify(sr, sig, c.task.SecretAccessKey, c.bodyHash); err != nil {
				t.Fatalf("task secret: %v", err)
			}
			if _, err := Resign(sr, sig, toCreds(c.real), c.bodyHash); err != nil {
				t.Fatal(err)
			}
			wantURL, _ := c.presign(t, c.real)
			want, _ := url.Parse(wantURL)
			got, gotQ := sr.URL.Query(), want.Query()
			if got.Encode() != gotQ.Encode() {
				t.Fatalf("query\n got %s\nwant %s", got.Encode(), gotQ.Encode())
			}
			if sr.URL.EscapedPath() != want.EscapedPath() {
				t.Fatalf("path %s, want %s", sr.URL.EscapedPath(), want.EscapedPath())
			}
			sig2 := mustParse(t, sr)
			if err := Verify(sr, sig2, c.real.SecretAccessKey, c.bodyHash); err != nil {
				t.Fatalf("re-signed: %v", err)
			}
			if err := sig.CheckTime(signTime.Add(sig.Expires-time.Second), time.Minute); err != nil {
				t.Fatalf("within expiry: %v", err)
			}
			if err := sig.CheckTime(signTime.Add(sig.Expires+time.Second), time.Minute); !errors.Is(err, ErrStale) {
				t.Fatalf("past expiry: %v", err)
			}
		})
	}
}

// TestResignKeepsQueryOrder: only the signing parameters of a presigned
// query change, in place; everything else stays byte for byte.
func TestResignKeepsQueryOrder(t *testing.T) {
	c := presignCases[0]
	u, _ := c.presign(t, c.task)
	r := newReq("GET", u, "")
	sr := onWire(t, r)
	before := sr.URL.RawQuery
	sig := mustParse(t, sr)
	if err := Verify(sr, sig, c.task.SecretAccessKey, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := Resign(sr, sig, toCreds(c.real), ""); err != nil {
		t.Fatal(err)
	}
	a, b := strings.Split(before, "&"), strings.Split(sr.URL.RawQuery, "&")
	if len(a) != len(b) {
		t.Fatalf("%d parameters became %d", len(a), len(b))
	}
	for i := range a {
		name, _, _ := strings.Cut(a[i], "=")
		switch name {
		case qCredential, qSecurityToken, qSignature:
			if a[i] == b[i] || !strings.HasPrefix(b[i], name+"=") {
				t.Fatalf("parameter %d (%s) not rewritten in place", i, name)
			}
		default:
			if a[i] != b[i] {
				t.Fatalf("parameter %d (%s) changed", i, name)
			}
		}
	}
}

func TestCheckTimeHeader(t *testing.T) {
	sig := &Signature{Time: signTime}
	for _, tc := range []struct {
		now time.Time
		ok  bool
	}{
		{signTime, true},
		{signTime.Add(14 * time.Minute), true},
		{signTime.Add(-14 * time.Minute), true},
		{signTime.Add(16 * time.Minute), false},
		{signTime.Add(-16 * time.Minute), false},
	} {
		if err := sig.CheckTime(tc.now, 15*time.Minute); (err == nil) != tc.ok {
			t.Fatalf("now %v: %v", tc.now.Sub(signTime), err)
		}
	}
}

// TestNonCanonicalHeaderKeys: a header set by direct map access under a
// lowercase key is found as the SDK finds it.
func TestNonCanonicalHeaderKeys(t *testing.T) {
	c := headerCases[4]
	build := func() *http.Request {
		r := c.build()
		r.Header["x-lower-case"] = []string{" a  b "}
		r.Header["x-AMZ-odd"] = []string{"1", "2"}
		return r
	}
	r := build()
	if err := v4.NewSigner().SignHTTP(context.Background(), c.task, r, c.payloadHash, c.service, c.region, signTime); err != nil {
		t.Fatal(err)
	}
	sig := mustParse(t, r)
	if !contains(sig.SignedHeaders, "x-lower-case") || !contains(sig.SignedHeaders, "x-amz-odd") {
		t.Fatalf("SDK signed %v", sig.SignedHeaders)
	}
	if err := Verify(r, sig, c.task.SecretAccessKey, emptyHash); err != nil {
		t.Fatal(err)
	}
	if _, err := Resign(r, sig, toCreds(c.real), emptyHash); err != nil {
		t.Fatal(err)
	}
	want := build()
	if err := v4.NewSigner().SignHTTP(context.Background(), c.real, want, c.payloadHash, c.service, c.region, signTime); err != nil {
		t.Fatal(err)
	}
	if r.Header.Get("Authorization") != want.Header.Get("Authorization") {
		t.Fatal("Authorization differs from the SDK's")
	}
}
