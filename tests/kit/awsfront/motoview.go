package awsfront

// How moto reads a request's URL when it checks a signature, so that the
// front can sign what moto will check. moto 5.2.1 does not check the URL
// as sent: it takes werkzeug's request.url (werkzeug 3.1,
// sansio/utils.py get_current_url then urls.py uri_to_iri: the path
// percent-decoded and quoted again with the URL spec's path-segment set,
// the query with most escapes decoded), splits it with Python's urlparse
// (which drops ";params" from the last path segment), and hands that to
// botocore's S3SigV4Auth, which signs the path as is and the query's raw
// pairs sorted (core/authorization.py, iam/access_control.py). A correct
// client signs "/b/a%2Bb" and "prefix=p%2F"; moto computes "/b/a+b" and
// "prefix=p/", and refuses. So S3 keys outside A-Z a-z 0-9 - _ . ~ / and
// space, and list queries with a delimiter or prefix containing "/",
// fail against moto under signature checks whoever signs them.
//
// Nor does moto sign every header the client signed: its botocore leaves
// out hop-by-hop headers, Expect, User-Agent and X-Amzn-Trace-Id
// (auth.py SIGNED_HEADERS_BLACKLIST), while older botocore (Debian's
// 1.29, behind python3-boto3) signs Transfer-Encoding on the chunked
// uploads it sends. moto refuses those too.
//
// The front therefore checks such a request itself and forwards it signed
// again, with the same key, over moto's reading of the URL and of the
// signed headers (Record.Resigned). moto still checks the key, the token
// and the policy.

import (
	"sort"
	"strings"
	"unicode/utf8"
)

// motoUnsigned are the headers moto's botocore never signs, whatever the
// client signed (botocore 1.43, moto's, auth.py SIGNED_HEADERS_BLACKLIST).
var motoUnsigned = map[string]bool{
	"connection": true, "expect": true, "keep-alive": true, "proxy-authenticate": true, "proxy-authorization": true,
	"te": true, "trailer": true, "transfer-encoding": true, "upgrade": true, "user-agent": true, "x-amzn-trace-id": true,
}

// motoSigned is the part of signed that moto signs.
func motoSigned(signed []string) []string {
	var out []string
	for _, h := range signed {
		if !motoUnsigned[h] {
			out = append(out, h)
		}
	}
	return out
}

// view is the URL part of a canonical request: its path and query lines.
type view struct{ uri, query string }

// clientView is what a correct client signs (see canonicalURI and
// canonicalQuery).
func clientView(escapedPath, rawQuery, service string, presigned bool) view {
	return view{canonicalURI(escapedPath, service), canonicalQuery(rawQuery, presigned)}
}

// motoView is what moto signs for a request of service it receives with
// this path and query: botocore signs an S3 path as is, any other
// service's encoded once more (SigV4Auth._normalize_url_path; the
// dot-segment removal it also does is left out, no test path has one).
func motoView(escapedPath, rawQuery, service string) view {
	path := motoPath(escapedPath)
	if service != "s3" {
		path = uriEncode(path, false)
	}
	return view{path, motoQuery(rawQuery)}
}

// motoPath: werkzeug's path of request.url, less urlparse's params.
func motoPath(escapedPath string) string {
	decoded := percentDecode(escapedPath)
	valid := utf8.ValidString(decoded)
	var b strings.Builder
	for i := 0; i < len(decoded); i++ {
		c := decoded[i]
		switch {
		case isUnreserved(c) || strings.IndexByte("!$&'()*+,/:;=@%", c) >= 0:
			// quote's safe set: kept as is.
			b.WriteByte(c)
		case c <= 0x20 || c == 0x7f || c == '?' || c == '#':
			// Quoted, and uri_to_iri keeps them quoted in a path.
			writeEscape(&b, c)
		case c >= 0x80 && !valid:
			writeEscape(&b, c)
		default:
			// Quoted, then unquoted again by uri_to_iri (", <, >, \, ^,
			// `, {, |, }, [, ] and UTF-8).
			b.WriteByte(c)
		}
	}
	path := b.String()
	if slash := strings.LastIndexByte(path, '/'); slash >= 0 {
		if semi := strings.IndexByte(path[slash:], ';'); semi >= 0 {
			path = path[:slash+semi]
		}
	}
	if path == "" {
		path = "/"
	}
	return path
}

// motoQuery: werkzeug's query of request.url (escapes decoded except those
// of controls, space, %, &, =, + and #), in botocore's raw pairs sorted.
func motoQuery(rawQuery string) string {
	var b strings.Builder
	for i := 0; i < len(rawQuery); i++ {
		c := rawQuery[i]
		if c == '%' && i+2 < len(rawQuery) && isHex(rawQuery[i+1]) && isHex(rawQuery[i+2]) {
			d := unhex(rawQuery[i+1])<<4 | unhex(rawQuery[i+2])
			if d <= 0x20 || d == 0x7f || strings.IndexByte("%&=+#", d) >= 0 {
				b.WriteString(rawQuery[i : i+3])
			} else {
				b.WriteByte(d)
			}
			i += 2
			continue
		}
		switch {
		case isUnreserved(c) || strings.IndexByte("!$&'()*+,/:;=?@%", c) >= 0:
			b.WriteByte(c)
		case c <= 0x20 || c == 0x7f:
			writeEscape(&b, c)
		default:
			b.WriteByte(c)
		}
	}
	if rawQuery == "" {
		return ""
	}
	type pair struct{ k, v string }
	var pairs []pair
	for _, part := range strings.Split(b.String(), "&") {
		k, v, _ := strings.Cut(part, "=")
		pairs = append(pairs, pair{k, v})
	}
	sort.Slice(pairs, func(i, j int) bool {
		if pairs[i].k != pairs[j].k {
			return pairs[i].k < pairs[j].k
		}
		return pairs[i].v < pairs[j].v
	})
	parts := make([]string, len(pairs))
	for i, p := range pairs {
		parts[i] = p.k + "=" + p.v
	}
	return strings.Join(parts, "&")
}

// percentDecode decodes every valid %XX and leaves anything else as is.
func percentDecode(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isUnreserved(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == '~'
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func writeEscape(b *strings.Builder, c byte) {
	const hexDigits = "0123456789ABCDEF"
	b.WriteByte('%')
	b.WriteByte(hexDigits[c>>4])
	b.WriteByte(hexDigits[c&15])
}
