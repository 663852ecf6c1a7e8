package awsfront

// Presigned URLs. moto 5.2.1 under signature checks answers 500 to one (its
// check reads the Authorization header unconditionally:
// core/authorization.py, iam/access_control.py IAMRequestBase). So the
// front checks the query signature and the expiry itself, then forwards
// the request signed in header form with the same key, which moto checks
// again as usual (key, token, policy). The front signs that itself, over
// moto's reading of the URL (motoview.go): aws-sdk-go-v2's signer would
// sign the URL as a client does, which moto misreads for many S3 keys.

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// presignSkew is how far in the future a presigned URL's X-Amz-Date may be:
// clocks differ. S3 allows 15 minutes either side of its own clock.
const presignSkew = 15 * time.Minute

// checkPresigned verifies a presigned request with the secret of the key
// it names, and that it is within its validity by the front's clock.
func (f *Front) checkPresigned(r *http.Request, s signature) (aws.Credentials, error) {
	if s.expires == 0 {
		return aws.Credentials{}, fmt.Errorf("awsfront: a presigned S3 URL needs X-Amz-Expires: %w", ErrMalformed)
	}
	creds, err := f.keys.lookup(s.accessKeyID, r.URL.Query().Get("X-Amz-Security-Token"))
	if err != nil {
		return aws.Credentials{}, err
	}
	if err := verify(r, s, creds.SecretAccessKey, unsignedPayload); err != nil {
		return aws.Credentials{}, err
	}
	// Expiry after the signature: a forged URL says "signature", not
	// "expired", as S3 says.
	signed, err := s.signedAt()
	if err != nil {
		return aws.Credentials{}, err
	}
	now := f.cfg.Now()
	if now.After(signed.Add(s.expires)) {
		return aws.Credentials{}, fmt.Errorf("awsfront: presigned at %s for %s, now %s: %w", s.amzDate, s.expires, now.UTC().Format(amzTimeFormat), ErrExpired)
	}
	if signed.After(now.Add(presignSkew)) {
		return aws.Credentials{}, fmt.Errorf("awsfront: presigned at %s, in the future of %s: %w", s.amzDate, now.UTC().Format(amzTimeFormat), ErrExpired)
	}
	return creds, nil
}

// presignParams are the query parameters a presigned URL's signature adds;
// the header-signed request moto gets carries none of them.
var presignParams = map[string]bool{
	"X-Amz-Algorithm": true, "X-Amz-Credential": true, "X-Amz-Date": true, "X-Amz-Expires": true,
	"X-Amz-SignedHeaders": true, "X-Amz-Signature": true, "X-Amz-Security-Token": true,
}

// resignPresigned turns out (a copy of a presigned request that passed
// checkPresigned) into the same request signed in header form with
// creds, at the front's clock, over moto's reading of its URL.
func (f *Front) resignPresigned(out *http.Request, s signature, creds aws.Credentials) {
	var kept []string
	for _, part := range strings.Split(out.URL.RawQuery, "&") {
		name, _, _ := strings.Cut(part, "=")
		if part != "" && !presignParams[name] {
			kept = append(kept, part)
		}
	}
	out.URL.RawQuery = strings.Join(kept, "&")
	now := f.cfg.Now().UTC()
	h := signature{
		accessKeyID: creds.AccessKeyID, date: now.Format("20060102"), region: s.region, service: s.service,
		amzDate: now.Format(amzTimeFormat),
	}
	out.Header.Set("X-Amz-Date", h.amzDate)
	out.Header.Set("X-Amz-Content-Sha256", unsignedPayload)
	signed := append([]string{"x-amz-content-sha256", "x-amz-date"}, s.signedHeaders...)
	if creds.SessionToken != "" {
		out.Header.Set("X-Amz-Security-Token", creds.SessionToken)
		signed = append(signed, "x-amz-security-token")
	}
	slices.Sort(signed)
	h.signedHeaders = slices.Compact(signed)
	f.signForMoto(out, h, creds.SecretAccessKey, unsignedPayload)
}

// signForMoto sets out's Authorization to s (its key, scope, date and
// signed headers) signed with secret over moto's reading of out's URL and
// of the headers it signs.
func (f *Front) signForMoto(out *http.Request, s signature, secret, payloadHash string) {
	s.signedHeaders = motoSigned(s.signedHeaders)
	sig := signatureOver(out, s, motoView(out.URL.EscapedPath(), out.URL.RawQuery, s.service), secret, payloadHash)
	out.Header.Set("Authorization", algorithm+" Credential="+s.accessKeyID+"/"+s.scope()+
		", SignedHeaders="+strings.Join(s.signedHeaders, ";")+", Signature="+sig)
}
