package fakegithub

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// GitHub's messages for the refusals the fake answers, so tests can match
// them as they would GitHub's.
const (
	MsgBadCredentials   = "Bad credentials"
	MsgNotFound         = "Not Found"
	MsgRepoInaccessible = "There is at least one repository that does not exist or is not accessible to the parent installation."
	MsgPermsNotGranted  = "The permissions requested are not granted to this installation."
	MsgJWTExpired       = "'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires."
	MsgJWTTooLong       = "'Expiration time' claim ('exp') is too far in the future"
	MsgJWTIssuedLater   = "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued"
	MsgNoUserAgent      = "Request forbidden by administrative rules. Please make sure your request has a User-Agent header (https://docs.github.com/en/rest/overview/resources-in-the-rest-api#user-agent-required)."
)

// maxJWTLife is GitHub's bound on exp - iat (and on exp from now).
const maxJWTLife = 10 * time.Minute

var (
	reInstallation = regexp.MustCompile(`^/repos/([^/]+)/([^/]+)/installation$`)
	reAccessTokens = regexp.MustCompile(`^/app/installations/([0-9]+)/access_tokens$`)
)

// apiError is a refusal: GitHub's JSON error body.
type apiError struct {
	status  int
	message string
}

// api answers the REST API at path (without /api/v3).
func (s *Server) api(w http.ResponseWriter, r *http.Request, path string) {
	rec := APIRequest{Method: r.Method, Path: path, UserAgent: r.UserAgent(), Accept: r.Header.Get("Accept"), APIVersion: r.Header.Get("X-GitHub-Api-Version")}
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && strings.Count(tok, ".") == 2 {
		rec.JWT = tok
	}
	status, body, aerr := s.apiAnswer(r, path, rec.JWT)
	if aerr != nil {
		status = aerr.status
		rec.Message = aerr.message
		body = map[string]string{"message": aerr.message, "documentation_url": "https://docs.github.com/rest"}
	}
	rec.Status = status
	s.mu.Lock()
	s.apiReqs = append(s.apiReqs, rec)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-GitHub-Api-Version-Selected", "2022-11-28")
	w.WriteHeader(status)
	if body != nil {
		json.NewEncoder(w).Encode(body)
	}
}

func (s *Server) apiAnswer(r *http.Request, path, jwt string) (int, any, *apiError) {
	if r.UserAgent() == "" {
		return 0, nil, &apiError{http.StatusForbidden, MsgNoUserAgent}
	}
	if m := reInstallation.FindStringSubmatch(path); m != nil && r.Method == http.MethodGet {
		app, err := s.verifyJWT(jwt)
		if err != nil {
			return 0, nil, err
		}
		return s.repoInstallation(app, m[1]+"/"+m[2])
	}
	if m := reAccessTokens.FindStringSubmatch(path); m != nil && r.Method == http.MethodPost {
		app, err := s.verifyJWT(jwt)
		if err != nil {
			return 0, nil, err
		}
		id, _ := strconv.ParseInt(m[1], 10, 64)
		return s.mint(app, id, r.Body)
	}
	if path == "/installation/token" && r.Method == http.MethodDelete {
		return s.revoke(r)
	}
	return 0, nil, &apiError{http.StatusNotFound, MsgNotFound}
}

// verifyJWT checks an App's JWT as GitHub does (the package's doc) and
// returns its App.
func (s *Server) verifyJWT(jwt string) (*App, *apiError) {
	bad := &apiError{http.StatusUnauthorized, "A JSON web token could not be decoded"}
	if jwt == "" {
		return nil, &apiError{http.StatusUnauthorized, "Requires authentication"}
	}
	parts := strings.Split(jwt, ".")
	header, err1 := base64.RawURLEncoding.DecodeString(parts[0])
	payload, err2 := base64.RawURLEncoding.DecodeString(parts[1])
	sig, err3 := base64.RawURLEncoding.DecodeString(parts[2])
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, bad
	}
	var h struct {
		Alg string `json:"alg"`
	}
	var c struct {
		Iss json.RawMessage `json:"iss"`
		Iat *int64          `json:"iat"`
		Exp *int64          `json:"exp"`
	}
	if json.Unmarshal(header, &h) != nil || json.Unmarshal(payload, &c) != nil || h.Alg != "RS256" {
		return nil, bad
	}
	iss := strings.Trim(string(c.Iss), `"`)
	appID, err := strconv.ParseInt(iss, 10, 64)
	app := s.apps[appID]
	if err != nil || app == nil {
		return nil, &apiError{http.StatusUnauthorized, "'Issuer' claim ('iss') must be an Integer"}
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if rsa.VerifyPKCS1v15(app.Key, crypto.SHA256, digest[:], sig) != nil {
		return nil, &apiError{http.StatusUnauthorized, "A JSON web token could not be decoded"}
	}
	now := s.clock.Now().Unix()
	switch {
	case c.Iat == nil || *c.Iat > now:
		return nil, &apiError{http.StatusUnauthorized, MsgJWTIssuedLater}
	case c.Exp == nil || *c.Exp <= now:
		return nil, &apiError{http.StatusUnauthorized, MsgJWTExpired}
	case *c.Exp-*c.Iat > int64(maxJWTLife/time.Second) || *c.Exp > now+int64(maxJWTLife/time.Second):
		return nil, &apiError{http.StatusUnauthorized, MsgJWTTooLong}
	}
	return app, nil
}

func (s *Server) repoInstallation(app *App, repo string) (int, any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, in := range s.installs {
		if in.app == app && containsFold(in.Repos, repo) {
			return http.StatusOK, map[string]any{
				"id":                   in.ID,
				"app_id":               app.ID,
				"account":              map[string]any{"login": in.owner},
				"repository_selection": "selected",
				"permissions":          app.Permissions,
			}, nil
		}
	}
	return 0, nil, &apiError{http.StatusNotFound, MsgNotFound}
}

// mintRequest is POST /app/installations/{id}/access_tokens's body. The
// fake refuses a field it does not know (GitHub ignores it), so a typo in
// the minter's body fails a test instead of minting a broader token.
type mintRequest struct {
	Repositories []string          `json:"repositories"`
	Permissions  map[string]string `json:"permissions"`
}

func (s *Server) mint(app *App, installationID int64, body io.Reader) (int, any, *apiError) {
	s.mu.Lock()
	in := s.installs[installationID]
	s.mu.Unlock()
	if in == nil || in.app != app {
		return 0, nil, &apiError{http.StatusNotFound, MsgNotFound}
	}
	var req mintRequest
	if b, err := io.ReadAll(io.LimitReader(body, 1<<20)); err != nil {
		return 0, nil, &apiError{http.StatusBadRequest, "Problems parsing JSON"}
	} else if len(bytes.TrimSpace(b)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return 0, nil, &apiError{http.StatusUnprocessableEntity, "Invalid request: " + err.Error()}
		}
	}

	repos := in.Repos
	if req.Repositories != nil {
		repos = nil
		for _, name := range req.Repositories {
			i := slices.IndexFunc(in.Repos, func(r string) bool { return strings.EqualFold(r, in.owner+"/"+name) })
			if i < 0 {
				return 0, nil, &apiError{http.StatusUnprocessableEntity, MsgRepoInaccessible}
			}
			repos = append(repos, in.Repos[i])
		}
	}
	perms := app.Permissions
	if req.Permissions != nil {
		perms = req.Permissions
		for name, level := range req.Permissions {
			if !covers(app.Permissions[name], level) {
				return 0, nil, &apiError{http.StatusUnprocessableEntity, MsgPermsNotGranted}
			}
		}
	}

	now := s.clock.Now()
	tok := &Token{
		Value:          newTokenValue(),
		AppID:          app.ID,
		InstallationID: installationID,
		Repos:          slices.Clone(repos),
		Permissions:    clonePerms(perms),
		IssuedAt:       now,
		ExpiresAt:      now.Add(TokenLifetime).Truncate(time.Second),
	}
	s.mu.Lock()
	s.tokens[tok.Value] = tok
	s.minted = append(s.minted, tok)
	s.mu.Unlock()

	var repoObjs []map[string]any
	for _, r := range repos {
		_, name, _ := splitRepo(r)
		repoObjs = append(repoObjs, map[string]any{"name": name, "full_name": r, "private": true})
	}
	return http.StatusCreated, map[string]any{
		"token":                tok.Value,
		"expires_at":           tok.ExpiresAt.UTC().Format(time.RFC3339),
		"permissions":          tok.Permissions,
		"repository_selection": "selected",
		"repositories":         repoObjs,
	}, nil
}

// revoke is DELETE /installation/token, authenticated by the token
// itself ("token <t>" or "Bearer <t>").
func (s *Server) revoke(r *http.Request) (int, any, *apiError) {
	auth := r.Header.Get("Authorization")
	value, ok := strings.CutPrefix(auth, "token ")
	if !ok {
		value, _ = strings.CutPrefix(auth, "Bearer ")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	tok := s.liveLocked(value)
	if tok == nil {
		return 0, nil, &apiError{http.StatusUnauthorized, MsgBadCredentials}
	}
	tok.RevokedAt = s.clock.Now()
	s.revocations++
	return http.StatusNoContent, nil, nil
}

// covers reports whether a grant of level have allows level want
// (write covers read).
func covers(have, want string) bool {
	switch want {
	case "read":
		return have == "read" || have == "write"
	case "write":
		return have == "write"
	}
	return false
}

// newTokenValue is a token shaped as GitHub's installation tokens are.
func newTokenValue() string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 36)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return "ghs_" + string(b)
}
