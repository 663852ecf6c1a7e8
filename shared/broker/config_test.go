package broker_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/runfleet/runfleet/shared/broker"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

const goodDoc = `{
  "acme/GH": {"githubApp": {"appId": 42, "privateKeySecret": "file:app.pem", "installationId": "byRepository",
    "permissions": {"contents": "write", "pull_requests": "read"}, "apiUrl": "https://ghe.example/api/v3/"}},
  "acme/GH_FIXED": {"githubApp": {"appId": 42, "privateKeySecret": "arn:aws:secretsmanager:us-east-1:123456789012:secret:app-AbCdEf",
    "installationId": 7, "permissions": {"contents": "read"}}},
  "acme/DRIVE": {"oauth2": {"tokenUrl": "https://oauth2.example/token", "clientId": "cid",
    "clientSecretSecret": "runfleet/drive-client", "refreshTokenSecret": "file:/etc/runfleet/drive.rt", "scopes": ["drive.readonly", "email"]}}
}`

func TestParseReadsEveryKind(t *testing.T) {
	got, err := broker.Parse([]byte(goodDoc))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]broker.Recipe{
		"acme/GH": {GitHubApp: &broker.GitHubApp{AppID: 42, PrivateKeySecret: "file:app.pem",
			InstallationID: broker.InstallationID{ByRepository: true},
			Permissions:    map[string]string{"contents": "write", "pull_requests": "read"},
			APIURL:         "https://ghe.example/api/v3"}},
		"acme/GH_FIXED": {GitHubApp: &broker.GitHubApp{AppID: 42,
			PrivateKeySecret: "arn:aws:secretsmanager:us-east-1:123456789012:secret:app-AbCdEf",
			InstallationID:   broker.InstallationID{ID: 7}, Permissions: map[string]string{"contents": "read"}}},
		"acme/DRIVE": {OAuth2: &broker.OAuth2{TokenURL: "https://oauth2.example/token", ClientID: "cid",
			ClientSecretSecret: "runfleet/drive-client", RefreshTokenSecret: "file:/etc/runfleet/drive.rt",
			Scopes: []string{"drive.readonly", "email"}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Parse:\n got %#v\nwant %#v", got, want)
	}
	if got["acme/GH"].Kind() != broker.KindGitHubApp || got["acme/DRIVE"].Kind() != broker.KindOAuth2 {
		t.Fatal("Kind does not report the recipe's kind")
	}
	// What Parse read writes back as it was written, so a recipe can be
	// shown (it holds references, never values).
	b, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	again, err := broker.Parse(b)
	if err != nil || !reflect.DeepEqual(again, got) {
		t.Fatalf("round trip through %s: %v, %#v", b, err, again)
	}
	if !strings.Contains(string(b), `"installationId":"byRepository"`) || !strings.Contains(string(b), `"installationId":7`) {
		t.Fatalf("installationId not written as given: %s", b)
	}
	if none, err := broker.Parse([]byte(`{}`)); err != nil || len(none) != 0 {
		t.Fatalf("an empty document: %v, %v", none, err)
	}
}

func TestParseNamesTheFieldAtFault(t *testing.T) {
	gh := func(fields string) string {
		return `{"acme/GH": {"githubApp": {` + fields + `}}}`
	}
	const ghOK = `"appId": 1, "privateKeySecret": "s", "installationId": 3, "permissions": {"contents": "read"}`
	oa := func(fields string) string { return `{"acme/O": {"oauth2": {` + fields + `}}}` }
	const oaOK = `"tokenUrl": "https://x.example/t", "clientId": "c", "clientSecretSecret": "cs", "refreshTokenSecret": "rt"`
	for _, tc := range []struct {
		name, doc string
		want      []string // each must appear in the error
	}{
		{"not an object", `[]`, []string{`RUNFLEET_BROKER: want a JSON object`}},
		{"duplicate key", `{"acme/GH": {}, "acme/GH": {}}`, []string{`RUNFLEET_BROKER: ["acme/GH"]: the key is given more than once`}},
		{"key without project", `{"GH": {"githubApp": {}}}`, []string{`RUNFLEET_BROKER: "GH": want "<project>/<KEY>"`}},
		{"bad key name", `{"acme/1GH": {"githubApp": {}}}`, []string{`RUNFLEET_BROKER: "acme/1GH": key "1GH"`}},
		{"no kind", `{"acme/GH": {}}`, []string{`RUNFLEET_BROKER: "acme/GH": want one of githubApp or oauth2`}},
		{"both kinds", `{"acme/GH": {"githubApp": {` + ghOK + `}, "oauth2": {` + oaOK + `}}}`, []string{`"acme/GH": want one of githubApp or oauth2, not both`}},
		{"unknown kind", `{"acme/GH": {"gitlab": {}}}`, []string{`"acme/GH": unknown field "gitlab"`}},
		{"appId required", gh(`"privateKeySecret": "s", "installationId": 3, "permissions": {"contents": "read"}`),
			[]string{`RUNFLEET_BROKER: "acme/GH".githubApp.appId: required`}},
		{"appId a string", gh(`"appId": "12", "privateKeySecret": "s", "installationId": 3, "permissions": {"contents": "read"}`),
			[]string{`"acme/GH".githubApp.appId: want an integer`}},
		{"everything missing", gh(``), []string{
			`"acme/GH".githubApp.appId: required`, `"acme/GH".githubApp.privateKeySecret: required`,
			`"acme/GH".githubApp.installationId: required`, `"acme/GH".githubApp.permissions: required`}},
		{"installationId a word", gh(`"appId": 1, "privateKeySecret": "s", "installationId": "any", "permissions": {"contents": "read"}`),
			[]string{`"acme/GH".githubApp.installationId: want a positive integer or "byRepository"`}},
		{"installationId negative", gh(`"appId": 1, "privateKeySecret": "s", "installationId": -3, "permissions": {"contents": "read"}`),
			[]string{`"acme/GH".githubApp.installationId: want a positive integer or "byRepository"`}},
		{"permission level", gh(`"appId": 1, "privateKeySecret": "s", "installationId": 3, "permissions": {"contents": "admin"}`),
			[]string{`"acme/GH".githubApp.permissions.contents: want read or write`}},
		{"apiUrl http", gh(ghOK + `, "apiUrl": "http://ghe.example/api/v3"`), []string{`"acme/GH".githubApp.apiUrl: want an https URL`}},
		{"apiUrl credentials", gh(ghOK + `, "apiUrl": "https://u:p@ghe.example/api/v3"`), []string{`"acme/GH".githubApp.apiUrl: must not carry credentials`}},
		{"bad secret ref", gh(`"appId": 1, "privateKeySecret": "file:", "installationId": 3, "permissions": {"contents": "read"}`),
			[]string{`"acme/GH".githubApp.privateKeySecret: file: needs a path`}},
		{"tokenUrl required", oa(`"clientId": "c", "clientSecretSecret": "cs", "refreshTokenSecret": "rt"`),
			[]string{`RUNFLEET_BROKER: "acme/O".oauth2.tokenUrl: required`}},
		{"oauth2 missing", oa(``), []string{`"acme/O".oauth2.clientId: required`,
			`"acme/O".oauth2.clientSecretSecret: required`, `"acme/O".oauth2.refreshTokenSecret: required`}},
		{"scope with space", oa(oaOK + `, "scopes": ["a b"]`), []string{`"acme/O".oauth2.scopes[0]: want a scope`}},
		{"scopes not strings", oa(oaOK + `, "scopes": "a"`), []string{`"acme/O".oauth2.scopes: want an array of string`}},
		{"refresh token secret a ref", oa(`"tokenUrl": "https://x.example/t", "clientId": "c", "clientSecretSecret": "cs", "refreshTokenSecret": "1//0g rt value"`),
			[]string{`"acme/O".oauth2.refreshTokenSecret: want file:<path> or a Secrets Manager secret id`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := broker.Parse([]byte(tc.doc))
			if err == nil {
				t.Fatalf("Parse accepted %s", tc.doc)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not say %q", err, w)
				}
			}
		})
	}
}

// A value pasted where a reference belongs, or under a field Parse does
// not know, is never repeated in the error: the document may be printed
// in a start-up failure's log.
func TestParseErrorsQuoteNoValue(t *testing.T) {
	const secret = "ghp_S3cretValueThatMustNotLeak"
	for _, doc := range []string{
		`{"acme/GH": {"githubApp": {"appId": 1, "privateKey": "` + secret + `"}}}`,
		`{"acme/GH": {"githubApp": {"appId": "` + secret + `"}}}`,
		`{"acme/O": {"oauth2": {"tokenUrl": "https://x.example/t", "clientId": "c", "clientSecretSecret": "cs", "refreshToken": "` + secret + `"}}}`,
		`{"acme/O": {"oauth2": {"tokenUrl": "https://x.example/t", "clientId": "c", "clientSecretSecret": "cs", "refreshTokenSecret": "` + secret + ` "}}}`,
		`{"acme/GH": "` + secret + `"}`,
	} {
		_, err := broker.Parse([]byte(doc))
		if err == nil {
			t.Fatalf("Parse accepted %s", doc)
		}
		if strings.Contains(err.Error(), "S3cret") {
			t.Fatalf("the error quotes the value: %v", err)
		}
	}
}

func TestSecretsReadFilesAndSecretsManager(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rt"), []byte("refresh-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sm := secretsmanager.NewFromConfig(moto.AWSConfig())
	name := motoserver.Unique("broker-secret-")
	if _, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: aws.String(name), SecretString: aws.String(" from-sm ")}); err != nil {
		t.Fatal(err)
	}
	s := broker.NewSecrets(broker.SecretsConfig{BaseDir: dir, SecretsManager: sm})
	for ref, want := range map[string]string{
		"file:rt": "refresh-from-file", "file:" + filepath.Join(dir, "rt"): "refresh-from-file", name: "from-sm",
	} {
		if got, err := s.Read(ctx, ref); err != nil || got != want {
			t.Errorf("Read(%q) = %q, %v; want %q", ref, got, err, want)
		}
	}
	for ref, want := range map[string]string{
		"file:missing":  "missing",
		"runfleet/none": "no such secret",
		"has space":     "want file:<path> or a Secrets Manager secret id",
		"file:" + dir:   "not a regular file",
	} {
		if _, err := s.Read(ctx, ref); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Read(%q): %v; want an error saying %q", ref, err, want)
		}
	}
	noBase := broker.NewSecrets(broker.SecretsConfig{SecretsManager: sm})
	if _, err := noBase.Read(ctx, "file:rt"); err == nil || !strings.Contains(err.Error(), "relative") {
		t.Errorf("a relative file read without a base: %v", err)
	}
}

func TestLoadResolvesReferencesBesideTheFile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	doc := `{"acme/O": {"oauth2": {"tokenUrl": "https://x.example/t", "clientId": "c", "clientSecretSecret": "file:cs", "refreshTokenSecret": "file:rt"}}}`
	for name, body := range map[string]string{"broker.json": doc, "cs": "client-secret", "rt": "rt"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	recipes, secrets, err := broker.Load(ctx, "file:"+filepath.Join(dir, "broker.json"), broker.SecretsConfig{})
	if err != nil || len(recipes) != 1 {
		t.Fatalf("Load: %v, %v", recipes, err)
	}
	if v, err := secrets.Read(ctx, recipes["acme/O"].OAuth2.ClientSecretSecret); err != nil || v != "client-secret" {
		t.Fatalf("reading a reference beside the file: %q, %v", v, err)
	}

	sm := secretsmanager.NewFromConfig(moto.AWSConfig())
	name := motoserver.Unique("broker-doc-")
	if _, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: aws.String(name), SecretString: aws.String(doc)}); err != nil {
		t.Fatal(err)
	}
	recipes, secrets, err = broker.Load(ctx, name, broker.SecretsConfig{SecretsManager: sm, BaseDir: dir})
	if err != nil || len(recipes) != 1 {
		t.Fatalf("Load from Secrets Manager: %v, %v", recipes, err)
	}
	if _, err := secrets.Read(ctx, "file:cs"); err == nil {
		t.Fatal("a document from Secrets Manager resolved a relative file reference")
	}
	if r, s, err := broker.Load(ctx, "", broker.SecretsConfig{}); r != nil || s != nil || err != nil {
		t.Fatalf("an empty RUNFLEET_BROKER: %v %v %v", r, s, err)
	}
	if _, _, err := broker.Load(ctx, "file:"+filepath.Join(dir, "cs"), broker.SecretsConfig{}); err == nil || strings.Contains(err.Error(), "client-secret") {
		t.Fatalf("a document that is not JSON: %v", err)
	}
}
