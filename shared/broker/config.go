package broker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/runfleet/runfleet/shared/jsonstrict"
	"github.com/runfleet/runfleet/shared/runspec"
)

// EnvName is the variable the recipes come from; every Parse error begins
// with it.
const EnvName = "RUNFLEET_BROKER"

// ByRepository is installationId's string form: the installation is looked
// up for each run's repository.
const ByRepository = "byRepository"

// Parse reads RUNFLEET_BROKER's document, an object of "<project>/<KEY>"
// to Recipe, and checks every recipe. Its errors (all of them, joined) name
// the field at fault as `RUNFLEET_BROKER: "acme/GH".githubApp.appId:
// required`, and never quote a value of a field that is not expected (it
// may be a secret pasted in the wrong place). Parse trims a trailing slash
// off apiUrl. An empty object is no recipe.
func Parse(data []byte) (map[string]Recipe, error) {
	if err := jsonstrict.CheckDuplicateKeys(data); err != nil {
		return nil, fmt.Errorf("%s: %w", EnvName, err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(data, &doc); err != nil || doc == nil {
		return nil, fmt.Errorf("%s: want a JSON object of \"<project>/<KEY>\" to a recipe", EnvName)
	}
	recipes := make(map[string]Recipe, len(doc))
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(doc)) {
		at := strconv.Quote(key)
		fail := func(field, format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s: %s: %s", EnvName, join(at, field), fmt.Sprintf(format, args...)))
		}
		if err := checkKeyName(key); err != nil {
			fail("", "%v", err)
			continue
		}
		var kinds map[string]json.RawMessage
		if err := json.Unmarshal(doc[key], &kinds); err != nil || kinds == nil {
			fail("", "want an object with one of githubApp or oauth2")
			continue
		}
		var r Recipe
		for _, kind := range slices.Sorted(maps.Keys(kinds)) {
			switch kind {
			case KindGitHubApp:
				r.GitHubApp = &GitHubApp{}
				decodeKind(kinds[kind], r.GitHubApp, kind, fail)
				checkGitHubApp(r.GitHubApp, fail)
			case KindOAuth2:
				r.OAuth2 = &OAuth2{}
				decodeKind(kinds[kind], r.OAuth2, kind, fail)
				checkOAuth2(r.OAuth2, fail)
			default:
				fail("", "unknown field %s (want githubApp or oauth2)", strconv.Quote(kind))
			}
		}
		switch {
		case r.GitHubApp == nil && r.OAuth2 == nil:
			fail("", "want one of githubApp or oauth2")
		case r.GitHubApp != nil && r.OAuth2 != nil:
			fail("", "want one of githubApp or oauth2, not both")
		}
		recipes[key] = r
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return recipes, nil
}

// Kind reports which kind r is.
func (r Recipe) Kind() string {
	if r.GitHubApp != nil {
		return KindGitHubApp
	}
	return KindOAuth2
}

// checkKeyName checks "<project>/<KEY>": a project id and a key name as
// a run request spells them, so a dispatch's key can match it.
func checkKeyName(name string) error {
	project, key, ok := strings.Cut(name, "/")
	switch {
	case !ok:
		return errors.New(`want "<project>/<KEY>"`)
	case !runspec.IDPattern.MatchString(project):
		return fmt.Errorf("project %q: want %s", project, runspec.IDPattern)
	case !runspec.KeyNameValid(key):
		return fmt.Errorf("key %q: want an environment variable's name of at most %d characters", key, runspec.MaxKeyLength)
	}
	return nil
}

// decodeKind decodes one kind's object into dst (a pointer to its
// struct), reporting unknown fields and values of the wrong type by name.
func decodeKind(raw json.RawMessage, dst any, kind string, fail func(field, format string, args ...any)) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		fail(kind, "want an object")
		return
	}
	known := jsonFields(reflect.TypeOf(dst).Elem())
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		ft, ok := known[name]
		if !ok {
			fail(kind, "unknown field %s", strconv.Quote(name))
			continue
		}
		field := reflect.New(ft)
		if err := json.Unmarshal(fields[name], field.Interface()); err != nil {
			fail(kind+"."+name, "want %s", want(ft))
			continue
		}
		setJSONField(reflect.ValueOf(dst).Elem(), name, field.Elem())
	}
}

// jsonFields maps a struct's JSON field names to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	m := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if name := jsonName(f); name != "" {
			m[name] = f.Type
		}
	}
	return m
}

func setJSONField(v reflect.Value, name string, value reflect.Value) {
	for i := range v.NumField() {
		if jsonName(v.Type().Field(i)) == name {
			v.Field(i).Set(value)
		}
	}
}

func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if name == "-" {
		return ""
	}
	return name
}

func want(t reflect.Type) string {
	if t == reflect.TypeFor[InstallationID]() {
		return `a positive integer or "byRepository"`
	}
	return jsonstrict.Want(t)
}

// permissionName is a GitHub App permission's name (contents,
// pull_requests, organization_projects, ...).
var permissionName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

func checkGitHubApp(g *GitHubApp, fail func(field, format string, args ...any)) {
	at := func(f string) string { return KindGitHubApp + "." + f }
	switch {
	case g.AppID == 0:
		fail(at("appId"), "required")
	case g.AppID < 0:
		fail(at("appId"), "want a positive integer")
	}
	checkRef(g.PrivateKeySecret, at("privateKeySecret"), fail)
	if g.InstallationID == (InstallationID{}) {
		fail(at("installationId"), `required (the installation's id, or "byRepository")`)
	}
	if len(g.Permissions) == 0 {
		fail(at("permissions"), "required (name -> read|write): a token never gets the App's every permission by default")
	}
	for _, name := range slices.Sorted(maps.Keys(g.Permissions)) {
		switch {
		case !permissionName.MatchString(name):
			fail(at("permissions"), "%q: not a permission's name", name)
		case g.Permissions[name] != "read" && g.Permissions[name] != "write":
			fail(at("permissions")+"."+name, "want read or write")
		}
	}
	if g.APIURL != "" {
		g.APIURL = strings.TrimSuffix(g.APIURL, "/")
		checkHTTPS(g.APIURL, at("apiUrl"), false, fail)
	}
}

// scopeToken is a scope as RFC 6749 section 3.3 allows it.
var scopeToken = regexp.MustCompile(`^[\x21\x23-\x5B\x5D-\x7E]+$`)

func checkOAuth2(o *OAuth2, fail func(field, format string, args ...any)) {
	at := func(f string) string { return KindOAuth2 + "." + f }
	if o.TokenURL == "" {
		fail(at("tokenUrl"), "required")
	} else {
		checkHTTPS(o.TokenURL, at("tokenUrl"), true, fail)
	}
	if o.ClientID == "" {
		fail(at("clientId"), "required")
	}
	checkRef(o.ClientSecretSecret, at("clientSecretSecret"), fail)
	checkRef(o.RefreshTokenSecret, at("refreshTokenSecret"), fail)
	seen := map[string]bool{}
	for i, s := range o.Scopes {
		field := at("scopes") + "[" + strconv.Itoa(i) + "]"
		switch {
		case !scopeToken.MatchString(s):
			fail(field, "want a scope: printable, no space, quote or backslash")
		case seen[s]:
			fail(field, "%q given twice", s)
		}
		seen[s] = true
	}
}

// checkHTTPS requires an absolute https URL with no credentials or
// fragment (a query only where allowQuery): the provider's answer is a
// credential, and a URL's userinfo would be one written in config.
func checkHTTPS(raw, field string, allowQuery bool, fail func(field, format string, args ...any)) {
	u, err := url.Parse(raw)
	switch {
	case err != nil || u.Host == "":
		fail(field, "want an absolute https URL")
	case u.Scheme != "https":
		fail(field, "want an https URL, not %s", u.Scheme)
	case u.User != nil:
		fail(field, "must not carry credentials")
	case u.Fragment != "" || u.RawFragment != "" || strings.Contains(raw, "#"):
		fail(field, "must not have a fragment")
	case !allowQuery && (u.RawQuery != "" || u.ForceQuery):
		fail(field, "must not have a query")
	}
}

// Secret references.
const refFilePrefix = "file:"

// smRef is a Secrets Manager secret's name (letters, digits and /_+=.@-)
// or ARN.
var smRef = regexp.MustCompile(`^[A-Za-z0-9/_+=.@:-]+$`)

// maxRefLength is a secret ARN's longest.
const maxRefLength = 2048

// CheckRef reports whether ref is a secret reference: `file:<path>` or a
// Secrets Manager secret id or ARN.
func CheckRef(ref string) error {
	if path, ok := strings.CutPrefix(ref, refFilePrefix); ok {
		if path == "" {
			return errors.New("file: needs a path")
		}
		return nil
	}
	if len(ref) > maxRefLength || !smRef.MatchString(ref) {
		return errors.New("want file:<path> or a Secrets Manager secret id or ARN")
	}
	return nil
}

func checkRef(ref, field string, fail func(field, format string, args ...any)) {
	if ref == "" {
		fail(field, "required (file:<path> or a Secrets Manager secret id)")
		return
	}
	if err := CheckRef(ref); err != nil {
		fail(field, "%v", err)
	}
}

// MarshalJSON writes the id as a number, or "byRepository".
func (id InstallationID) MarshalJSON() ([]byte, error) {
	if id.ByRepository {
		return json.Marshal(ByRepository)
	}
	return json.Marshal(id.ID)
}

// UnmarshalJSON reads a positive integer or the string "byRepository";
// null leaves id unset.
func (id *InstallationID) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	switch {
	case string(data) == "null":
		return nil
	case len(data) > 0 && data[0] == '"':
		var s string
		if err := json.Unmarshal(data, &s); err != nil || s != ByRepository {
			return errors.New(`installationId: want a positive integer or "byRepository"`)
		}
		*id = InstallationID{ByRepository: true}
		return nil
	}
	n, err := strconv.ParseInt(string(data), 10, 64)
	if err != nil || n <= 0 {
		return errors.New(`installationId: want a positive integer or "byRepository"`)
	}
	*id = InstallationID{ID: n}
	return nil
}

func join(at, field string) string {
	if field == "" {
		return at
	}
	return at + "." + field
}
