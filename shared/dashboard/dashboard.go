// Package dashboard owns Fleet's web dashboard: its static files (one page,
// its script and its style sheet, hand-written and embedded in the binary:
// no build step, no CDN) and how they are answered, headers included. The
// api handler serves them at GET /ui (the page) and GET /ui/<file> (its
// assets), publicly: the page holds no data, and every call it makes to
// the API and the stream carries the signed-in caller's bearer token.
//
// Assets are named by their content (app.<sha256 prefix>.js), so they are
// cached as immutable and a new build is never mixed with an old one; the
// page itself is revalidated on every load (ETag). Every answer carries a
// strict Content-Security-Policy: scripts and styles from the API's own
// origin only, nothing inline, no eval, connections to the API and the
// stream only (DESIGN.md, section "The dashboard").
package dashboard

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strings"
)

//go:embed static
var static embed.FS

// Prefix is the path the dashboard is served under: the page at Prefix,
// its assets at Prefix + "/" + name. The API is served at the root of its
// origin (template.yaml's $default stage), so the page names its assets by
// absolute path.
const Prefix = "/ui"

// Cache-Control of the page (revalidated at every load, so a new build is
// seen at once) and of an asset (its name changes with its content).
const (
	pageCacheControl  = "no-cache"
	assetCacheControl = "public, max-age=31536000, immutable"
)

// Config configures a Site.
type Config struct {
	// StreamURL is the stream's public base URL when the stream is
	// served elsewhere than the API (the stream function's URL in AWS,
	// RUNFLEET_STREAM_URL): the page may connect to its origin. Empty: the
	// stream is on the API's own origin (the local stack).
	StreamURL string
}

// Site is the dashboard's files, ready to answer. It is safe for
// concurrent use.
type Site struct {
	page    file
	assets  map[string]file // by served name (app.<hash>.js)
	headers map[string]string
}

type file struct {
	contentType string
	etag        string
	body        []byte
}

// Answer is a dashboard file as the API sends it: 200 with the body, or
// 304 (Not Modified: no body and no ContentType) when the client's
// If-None-Match names it. Headers are by lower-case name; ContentType is
// the Content-Type.
type Answer struct {
	Status      int
	ContentType string
	Headers     map[string]string
	Body        []byte
}

// New reads the embedded files, names each asset by its content and points
// the page at those names.
func New(cfg Config) (*Site, error) {
	csp, err := contentSecurityPolicy(cfg.StreamURL)
	if err != nil {
		return nil, err
	}
	index, err := static.ReadFile("static/index.html")
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	s := &Site{assets: map[string]file{}, headers: securityHeaders(csp)}
	entries, err := fs.ReadDir(static, "static")
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if name == "index.html" {
			continue
		}
		body, err := static.ReadFile("static/" + name)
		if err != nil {
			return nil, fmt.Errorf("dashboard: %w", err)
		}
		ct, ok := contentTypes[path.Ext(name)]
		if !ok {
			return nil, fmt.Errorf("dashboard: %s: no content type for its extension", name)
		}
		sum := sha256.Sum256(body)
		hash := hex.EncodeToString(sum[:])[:12]
		served := strings.TrimSuffix(name, path.Ext(name)) + "." + hash + path.Ext(name)
		// The page names each asset exactly once, by its absolute path in
		// double quotes: anything else is a page this rewrite would miss.
		ref := []byte(`"` + Prefix + "/" + name + `"`)
		if n := bytes.Count(index, ref); n != 1 {
			return nil, fmt.Errorf("dashboard: index.html names %s %d times, want once", ref, n)
		}
		index = bytes.Replace(index, ref, []byte(`"`+Prefix+"/"+served+`"`), 1)
		s.assets[served] = file{contentType: ct, etag: `"` + hash + `"`, body: body}
	}
	sum := sha256.Sum256(index)
	s.page = file{contentType: contentTypes[".html"], etag: `"` + hex.EncodeToString(sum[:])[:12] + `"`, body: index}
	return s, nil
}

var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
}

// Page answers GET /ui. ifNoneMatch is the request's If-None-Match header.
func (s *Site) Page(ifNoneMatch string) Answer {
	return s.answer(s.page, pageCacheControl, ifNoneMatch)
}

// Asset answers GET /ui/<name>; ok is false when no asset has that name
// (an old build's included: its page is gone too).
func (s *Site) Asset(name, ifNoneMatch string) (a Answer, ok bool) {
	f, ok := s.assets[name]
	if !ok {
		return Answer{}, false
	}
	return s.answer(f, assetCacheControl, ifNoneMatch), true
}

func (s *Site) answer(f file, cacheControl, ifNoneMatch string) Answer {
	h := make(map[string]string, len(s.headers)+2)
	for k, v := range s.headers {
		h[k] = v
	}
	h["cache-control"] = cacheControl
	h["etag"] = f.etag
	if etagMatches(ifNoneMatch, f.etag) {
		return Answer{Status: http.StatusNotModified, Headers: h}
	}
	return Answer{Status: http.StatusOK, ContentType: f.contentType, Headers: h, Body: f.body}
}

// etagMatches is If-None-Match's weak comparison (RFC 9110, 13.1.2): "*",
// or any listed tag equal to etag, W/ or not.
func etagMatches(header, etag string) bool {
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimPrefix(strings.TrimSpace(t), "W/")
		if t == "*" || t == etag {
			return true
		}
	}
	return false
}

// contentSecurityPolicy is the policy of every dashboard answer: nothing
// but the API's own origin for scripts, styles and images (data: images
// for the inline favicon), connections to it and to the stream's origin,
// no inline code or eval, no <base>, no forms posted, no framing, and
// Trusted Types required with no policy allowed, so that no string can
// ever reach innerHTML or another HTML sink. streamURL is Config's.
func contentSecurityPolicy(streamURL string) (string, error) {
	connect := "'self'"
	if streamURL != "" {
		u, err := url.Parse(streamURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return "", errors.New("dashboard: Config.StreamURL: want an absolute http or https URL")
		}
		connect += " " + u.Scheme + "://" + u.Host
	}
	return strings.Join([]string{
		"default-src 'none'",
		"script-src 'self'",
		"style-src 'self'",
		"img-src 'self' data:",
		"connect-src " + connect,
		"base-uri 'none'",
		"form-action 'none'",
		"frame-ancestors 'none'",
		"require-trusted-types-for 'script'",
		"trusted-types 'none'",
	}, "; "), nil
}

// securityHeaders are the headers besides the policy that every dashboard
// answer carries: no sniffing, no referrer (a run's URL names its id), no
// framing for browsers older than frame-ancestors, and a window of its own.
func securityHeaders(csp string) map[string]string {
	return map[string]string{
		"content-security-policy":    csp,
		"x-content-type-options":     "nosniff",
		"referrer-policy":            "no-referrer",
		"x-frame-options":            "DENY",
		"cross-origin-opener-policy": "same-origin",
	}
}
