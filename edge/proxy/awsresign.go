package proxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy/awssig"
	"github.com/runfleet/runfleet/edge/secrets"
)

// AWSClockSkew is how far a SigV4 request's X-Amz-Date may be from edge's
// clock, as AWS itself allows: a request outside it is refused before the
// real secret signs anything.
const AWSClockSkew = 15 * time.Minute

// Audit reasons of the AWS path, each followed by ": " and what was wrong.
// Those of awssig's UnsupportedError and MalformedError (sigv2_unsupported,
// chunk_malformed...) are used as they are.
const (
	reasonSignatureMismatch   = "signature_mismatch"
	reasonStaleDate           = "stale_date"
	reasonPayloadUnverifiable = "payload_unverifiable"
)

// refuseAWS: a request signed with an aws key's placeholder that the proxy
// will not sign again (403, audited blocked); reason starts with its code.
func refuseAWS(reason string, key policy.KeyRef) *refusal {
	return &refusal{status: http.StatusForbidden, action: audit.Blocked, reason: reason, key: key}
}

// awsRead is an aws key's real credentials as read once for a request
// (learnGranted).
type awsRead struct {
	ref   policy.KeyRef
	creds awssig.Credentials
}

// mayBeAWSSigned is the cheap test that keeps every other request off the
// AWS path: an AWS scheme in Authorization, or a signing parameter in the
// query. Parse decides the rest.
func mayBeAWSSigned(r *http.Request) bool {
	if a := r.Header["Authorization"]; len(a) > 0 && strings.HasPrefix(a[0], "AWS") {
		return true
	}
	q := r.URL.RawQuery
	return strings.Contains(q, "X-Amz-") || strings.Contains(q, "AWSAccessKeyId") || r.Header["X-Amz-Region-Set"] != nil
}

// resignAWS owns a request that an aws key of the task concerns: one
// signed with an aws placeholder access key id, or signed in a scheme the
// proxy cannot re-sign and sent where a task's aws key reaches or naming
// its placeholder. It checks the task's signature with the placeholder
// secret and signs the same request again with the real credentials
// (awssig); a streamed aws-chunked body is re-signed chunk by chunk as it
// goes. Nothing else of such a request is substituted: the signature covers
// the bytes the task sent. handled is false for any other request, which
// prepare goes on with as usual.
func (st *requestState) resignAWS(r *http.Request) (handled bool, refused *refusal) {
	handled, refused = st.resignAWSRequest(r)
	if refused != nil && !refused.isFault() {
		refused.awsShape = awsErrorShapeOf(r, st.ci.target.Name)
	}
	return handled, refused
}

func (st *requestState) resignAWSRequest(r *http.Request) (handled bool, refused *refusal) {
	if !mayBeAWSSigned(r) {
		return false, nil
	}
	sig, err := awssig.Parse(r)
	if errors.Is(err, awssig.ErrNotSigned) {
		return false, nil
	}
	owners := *st.p.reg.aws.Load()
	if err != nil {
		ref, ours := st.awsConcerned(r, owners)
		if !ours {
			return false, nil
		}
		var unsupported *awssig.UnsupportedError
		var malformed *awssig.MalformedError
		switch {
		case errors.As(err, &unsupported):
			return true, refuseAWS(unsupported.Reason+": "+strings.TrimPrefix(err.Error(), "awssig: ")+"; the proxy re-signs AWS Signature Version 4 (AWS4-HMAC-SHA256) only", ref)
		case errors.As(err, &malformed):
			return true, refuseAWS(malformed.Reason+": "+strings.TrimPrefix(err.Error(), "awssig: "), ref)
		}
		return true, fault(err, ref)
	}
	o, ok := owners[sig.AccessKeyID]
	if !ok {
		return false, nil // not a placeholder: the task's own signature, its business
	}
	st.entry.AWS = &audit.AWSSigning{Region: sig.Region, Service: sig.Service, Payload: sig.Payload.String(), Presigned: sig.Presigned}
	d, g := policy.DecideAWSSigning(policy.AWSSigningInput{
		Task: st.runID(), Authority: st.ci.target, Granted: st.grants.granted,
		Owner: o.task, Ref: o.ref, Region: sig.Region, Service: sig.Service,
	})
	switch {
	case !d.Allow && strings.HasPrefix(d.Reason, policy.ScopeRefused):
		return true, refuseAWS(d.Reason, o.ref)
	case !d.Allow:
		return true, st.blocked(d.Reason, o.task, o.ref)
	}
	if refused := st.ruleRefusal(o.ref); refused != nil {
		return true, refused
	}
	if sig.CheckTime(st.p.cfg.Clock.Now(), AWSClockSkew) != nil {
		what := "X-Amz-Date is more than 15 minutes from edge's clock"
		if sig.Presigned {
			what = "the presigned URL is not valid now (its X-Amz-Date and X-Amz-Expires)"
		}
		return true, refuseAWS(reasonStaleDate+": "+what, o.ref)
	}
	creds, learnt, refused := st.awsCredentialsFor(g)
	if refused != nil {
		return true, refused
	}
	if r.Body != nil && r.Body != http.NoBody {
		st.bodyIn = &countingReader{r: r.Body}
		r.Body = st.bodyIn
	}
	bodyHash := ""
	if sig.Payload == awssig.Literal && sig.PayloadHash == "" {
		// Most services send no x-amz-content-sha256: the signature
		// covers the body's hash, so the body is read to check it.
		if bodyHash, refused = st.hashAWSBody(r, o.ref); refused != nil {
			return true, refused
		}
	}
	switch err := awssig.Verify(r, sig, o.ph.SecretAccessKey, bodyHash); {
	case errors.Is(err, awssig.ErrMismatch):
		return true, refuseAWS(reasonSignatureMismatch+": the request's SigV4 signature is not the one the task's placeholder secret gives", o.ref)
	case err != nil:
		return true, awsRefusal(err, o.ref)
	}
	// The answer comes uncoded, to be scrubbed: forward asks for it with
	// "Accept-Encoding: identity" in place of the task's value, so the
	// real signature covers that value when the task signed the field.
	if _, ok := r.Header["Accept-Encoding"]; ok {
		r.Header["Accept-Encoding"] = []string{"identity"}
	}
	// Learnt before the real credentials go anywhere: an answer that
	// echoes them (AWS error bodies name the access key id) is scrubbed.
	if !learnt {
		st.ci.attempt.task.learnAWS(o.ref, o.ph, creds)
	}
	seed, err := awssig.Resign(r, sig, creds, bodyHash)
	if err != nil {
		return true, awsRefusal(err, o.ref)
	}
	if sig.Payload == awssig.Streaming || sig.Payload == awssig.StreamingTrailer {
		cr, err := awssig.NewChunkResigner(r.Body, sig, o.ph.SecretAccessKey, creds, seed)
		if err != nil {
			return true, awsRefusal(err, o.ref)
		}
		r.Body = &resignedBody{r: cr, c: r.Body, st: st, ref: o.ref}
	}
	st.mu.Lock()
	st.markUsed(o.ref)
	st.mu.Unlock()
	return true, nil
}

// awsRefusal maps an awssig error met after Parse: a malformed part names
// itself; anything else is ours.
func awsRefusal(err error, ref policy.KeyRef) *refusal {
	var malformed *awssig.MalformedError
	if errors.As(err, &malformed) {
		return refuseAWS(malformed.Reason+": "+strings.TrimPrefix(err.Error(), "awssig: "), ref)
	}
	return fault(err, ref)
}

// awsConcerned reports whether a request whose signature cannot be
// re-signed concerns one of the task's aws keys, and which: it names an
// aws placeholder access key id, or goes where an aws key of the task
// reaches. Such a request is refused, never sent on with a placeholder.
func (st *requestState) awsConcerned(r *http.Request, owners map[string]awsOwner) (policy.KeyRef, bool) {
	signing := r.URL.RawQuery + " " + strings.Join(r.Header["Authorization"], " ")
	for id, o := range owners {
		if strings.Contains(signing, id) {
			return o.ref, true
		}
	}
	if d, ok := st.ci.target.Domain(); ok {
		for i := range st.grants.granted {
			if g := &st.grants.granted[i]; g.AWS != nil && g.Reaches(d) {
				return g.Ref, true
			}
		}
	}
	return policy.KeyRef{}, false
}

// awsCredentialsFor is the real credentials of g for this request: those
// learnGranted read (and had the run learn: learnt), else read now.
func (st *requestState) awsCredentialsFor(g *policy.Granted) (creds awssig.Credentials, learnt bool, refused *refusal) {
	st.mu.Lock()
	for _, a := range st.aws {
		if a.ref == g.Ref {
			st.mu.Unlock()
			return a.creds, true, nil
		}
	}
	st.mu.Unlock()
	creds, err := st.p.awsCredentials(st.ctx, st.runID(), g)
	switch {
	case errors.Is(err, secrets.ErrNotFound):
		return creds, false, refuseWithheld(g.Ref)
	case err != nil:
		return creds, false, fault(fmt.Errorf("reading %s: %w", g.Ref, err), g.Ref)
	}
	return creds, false, nil
}

// hashAWSBody reads the whole body of a request whose signature covers its
// hash without stating it, and returns the hash; the body is then
// forwarded from what was read: memory up to the body buffer, an unlinked
// file in the spool beyond, up to AWSBodyLimit. A body of no stated length
// is read the same way and sent with the length found.
func (st *requestState) hashAWSBody(r *http.Request, ref policy.KeyRef) (string, *refusal) {
	if r.Body == nil || r.Body == http.NoBody {
		return emptySHA256, nil
	}
	limit := st.p.cfg.AWSBodyLimit
	tooLarge := func() (string, *refusal) {
		return "", refuseAWS(fmt.Sprintf("%s: a request signed over its body's hash without x-amz-content-sha256 is read whole to check it, and its body is over %d bytes; send x-amz-content-sha256 (S3's UNSIGNED-PAYLOAD or a streaming mode) for larger bodies", reasonPayloadUnverifiable, limit), ref)
	}
	if r.ContentLength > limit {
		return tooLarge()
	}
	h := sha256.New()
	if r.ContentLength >= 0 && r.ContentLength <= st.p.cfg.BodyBufferLimit {
		body := make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			return "", fault(errors.New("request body shorter than its Content-Length"), ref)
		}
		h.Write(body)
		st.body = body
		r.Body = io.NopCloser(bytes.NewReader(body))
		return hex.EncodeToString(h.Sum(nil)), nil
	}
	f, err := st.p.spoolFile()
	if err != nil {
		return "", fault(fmt.Errorf("spooling a request body: %w", err), ref)
	}
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r.Body, limit+1))
	switch {
	case err != nil:
		f.Close()
		return "", fault(fmt.Errorf("spooling a request body: %w", err), ref)
	case n > limit:
		f.Close()
		return tooLarge()
	case r.ContentLength >= 0 && n != r.ContentLength:
		f.Close()
		return "", fault(errors.New("request body shorter than its Content-Length"), ref)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return "", fault(fmt.Errorf("spooling a request body: %w", err), ref)
	}
	st.spool = f
	r.Body, r.ContentLength = io.NopCloser(f), n
	r.TransferEncoding = nil
	return hex.EncodeToString(h.Sum(nil)), nil
}

// closeSpool closes the request's spooled body, if any, once the request
// is done (serve): the file was unlinked when made, so it is gone.
func (st *requestState) closeSpool() {
	if st.spool != nil {
		st.spool.Close()
		st.spool = nil
	}
}

// emptySHA256 is hex(sha256("")).
const emptySHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// spoolFile is a new file for a request body, already unlinked: it holds
// the body only while the request does, whatever becomes of edge.
func (p *Proxy) spoolFile() (*os.File, error) {
	dir := filepath.Join(p.cfg.DataDir, "secrets-proxy", "spool")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(dir, "body-")
	if err != nil {
		return nil, err
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// markUsed records that ref's value went into the request, for its audit
// line. st.mu is held.
func (st *requestState) markUsed(ref policy.KeyRef) {
	for i := range st.subs {
		if st.subs[i].ref == ref {
			st.subs[i].used = true
			return
		}
	}
	st.subs = append(st.subs, substitution{ref: ref, used: true})
}

// resignedBody is a re-signed aws-chunked body on its way upstream: a chunk
// whose signature does not verify stops it, and the request keeps the
// refusal, so whatever the upstream makes of the cut body is not passed on
// (answered).
type resignedBody struct {
	r   io.Reader
	c   io.Closer
	st  *requestState
	ref policy.KeyRef
}

func (b *resignedBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		var refused *refusal
		var malformed *awssig.MalformedError
		switch {
		case errors.Is(err, awssig.ErrMismatch):
			refused = refuseAWS(reasonSignatureMismatch+": a chunk's signature in the aws-chunked body is not the one the task's placeholder secret gives", b.ref)
		case errors.As(err, &malformed):
			refused = refuseAWS(malformed.Reason+": "+strings.TrimPrefix(err.Error(), "awssig: "), b.ref)
		}
		if refused != nil {
			refused.awsShape = awsErrS3 // aws-chunked bodies are S3's
			b.st.mu.Lock()
			b.st.refuseLocked(refused)
			b.st.mu.Unlock()
		}
	}
	return n, err
}

func (b *resignedBody) Close() error { return b.c.Close() }

// learnAWSGranted reads the real credentials of each aws key the task is
// granted, keeps them as the request's (st.aws), and has the run's answers
// scrubbed of them. st.mu is held.
func (st *requestState) learnAWSGranted(g *policy.Granted, stored string) {
	ph, ok := storedAWS(stored)
	if !ok {
		return // the key became an aws key after the run registered
	}
	t := st.ci.attempt.task
	creds, err := st.p.awsCredentials(st.ctx, t.runID, g)
	if err != nil {
		if !errors.Is(err, secrets.ErrNotFound) && st.ctx.Err() == nil {
			st.p.cfg.Logger.Warn("secrets proxy: reading a granted aws key's credentials, to scrub answers of them",
				slog.String("task", t.runID), slog.String("key", g.Ref.String()), slog.String("error", err.Error()))
		}
		return
	}
	t.learnAWS(g.Ref, ph, creds)
	st.aws = append(st.aws, awsRead{ref: g.Ref, creds: creds})
}

// awsErrorShape is how an AWS service's clients read its errors.
type awsErrorShape uint8

const (
	awsErrNone awsErrorShape = iota
	// awsErrS3: S3's <Error><Code/><Message/></Error>.
	awsErrS3
	// awsErrQuery: the query protocol's (STS, IAM, EC2...)
	// <ErrorResponse><Error>...</Error></ErrorResponse>.
	awsErrQuery
	// awsErrJSON: the JSON protocols' {"__type", "message"} (DynamoDB,
	// most newer services), which send an application/x-amz-json body.
	awsErrJSON
)

// awsErrorShapeOf picks the error shape r's client reads: JSON for a JSON
// protocol's request, S3's for S3 and for names that are not AWS's (an
// S3-compatible store), the query protocol's otherwise.
func awsErrorShapeOf(r *http.Request, host string) awsErrorShape {
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-amz-json") {
		return awsErrJSON
	}
	if h, ok := policy.ParseAWSHost(host); !ok || slices.Contains(h.Services, "s3") {
		return awsErrS3
	}
	return awsErrQuery
}

// respondAWS answers a refused SigV4 request as its service would an
// error: a client shows the message, "runfleet edge: <reason>". A wrong
// signature is SignatureDoesNotMatch, as AWS names it (no client retries
// it); anything else AccessDenied.
func respondAWS(w http.ResponseWriter, refused *refusal) {
	code := "AccessDenied"
	if strings.HasPrefix(refused.reason, reasonSignatureMismatch) {
		code = "SignatureDoesNotMatch"
	}
	msg := "runfleet edge: " + refused.reason
	var body []byte
	h := w.Header()
	switch refused.awsShape {
	case awsErrJSON:
		body, _ = json.Marshal(struct {
			Type    string `json:"__type"`
			Message string `json:"message"`
		}{code, msg})
		h.Set("Content-Type", "application/x-amz-json-1.0")
		h.Set("X-Amzn-Errortype", code)
	case awsErrQuery:
		body = fmt.Appendf(nil, "<ErrorResponse><Error><Type>Sender</Type><Code>%s</Code><Message>%s</Message></Error><RequestId>runfleet-edge</RequestId></ErrorResponse>\n", code, xmlEscaped(msg))
		h.Set("Content-Type", "text/xml")
	default:
		body = fmt.Appendf(nil, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>%s</Code><Message>%s</Message><RequestId>runfleet-edge</RequestId></Error>\n", code, xmlEscaped(msg))
		h.Set("Content-Type", "application/xml")
	}
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(refused.status)
	w.Write(body)
}

// xmlEscaped escapes what element text must not hold as it is; quotes
// need no escaping there, and stay readable in a client's message.
var xmlEscaped = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace
