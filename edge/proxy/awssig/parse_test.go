package awssig

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

const (
	pSig   = "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
	pCred  = "AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request"
	pAuth  = "AWS4-HMAC-SHA256 Credential=" + pCred + ", SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, Signature=" + pSig
	pQuery = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host&X-Amz-Signature=" + pSig
)

// pReq is a GET with the given query, Authorization and extra headers, and
// a good X-Amz-Date unless one is given.
func pReq(query, auth string, headers ...string) *http.Request {
	r := newReq("GET", "https://examplebucket.s3.amazonaws.com/test.txt", "")
	r.URL.RawQuery = query
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	r.Header.Set("X-Amz-Date", "20130524T000000Z")
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			r.Header.Del(headers[i])
		} else {
			r.Header.Add(headers[i], headers[i+1])
		}
	}
	return r
}

func TestParseAccepts(t *testing.T) {
	sig, err := Parse(pReq("", pAuth, "X-Amz-Content-Sha256", emptyHash))
	if err != nil {
		t.Fatal(err)
	}
	if sig.Presigned || sig.AccessKeyID != "AKIAIOSFODNN7EXAMPLE" || sig.Date != "20130524" || sig.Region != "us-east-1" ||
		sig.Service != "s3" || strings.Join(sig.SignedHeaders, ";") != "host;range;x-amz-content-sha256;x-amz-date" ||
		sig.Signature != pSig || sig.Payload != Literal || sig.PayloadHash != emptyHash || sig.Time.Format(amzDateLayout) != "20130524T000000Z" {
		t.Fatalf("%+v", sig)
	}
	// The separators SDKs differ in: ", " (Go, botocore) and "," (the docs' example).
	if _, err := Parse(pReq("", strings.ReplaceAll(pAuth, ", ", ","))); err != nil {
		t.Fatal(err)
	}
	sig, err = Parse(pReq(pQuery, ""))
	if err != nil {
		t.Fatal(err)
	}
	if !sig.Presigned || sig.Expires.Hours() != 24 || sig.Payload != Unsigned || sig.PayloadHash != "" {
		t.Fatalf("%+v", sig)
	}
	for mode, v := range map[PayloadMode]string{Unsigned: unsignedPayload, Streaming: streamingPayload, StreamingTrailer: streamingTrailer, StreamingUnsignedTrailer: streamingUnsignedTrailer} {
		sig, err := Parse(pReq("", pAuth, "X-Amz-Content-Sha256", v))
		if err != nil || sig.Payload != mode || sig.Payload.String() != v {
			t.Fatalf("%s: %v %v", v, sig, err)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	withAuth := func(old, new string) string { return strings.Replace(pAuth, old, new, 1) }
	withQuery := func(old, new string) string { return strings.Replace(pQuery, old, new, 1) }
	cases := []struct {
		name   string
		r      *http.Request
		reason string // "" for ErrNotSigned
	}{
		{"nothing", pReq("a=1", ""), ""},
		{"bearer", pReq("", "Bearer abc.def"), ""},
		{"sigv2 header", pReq("", "AWS AKIAIOSFODNN7EXAMPLE:frJIUN8DYpKDtOLCwo//yllqDzg="), "sigv2_unsupported"},
		{"sigv2 query", pReq("AWSAccessKeyId=AKIAIOSFODNN7EXAMPLE&Expires=1141889120&Signature=vjbyPxybdZaNmGa%2ByT272YEAiv4%3D", ""), "sigv2_unsupported"},
		{"sigv4a header", pReq("", strings.Replace(pAuth, "AWS4-HMAC-SHA256", "AWS4-ECDSA-P256-SHA256", 1)), "sigv4a_unsupported"},
		{"sigv4a region set", pReq("", pAuth, "X-Amz-Region-Set", "*"), "sigv4a_unsupported"},
		{"sigv4a query", pReq(withQuery("AWS4-HMAC-SHA256", "AWS4-ECDSA-P256-SHA256")+"&X-Amz-Region-Set=us-east-1", ""), "sigv4a_unsupported"},
		{"sigv4a query algorithm", pReq(withQuery("AWS4-HMAC-SHA256", "AWS4-ECDSA-P256-SHA256"), ""), "sigv4a_unsupported"},
		{"event stream", pReq("", pAuth, "X-Amz-Content-Sha256", "STREAMING-AWS4-HMAC-SHA256-EVENTS"), "event_stream_unsupported"},
		{"ecdsa streaming", pReq("", pAuth, "X-Amz-Content-Sha256", "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD"), "sigv4a_unsupported"},
		{"unknown algorithm", pReq("", withAuth("AWS4-HMAC-SHA256", "AWS4-HMAC-SHA512")), "algorithm_unknown"},
		{"scope short", pReq("", withAuth("/s3/aws4_request", "/s3")), "credential_malformed"},
		{"scope terminal", pReq("", withAuth("aws4_request", "aws4_requesx")), "credential_malformed"},
		{"scope date", pReq("", withAuth("/20130524/", "/2013052/")), "credential_malformed"},
		{"scope region", pReq("", withAuth("/us-east-1/", "/US East/")), "credential_malformed"},
		{"key id", pReq("", withAuth("AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPL-")), "credential_malformed"},
		{"no credential", pReq("", withAuth("Credential="+pCred+", ", "")), "credential_malformed"},
		{"no signed headers", pReq("", withAuth("SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, ", "")), "signed_headers_malformed"},
		{"empty signed headers", pReq("", withAuth("host;range;x-amz-content-sha256;x-amz-date", "")), "signed_headers_malformed"},
		{"signed headers without host", pReq("", withAuth("host;range;", "range;")), "signed_headers_lack_host"},
		{"signed headers without date", pReq("", withAuth(";x-amz-date", "")), "signed_headers_lack_date"},
		{"signed headers unsorted", pReq("", withAuth("host;range", "range;host")), "signed_headers_malformed"},
		{"signed headers uppercase", pReq("", withAuth("host;range", "host;Range")), "signed_headers_malformed"},
		{"signed headers repeated", pReq("", withAuth("host;range", "host;host;range")), "signed_headers_malformed"},
		{"date malformed", pReq("", pAuth, "X-Amz-Date", "", "X-Amz-Date", "2013-05-24T00:00:00Z"), "date_malformed"},
		{"date missing", pReq("", pAuth, "X-Amz-Date", ""), "date_malformed"},
		{"date out of range", pReq("", pAuth, "X-Amz-Date", "", "X-Amz-Date", "20130524T250000Z"), "date_malformed"},
		{"date not the scope's day", pReq("", pAuth, "X-Amz-Date", "", "X-Amz-Date", "20130525T000000Z"), "date_malformed"},
		{"date repeated", pReq("", pAuth, "X-Amz-Date", "20130524T000000Z"), "date_malformed"},
		{"signature short", pReq("", withAuth(pSig, pSig[:63])), "signature_malformed"},
		{"signature uppercase", pReq("", withAuth(pSig, strings.ToUpper(pSig))), "signature_malformed"},
		{"no signature", pReq("", withAuth(", Signature="+pSig, "")), "signature_malformed"},
		{"authorization unknown part", pReq("", pAuth+", Extra=1"), "authorization_malformed"},
		{"authorization repeated part", pReq("", pAuth+", Signature="+pSig), "authorization_malformed"},
		{"two authorization headers", pReq("", pAuth, "Authorization", pAuth), "authorization_malformed"},
		{"signed twice", pReq(pQuery, pAuth), "signed_twice"},
		{"expires zero", pReq(withQuery("X-Amz-Expires=86400", "X-Amz-Expires=0"), ""), "expires_malformed"},
		{"expires above a week", pReq(withQuery("X-Amz-Expires=86400", "X-Amz-Expires=604801"), ""), "expires_malformed"},
		{"expires not a number", pReq(withQuery("X-Amz-Expires=86400", "X-Amz-Expires=1h"), ""), "expires_malformed"},
		{"query date", pReq(withQuery("X-Amz-Date=20130524T000000Z", "X-Amz-Date=20130524"), ""), "date_malformed"},
		{"query no signature", pReq(withQuery("&X-Amz-Signature="+pSig, ""), ""), "signature_malformed"},
		{"query no signed headers", pReq(withQuery("&X-Amz-SignedHeaders=host", ""), ""), "signed_headers_malformed"},
		{"query repeated parameter", pReq(pQuery+"&X-Amz-Signature="+pSig, ""), "query_malformed"},
		{"query bad escape", pReq(pQuery+"&a=%zz", ""), "query_malformed"},
		{"query signs token header", pReq(withQuery("X-Amz-SignedHeaders=host", "X-Amz-SignedHeaders=host%3Bx-amz-security-token"), ""), "signed_headers_malformed"},
		{"payload hash garbage", pReq("", pAuth, "X-Amz-Content-Sha256", "not-a-hash"), "payload_hash_malformed"},
		{"payload hash repeated", pReq("", pAuth, "X-Amz-Content-Sha256", emptyHash, "X-Amz-Content-Sha256", emptyHash), "payload_hash_malformed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sig, err := Parse(tc.r)
			if sig != nil {
				t.Fatalf("parsed %+v", sig)
			}
			var reason string
			var ue *UnsupportedError
			var me *MalformedError
			switch {
			case errors.Is(err, ErrNotSigned):
			case errors.As(err, &ue):
				reason = ue.Reason
			case errors.As(err, &me):
				reason = me.Reason
			default:
				t.Fatalf("error %v", err)
			}
			if reason != tc.reason {
				t.Fatalf("reason %q (%v), want %q", reason, err, tc.reason)
			}
			for _, secret := range []string{pSig, "AKIAIOSFODNN7EXAMPLE", "frJIUN8DYpKDtOLCwo"} {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("error %q carries a credential or signature", err)
				}
			}
		})
	}
}
