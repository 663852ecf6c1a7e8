package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
