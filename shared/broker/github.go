package broker

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/version"
)

// GitHub's REST API as the minter speaks it.
const (
	defaultGitHubAPI = "https://api.github.com"
	githubAPIVersion = "2022-11-28"
	// jwtBackdate and jwtLife: GitHub refuses a JWT issued in its future
	// or living over 10 minutes, so it is issued a minute back (clock
	// drift) for 10 minutes in all; it is reused until jwtRenewBefore its
	// expiry, so it never expires on the way.
	jwtBackdate    = 60 * time.Second
	jwtLife        = 9 * time.Minute
	jwtRenewBefore = time.Minute
	// installationTTL is how long a byRepository lookup is reused: an
	// App installed again gets a new id, and a mint refused 404 looks up
	// again anyway.
	installationTTL = 5 * time.Minute
	// maxGitHubBody bounds what is read of GitHub's answers.
	maxGitHubBody = 1 << 20
	// maxProviderMessage bounds GitHub's message in an Error.
	maxProviderMessage = 200
)

// githubMinter mints installation tokens of one githubApp recipe, each
// limited to one run's repository and the recipe's permissions. Safe for
// concurrent use: a Broker shares it between dispatches.
type githubMinter struct {
	projectID, key string
	r              GitHubApp
	api            string // the API's base URL, no trailing slash
	deps           Deps

	keyMu sync.Mutex // held while the key is read
	mu    sync.Mutex // guards the fields below
	priv  *rsa.PrivateKey
	jwt   string
	// jwtExp is the cached JWT's exp; zero when there is none.
	jwtExp time.Time
	// installs are byRepository lookups by lower-cased "owner/name".
	installs map[string]installationEntry
}

type installationEntry struct {
	id      int64
	fetched time.Time
}

// newGitHubMinter makes the minter of key ("<project>/<KEY>") from a
// parsed recipe. It reads nothing yet: the private key is read and parsed
// at the first mint, and kept.
func newGitHubMinter(key string, r GitHubApp, deps Deps) (*githubMinter, error) {
	project, name, ok := strings.Cut(key, "/")
	if !ok {
		return nil, fmt.Errorf("%s: %q: want \"<project>/<KEY>\"", EnvName, key)
	}
	api := strings.TrimSuffix(r.APIURL, "/")
	if api == "" {
		api = defaultGitHubAPI
	}
	if u, err := url.Parse(api); err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("%s: %q.githubApp.apiUrl: want an absolute https URL", EnvName, key)
	}
	if deps.Secrets == nil {
		return nil, fmt.Errorf("%s: %q: no secret reader for githubApp.privateKeySecret", EnvName, key)
	}
	return &githubMinter{
		projectID: project,
		key:       name,
		r:         r,
		api:       api,
		deps:      deps.withDefaults(),
		installs:  map[string]installationEntry{},
	}, nil
}

// Fields of the minter's log lines (never a value: no token, JWT or key).
const (
	ghLogKey    = "key" // "<project>/<KEY>"
	ghLogKind   = "kind"
	ghLogRun    = "fleetRunId"
	ghLogRepo   = "repository"
	ghLogStatus = "providerStatus"
)

func (m *githubMinter) logKey() slog.Attr {
	return slog.Group("", ghLogKey, m.projectID+"/"+m.key, ghLogKind, KindGitHubApp)
}

// fail is an Error of this recipe.
func (m *githubMinter) fail(status int, format string, args ...any) *Error {
	return &Error{ProjectID: m.projectID, Key: m.key, Kind: KindGitHubApp, ProviderStatus: status, Detail: fmt.Sprintf(format, args...)}
}

// mint mints a token for req's repository: one repository, the recipe's
// permissions, an hour's life (GitHub's). Errors are *Error.
func (m *githubMinter) mint(ctx context.Context, req MintRequest) (Minted, error) {
	owner, name, ok := parseRepository(req.Repository)
	if !ok {
		if req.Repository == "" {
			return Minted{}, m.fail(0, "a githubApp key needs the run's repository (owner/name or its clone URL); the run names none")
		}
		return Minted{}, m.fail(0, "the run's repository is not owner/name nor a clone URL ending in owner/name")
	}
	repo := owner + "/" + name
	minted, err := m.mintFor(ctx, repo, name)
	if err != nil {
		m.deps.Logger.Warn("broker: github token not minted", m.logKey(),
			ghLogRun, req.FleetRunID, ghLogRepo, repo, ghLogStatus, providerStatus(err))
		return Minted{}, err
	}
	return minted, nil
}

func (m *githubMinter) mintFor(ctx context.Context, repo, name string) (Minted, error) {
	id, cached, err := m.installation(ctx, repo)
	if err != nil {
		return Minted{}, err
	}
	minted, err := m.accessToken(ctx, id, repo, name)
	if cached && providerStatus(err) == http.StatusNotFound {
		// The App was installed again (a new id) or removed since the
		// lookup: look up again, once.
		m.forgetInstallation(repo)
		if id, _, err = m.installation(ctx, repo); err != nil {
			return Minted{}, err
		}
		minted, err = m.accessToken(ctx, id, repo, name)
	}
	return minted, err
}

// installation is the installation to mint repo's token in, and whether
// it came from the byRepository cache.
func (m *githubMinter) installation(ctx context.Context, repo string) (id int64, cached bool, err error) {
	if !m.r.InstallationID.ByRepository {
		return m.r.InstallationID.ID, false, nil
	}
	now := m.deps.Clock.Now()
	m.mu.Lock()
	e, ok := m.installs[strings.ToLower(repo)]
	m.mu.Unlock()
	if ok && now.Sub(e.fetched) < installationTTL {
		return e.id, true, nil
	}
	var answer struct {
		ID int64 `json:"id"`
	}
	if err := m.appCall(ctx, http.MethodGet, "/repos/"+repo+"/installation", nil, http.StatusOK, &answer); err != nil {
		if e, ok := errors.AsType[*Error](err); ok && e.ProviderStatus == http.StatusNotFound {
			e.Detail = "the App is not installed on " + repo + " (GET /repos/" + repo + "/installation answered 404)"
		}
		return 0, false, err
	}
	if answer.ID <= 0 {
		return 0, false, m.fail(http.StatusOK, "GET /repos/%s/installation answered no installation id", repo)
	}
	m.mu.Lock()
	m.installs[strings.ToLower(repo)] = installationEntry{id: answer.ID, fetched: now}
	m.mu.Unlock()
	return answer.ID, false, nil
}

func (m *githubMinter) forgetInstallation(repo string) {
	m.mu.Lock()
	delete(m.installs, strings.ToLower(repo))
	m.mu.Unlock()
}

// accessToken mints the token in installation id for the repository
// repo (name is its name, what GitHub's body takes).
func (m *githubMinter) accessToken(ctx context.Context, id int64, repo, name string) (Minted, error) {
	body, err := json.Marshal(struct {
		Repositories []string          `json:"repositories"`
		Permissions  map[string]string `json:"permissions"`
	}{[]string{name}, m.r.Permissions})
	if err != nil {
		return Minted{}, m.fail(0, "encoding the token request: %v", err)
	}
	var answer struct {
		Token        string    `json:"token"`
		ExpiresAt    time.Time `json:"expires_at"`
		Repositories []struct {
			FullName string `json:"full_name"`
		} `json:"repositories"`
	}
	path := "/app/installations/" + strconv.FormatInt(id, 10) + "/access_tokens"
	if err := m.appCall(ctx, http.MethodPost, path, body, http.StatusCreated, &answer); err != nil {
		return Minted{}, err
	}
	if answer.Token == "" || answer.ExpiresAt.IsZero() {
		return Minted{}, m.fail(http.StatusCreated, "POST %s answered no token or no expires_at", path)
	}
	// A token must reach the run's repository alone: an answer for more
	// (a GitHub that ignored the list) is revoked and refused.
	for _, r := range answer.Repositories {
		if !strings.EqualFold(r.FullName, repo) {
			m.revoke(ctx, answer.Token) // best effort; refused anyway
			return Minted{}, m.fail(http.StatusCreated, "POST %s answered a token for more than %s; revoked", path, repo)
		}
	}
	return Minted{Kind: KindGitHubApp, Value: hostproto.SecretString(answer.Token), ExpiresAt: answer.ExpiresAt}, nil
}

// revoke revokes token (DELETE /installation/token, authenticated by
// the token itself). A token GitHub no longer honours (401: revoked or
// expired) counts as revoked. Errors are *Error.
func (m *githubMinter) revoke(ctx context.Context, token string) error {
	req, err := m.request(ctx, http.MethodDelete, "/installation/token", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "token "+token)
	resp, err := m.deps.HTTPClient.Do(req)
	if err != nil {
		return m.fail(0, "DELETE /installation/token: %v", redactURLError(err))
	}
	defer resp.Body.Close()
	// The Broker logs a revocation; the minter logs what only it knows.
	if resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusUnauthorized {
		return nil
	}
	err = m.providerError(resp, "DELETE /installation/token")
	m.deps.Logger.Warn("broker: github token not revoked", m.logKey(), ghLogStatus, resp.StatusCode)
	return err
}

// appCall calls the API as the App (its JWT), expecting want, and
// decodes the answer into out.
func (m *githubMinter) appCall(ctx context.Context, method, path string, body []byte, want int, out any) error {
	jwt, err := m.appJWT(ctx)
	if err != nil {
		return err
	}
	req, err := m.request(ctx, method, path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+jwt)
	resp, err := m.deps.HTTPClient.Do(req)
	if err != nil {
		return m.fail(0, "%s %s: %v", method, path, redactURLError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		if resp.StatusCode == http.StatusUnauthorized {
			// GitHub refused the JWT: the App's key may have been
			// rotated. Read it again at the next mint.
			m.forgetKey()
		}
		return m.providerError(resp, method+" "+path)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxGitHubBody)).Decode(out); err != nil {
		return m.fail(resp.StatusCode, "%s %s: the answer is not GitHub's JSON", method, path)
	}
	return nil
}

func (m *githubMinter) request(ctx context.Context, method, path string, body []byte) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, m.api+path, rd)
	if err != nil {
		return nil, m.fail(0, "%s %s: %v", method, path, err)
	}
	req.Header.Set("Accept", "application/vnd.github+json")
	req.Header.Set("X-GitHub-Api-Version", githubAPIVersion)
	req.Header.Set("User-Agent", version.Product+"-fleet/"+version.Version)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

// providerError is GitHub's refusal as an Error: its status and its
// message, bounded and printable (GitHub's messages hold no credential;
// the bound keeps an unexpected page out of an error).
func (m *githubMinter) providerError(resp *http.Response, what string) *Error {
	var answer struct {
		Message string `json:"message"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxGitHubBody))
	detail := fmt.Sprintf("GitHub refused %s", what)
	if json.Unmarshal(b, &answer) == nil && answer.Message != "" {
		detail += ": " + boundMessage(answer.Message)
	}
	return m.fail(resp.StatusCode, "%s", detail)
}

func boundMessage(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return ' '
	}, s)
	if r := []rune(s); len(r) > maxProviderMessage {
		s = string(r[:maxProviderMessage]) + "..."
	}
	return s
}

// redactURLError drops the URL from a transport error (it holds no
// credential, but the error is shorter and says what failed).
func redactURLError(err error) error {
	if u, ok := errors.AsType[*url.Error](err); ok {
		return u.Err
	}
	return err
}

// appJWT is the App's JWT (RFC 7519, RS256), made again once it has less
// than jwtRenewBefore left.
func (m *githubMinter) appJWT(ctx context.Context) (string, error) {
	now := m.deps.Clock.Now()
	m.mu.Lock()
	jwt, exp := m.jwt, m.jwtExp
	m.mu.Unlock()
	if jwt != "" && now.Before(exp.Add(-jwtRenewBefore)) {
		return jwt, nil
	}
	priv, err := m.privateKey(ctx)
	if err != nil {
		return "", err
	}
	iat := now.Add(-jwtBackdate)
	exp = now.Add(jwtLife)
	jwt, err = signRS256(priv, map[string]any{
		"iat": iat.Unix(),
		"exp": exp.Unix(),
		"iss": strconv.FormatInt(m.r.AppID, 10),
	})
	if err != nil {
		return "", m.fail(0, "signing the App's JWT: %v", err)
	}
	m.mu.Lock()
	m.jwt, m.jwtExp = jwt, time.Unix(exp.Unix(), 0)
	m.mu.Unlock()
	return jwt, nil
}

// privateKey reads and parses the App's key once (keyMu: concurrent
// first mints read the secret once). A failure is not kept: the next mint
// reads the secret again.
func (m *githubMinter) privateKey(ctx context.Context) (*rsa.PrivateKey, error) {
	m.keyMu.Lock()
	defer m.keyMu.Unlock()
	m.mu.Lock()
	priv := m.priv
	m.mu.Unlock()
	if priv != nil {
		return priv, nil
	}
	pemText, err := m.deps.Secrets.Read(ctx, m.r.PrivateKeySecret)
	if err != nil {
		return nil, m.fail(0, "githubApp.privateKeySecret: %v", err)
	}
	if priv, err = parseRSAKey([]byte(pemText)); err != nil {
		return nil, m.fail(0, "githubApp.privateKeySecret: %v", err)
	}
	m.mu.Lock()
	m.priv = priv
	m.mu.Unlock()
	return priv, nil
}

// forgetKey drops the key and the JWT made with it.
func (m *githubMinter) forgetKey() {
	m.mu.Lock()
	m.priv, m.jwt, m.jwtExp = nil, "", time.Time{}
	m.mu.Unlock()
}

// errNotRSAKey never quotes the secret: it says what was expected.
var errNotRSAKey = errors.New("not an unencrypted RSA private key in PEM (PKCS#1 \"RSA PRIVATE KEY\" or PKCS#8 \"PRIVATE KEY\"), as GitHub's App settings give it")

// parseRSAKey reads an App's private key, PKCS#1 or PKCS#8 PEM. Its
// errors never hold any of the input.
func parseRSAKey(pemText []byte) (*rsa.PrivateKey, error) {
	block, _ := pem.Decode(pemText)
	if block == nil || len(block.Headers) > 0 {
		return nil, errNotRSAKey
	}
	switch block.Type {
	case "RSA PRIVATE KEY":
		k, err := x509.ParsePKCS1PrivateKey(block.Bytes)
		if err != nil {
			return nil, errNotRSAKey
		}
		return k, nil
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, errNotRSAKey
		}
		if rk, ok := k.(*rsa.PrivateKey); ok {
			return rk, nil
		}
	}
	return nil, errNotRSAKey
}

// signRS256 is a compact JWS of claims: header {"alg":"RS256","typ":"JWT"},
// RSASSA-PKCS1-v1_5 over SHA-256 (RFC 7518, section 3.3).
func signRS256(k *rsa.PrivateKey, claims map[string]any) (string, error) {
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	signing := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"RS256","typ":"JWT"}`)) + "." + base64.RawURLEncoding.EncodeToString(payload)
	digest := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(nil, k, crypto.SHA256, digest[:])
	if err != nil {
		return "", err
	}
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig), nil
}

// GitHub's names: an owner (user or organization) is letters, digits and
// inner hyphens; a repository's name letters, digits, '.', '-', '_'.
var (
	githubOwner = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})$`)
	githubName  = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)
)

// parseRepository reads a run's repository: "owner/name", or a clone URL
// (https://host/owner/name.git, ssh://git@host/owner/name,
// git@host:owner/name.git) whose path ends owner/name[.git]. Only owner
// and name are used: the token is minted at the recipe's apiUrl whatever
// host the URL names.
func parseRepository(s string) (owner, name string, ok bool) {
	path, fromURL := s, true
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil || u.Host == "" {
			return "", "", false
		}
		path = u.Path
	} else if host, rest, found := strings.Cut(s, ":"); found && host != "" && !strings.Contains(host, "/") {
		path = rest // scp form: [user@]host:owner/name.git
	} else {
		fromURL = false
	}
	parts := strings.Split(strings.TrimSuffix(strings.Trim(path, "/"), ".git"), "/")
	// Bare "owner/name" is two segments; a URL's path may be longer
	// (GitHub Enterprise under a prefix): its last two are taken.
	if len(parts) < 2 || (!fromURL && len(parts) != 2) {
		return "", "", false
	}
	owner, name = parts[len(parts)-2], parts[len(parts)-1]
	if !githubOwner.MatchString(owner) || !githubName.MatchString(name) || name == "." || name == ".." {
		return "", "", false
	}
	return owner, name, true
}

// providerStatus is an Error's ProviderStatus, 0 for any other error.
func providerStatus(err error) int {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.ProviderStatus
	}
	return 0
}
