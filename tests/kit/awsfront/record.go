package awsfront

import "sync"

// Upstream is how far a request got towards moto.
type Upstream int

const (
	// NotForwarded: the front answered itself (a refusal) and moto saw
	// nothing of the request.
	NotForwarded Upstream = iota
	// CutOff: the front had begun forwarding a long body when a later part
	// of it failed a check, and stopped mid-body. moto saw an incomplete
	// request and answers or stores nothing for it: the front always holds
	// back the end of a body until every check on it has passed.
	CutOff
	// Answered: moto had the whole request and answered it (any status).
	Answered
	// Unreachable: forwarding failed for another reason (moto down, a
	// transport error); the front answered 502.
	Unreachable
)

func (u Upstream) String() string {
	switch u {
	case NotForwarded:
		return "not-forwarded"
	case CutOff:
		return "cut-off"
	case Answered:
		return "answered"
	case Unreachable:
		return "unreachable"
	}
	return "unknown"
}

// Auth is where a request carried its signature.
type Auth string

const (
	// AuthNone: no SigV4 signature at all.
	AuthNone Auth = "none"
	// AuthHeader: the Authorization header.
	AuthHeader Auth = "header"
	// AuthPresigned: the query (X-Amz-Signature), a presigned URL.
	AuthPresigned Auth = "presigned"
)

// Record is what the front saw of one request and what became of it,
// without secrets: never a secret key, a session token or a body.
type Record struct {
	// Host is the Host header as received (the AWS name the client asked
	// for, e.g. "bucket.s3.us-east-1.amazonaws.com").
	Host string
	// Method and Path (escaped, as sent) and RawQuery are the request line.
	Method, Path, RawQuery string
	// Auth is where the signature was; AccessKeyID is the key id it names
	// ("" for AuthNone). A test asserts on it that the upstream saw the
	// real key, never a placeholder.
	Auth        Auth
	AccessKeyID string
	// Payload is x-amz-content-sha256 as sent ("" when absent): a hex
	// digest, "UNSIGNED-PAYLOAD" or one of the STREAMING-* modes.
	Payload string
	// SecurityToken reports an X-Amz-Security-Token header or query
	// parameter (temporary credentials).
	SecurityToken bool
	// FrontChecked reports that the front checked the request's signature
	// or body itself (presigned, streaming or a literal payload digest),
	// rather than leaving every check to moto.
	FrontChecked bool
	// Resigned reports that the front forwarded the request signed again,
	// with the same key: a presigned URL in header form, or an S3 URL
	// moto reads differently from its client (motoview.go). moto then
	// checked the front's signature; the client's the front checked.
	Resigned bool
	// BodyBytes counts the payload bytes the front checked: the decoded
	// data of an aws-chunked body, the body of a literal digest.
	BodyBytes int64
	// Upstream says whether moto saw the request.
	Upstream Upstream
	// Status is the status the client got: moto's, or the front's own.
	Status int
	// Refusal is the AWS error code of the front's own refusal ("" when
	// moto answered).
	Refusal string
}

// log keeps every Record in arrival order. Safe for concurrent use.
type log struct {
	mu   sync.Mutex
	recs []Record
}

func (l *log) add(r Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r)
}

func (l *log) all() []Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Record(nil), l.recs...)
}
