package awssig

import (
	"cmp"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// The canonical request, as aws-sdk-go-v2's signer builds it but over the
// task's own signed header list:
//
//	method
//	canonical URI:   s3 family: the path as it goes on the wire
//	                 (url.URL.EscapedPath, or Opaque's path); other services:
//	                 that path URI-encoded once more ("%" becomes "%25"),
//	                 as the SDKs and botocore do. Dot segments and repeated
//	                 slashes are kept (botocore removes them for non-S3
//	                 services: such a request fails closed).
//	canonical query: every name and value decoded ('+' is a space), then
//	                 RFC 3986-encoded (unreserved kept, %XX uppercase),
//	                 sorted by encoded name then encoded value; a presigned
//	                 request's X-Amz-Signature left out.
//	headers:         each signed name, ':', its values trimmed of spaces and
//	                 tabs with inner runs of spaces made one, joined by ','.
//	                 host is r.Host (else r.URL.Host), content-length
//	                 r.ContentLength, transfer-encoding r.TransferEncoding
//	                 when net/http has taken them out of r.Header.
//	signed headers:  the names joined by ';'
//	payload hash
func appendCanonicalRequest(b []byte, r *http.Request, service string, signed []string, presigned bool, payloadHash string) ([]byte, error) {
	method := r.Method
	if method == "" {
		method = http.MethodGet
	}
	b = append(b, method...)
	b = append(b, '\n')
	b = appendCanonicalURI(b, r.URL, service)
	b = append(b, '\n')
	var err error
	if b, err = appendCanonicalQuery(b, r.URL.RawQuery, presigned); err != nil {
		return nil, err
	}
	b = append(b, '\n')
	canonicalKeys := true
	for k := range r.Header {
		if textproto.CanonicalMIMEHeaderKey(k) != k {
			canonicalKeys = false
			break
		}
	}
	for _, name := range signed {
		b = append(b, name...)
		b = append(b, ':')
		b = appendHeaderValues(b, r, name, canonicalKeys)
		b = append(b, '\n')
	}
	b = append(b, '\n')
	for i, name := range signed {
		if i > 0 {
			b = append(b, ';')
		}
		b = append(b, name...)
	}
	b = append(b, '\n')
	b = append(b, payloadHash...)
	return b, nil
}

// s3Family: services whose signers put the path in the canonical request as
// sent. S3 on Outposts and S3 Object Lambda are S3's signer with another
// signing name; s3express is S3 Express One Zone's.
func s3Family(service string) bool {
	switch service {
	case "s3", "s3-object-lambda", "s3-outposts", "s3express":
		return true
	}
	return false
}

// appendCanonicalURI writes the path the way net/http will write it on the
// wire (url.URL.RequestURI's path), so what is signed is what is sent.
func appendCanonicalURI(b []byte, u *url.URL, service string) []byte {
	p := ""
	if u.Opaque != "" {
		p = u.Opaque
		if i := strings.IndexByte(p, '?'); i >= 0 {
			p = p[:i]
		}
		if strings.HasPrefix(p, "//") {
			// "//host/path": the path starts at the host's end.
			if i := strings.IndexByte(p[2:], '/'); i >= 0 {
				p = p[2+i:]
			} else {
				p = ""
			}
		}
	} else {
		p = u.EscapedPath()
	}
	if p == "" {
		p = "/"
	}
	if s3Family(service) {
		return append(b, p...)
	}
	return appendURIEncoded(b, p, true)
}

type param struct{ key, value string }

// parseQuery splits a raw query into decoded name/value pairs in order. An
// empty part ("a=1&&b=2") is nothing, as url.ParseQuery has it; a bad
// escape is an error, since the service would read the query differently.
func parseQuery(raw string) ([]param, error) {
	if raw == "" {
		return nil, nil
	}
	q := make([]param, 0, strings.Count(raw, "&")+1)
	for part := range strings.SplitSeq(raw, "&") {
		if part == "" {
			continue
		}
		k, v, _ := strings.Cut(part, "=")
		var err1, err2 error
		if k, err1 = unescape(k); err1 != nil {
			return nil, malformed("query_malformed", "query has a malformed escape")
		}
		if v, err2 = unescape(v); err2 != nil {
			return nil, malformed("query_malformed", "query has a malformed escape")
		}
		q = append(q, param{k, v})
	}
	return q, nil
}

func unescape(s string) (string, error) {
	if strings.IndexByte(s, '%') < 0 && strings.IndexByte(s, '+') < 0 {
		return s, nil
	}
	return url.QueryUnescape(s)
}

func appendCanonicalQuery(b []byte, raw string, presigned bool) ([]byte, error) {
	q, err := parseQuery(raw)
	if err != nil {
		return nil, err
	}
	enc := make([]param, 0, len(q))
	for _, p := range q {
		if presigned && p.key == qSignature {
			continue
		}
		enc = append(enc, param{uriEncoded(p.key), uriEncoded(p.value)})
	}
	slices.SortFunc(enc, func(x, y param) int {
		if c := cmp.Compare(x.key, y.key); c != 0 {
			return c
		}
		return cmp.Compare(x.value, y.value)
	})
	for i, p := range enc {
		if i > 0 {
			b = append(b, '&')
		}
		b = append(b, p.key...)
		b = append(b, '=')
		b = append(b, p.value...)
	}
	return b, nil
}

func unreserved(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

func uriEncoded(s string) string {
	for i := 0; i < len(s); i++ {
		if !unreserved(s[i]) {
			return string(appendURIEncoded(make([]byte, 0, len(s)+16), s, false))
		}
	}
	return s
}

// appendURIEncoded is SigV4's UriEncode: every byte but the unreserved ones
// (and '/' when keepSlash) as %XX, uppercase.
func appendURIEncoded(b []byte, s string, keepSlash bool) []byte {
	const hexUpper = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if unreserved(c) || keepSlash && c == '/' {
			b = append(b, c)
		} else {
			b = append(b, '%', hexUpper[c>>4], hexUpper[c&15])
		}
	}
	return b
}

// appendHeaderValues writes the canonical value of the signed header name
// (lowercase). Keys of r.Header are matched without regard to case, so a
// header set by direct map access counts too; several such keys are taken
// in sorted key order, the order net/http writes them in. canonicalKeys
// says every key is in net/http's canonical form (as its server and
// client leave them), so that one lookup finds all of name's values.
func appendHeaderValues(b []byte, r *http.Request, name string, canonicalKeys bool) []byte {
	switch name {
	case "host":
		host := r.Host
		if host == "" {
			host = r.URL.Host
		}
		return appendTrimmed(b, host)
	case "content-length":
		if _, ok := r.Header["Content-Length"]; !ok && r.ContentLength >= 0 {
			return strconv.AppendInt(b, r.ContentLength, 10)
		}
	case "transfer-encoding":
		if _, ok := r.Header["Transfer-Encoding"]; !ok && len(r.TransferEncoding) > 0 {
			return appendJoined(b, r.TransferEncoding)
		}
	}
	if canonicalKeys {
		var kb [64]byte
		k := kb[:0]
		upper := true
		for i := 0; i < len(name); i++ {
			c := name[i]
			if upper && 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			upper = c == '-'
			k = append(k, c)
		}
		return appendJoined(b, r.Header[string(k)])
	}
	var keys [4]string
	matched := keys[:0]
	for k := range r.Header {
		if len(k) == len(name) && strings.EqualFold(k, name) {
			matched = append(matched, k)
		}
	}
	if len(matched) > 1 {
		slices.Sort(matched)
	}
	first := true
	for _, k := range matched {
		for _, v := range r.Header[k] {
			if !first {
				b = append(b, ',')
			}
			first = false
			b = appendTrimmed(b, v)
		}
	}
	return b
}

func appendJoined(b []byte, values []string) []byte {
	for i, v := range values {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendTrimmed(b, v)
	}
	return b
}

// appendTrimmed writes v without leading or trailing spaces and tabs and
// with each inner run of spaces as one.
func appendTrimmed(b []byte, v string) []byte {
	v = strings.Trim(v, " \t")
	space := false
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == ' ' {
			if space {
				continue
			}
			space = true
		} else {
			space = false
		}
		b = append(b, c)
	}
	return b
}
