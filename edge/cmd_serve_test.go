package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/internal/redact"
	"github.com/runfleet/runfleet/edge/secrets"
)

// The serving itself runs as a real process in tests/edge_test.go; here,
// what edge serve says before it serves.
func TestServeRefusesBadInvocationsAndConfigs(t *testing.T) {
	dir := t.TempDir()
	noToken := filepath.Join(dir, "no-token.json")
	os.WriteFile(noToken, []byte(`{"dataDir": "`+filepath.Join(dir, "data")+`", "api": {"tokenFile": "`+filepath.Join(dir, "missing")+`"},
		"secrets": {"file": "`+filepath.Join(dir, "secrets.json")+`"}}`), 0o600)
	invalid := filepath.Join(dir, "invalid.json")
	os.WriteFile(invalid, []byte(`{"dataDir": "/d", "api": {"tokenFile": "/t"}, "runner": {"maxDurationn": "1h"}}`), 0o600)
	tests := []struct {
		args    []string
		code    int
		mention string
	}{
		{[]string{"serve"}, 2, "usage: edge serve --config edge.json"},
		{[]string{"serve", "--config"}, 2, "flag needs an argument"},
		{[]string{"serve", "--config", filepath.Join(dir, "absent.json")}, 1, "absent.json"},
		{[]string{"serve", "--config", invalid}, 1, "maxDurationn"},
		{[]string{"serve", "--config", noToken}, 1, "api.tokenFile"},
	}
	for _, tt := range tests {
		var out, errOut bytes.Buffer
		if code := run(tt.args, &out, &errOut); code != tt.code || !strings.Contains(errOut.String(), tt.mention) {
			t.Errorf("edge %v: exit %d, %q; want %d mentioning %q", tt.args, code, errOut.String(), tt.code, tt.mention)
		}
	}
}

// A kill switch set to anything but "off", "on" or nothing refuses the
// start, naming the variable: a typo must not leave the proxy up.
func TestServeRefusesAnUnknownKillSwitchValue(t *testing.T) {
	t.Setenv("EDGE_SECRETS_PROXY", "0")
	var out, errOut bytes.Buffer
	if code := run([]string{"serve", "--config", filepath.Join(t.TempDir(), "edge.json")}, &out, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), `EDGE_SECRETS_PROXY="0"`) {
		t.Errorf("exit %d, %q", code, errOut.String())
	}
}

// edge serve's log passes every line through the redactor: a value the
// proxy has read never reaches stderr, whatever logs it.
func TestServeLoggerRedactsValuesRead(t *testing.T) {
	redactor := redact.NewSet(0)
	src := secrets.Observed(valueSource{secrets.NewValue("sk-real-0123456789")}, redactor.Add)
	if _, err := src.Value(context.Background(), "acme", "K"); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	log := newLogger(&stderr, redactor)
	log.Error("a mistake", "error", fmt.Errorf("quoting %q", "sk-real-0123456789"), "url", "https://x/?k=sk-real-0123456789")
	if strings.Contains(stderr.String(), "sk-real") || strings.Count(stderr.String(), redact.Mark) != 2 {
		t.Fatalf("stderr: %s", stderr.String())
	}
}

type valueSource struct{ v secrets.Value }

func (s valueSource) Value(context.Context, string, string) (secrets.Value, error) { return s.v, nil }
