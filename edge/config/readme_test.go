package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/runner"
)

// The README's edge configuration table states each default as a value;
// the code names it once, in the component that applies it. This holds
// the table to what Defaults fills in.
func TestREADMEStatesTheDefaults(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := readmeTable(t, string(b), "## Configuration (edge)")

	c := &Config{DataDir: "<dataDir>", Secrets: Secrets{AWSSecretsManager: &AWSSecretsManager{}}}
	c.Defaults()
	code := func(s string) string { return "`" + s + "`" }
	l := c.Runner.Limits
	want := map[string]string{
		"`api.listen`":                     code(c.API.Listen),
		"`proxy.listen`":                   code(c.Proxy.Listen),
		"`proxy.egress`":                   code(c.Proxy.Egress),
		"`proxy.upstream.resolver`":        code(c.Proxy.Upstream.Resolver),
		"`proxy.audit.maxBytes`, `keep`":   fmt.Sprintf("%s, %d", readmeSize(c.Proxy.Audit.MaxBytes, " "), c.Proxy.Audit.Keep),
		"`proxy.ledger.maxRecords`":        code(fmt.Sprint(c.Proxy.Ledger.MaxRecords)),
		"`ca.lifetime`":                    code(readmeDuration(c.CA.Lifetime)),
		"`ca.successorWindow`":             code(readmeDuration(c.CA.SuccessorWindow)),
		"`ca.switchBefore`":                code(readmeDuration(c.CA.SwitchBefore)),
		"`ca.leafLifetime`":                code(readmeDuration(c.CA.LeafLifetime)),
		"`ca.sealKeyFile`":                 code(c.CA.SealKeyFile),
		"`runner.user`":                    code(c.Runner.User),
		"`runner.insecureSameUser`":        code(fmt.Sprint(c.Runner.InsecureSameUser)),
		"`runner.egress`":                  code(c.Runner.Egress),
		"`runner.workDir`":                 code(c.Runner.WorkDir),
		"`runner.maxConcurrent`":           code(fmt.Sprint(c.Runner.MaxConcurrent)),
		"`runner.maxDuration`":             code(readmeDuration(c.Runner.MaxDuration)),
		"`runner.maxOutputBytes`":          readmeSize(c.Runner.MaxOutputBytes, " "),
		"`runner.drainTimeout`":            code(readmeDuration(c.Runner.DrainTimeout)),
		"`runner.retention`":               code(readmeDuration(c.Runner.Retention)),
		"`runner.cancelGrace`":             code(readmeDuration(c.Runner.CancelGrace)),
		"`runner.limits`":                  code(fmt.Sprintf(`{"memory": "%s", "pids": %d, "cpu": %g}`, readmeSize(int64(l.Memory), ""), l.Pids, l.CPU)),
		"`runner.minFreeBytes`":            code(`"` + readmeSize(int64(c.Runner.MinFreeBytes), "") + `"`),
		"`secrets.awsSecretsManager`":      "none",
		"`api.tokenFile`":                  "required",
		"`dataDir`":                        "required",
		"`policy.projects.<p>.keys.<KEY>`": "none",
	}
	for key, w := range want {
		row, ok := rows[key]
		if !ok {
			t.Errorf("README's edge table has no row %s", key)
			continue
		}
		if row[0] != w {
			t.Errorf("README: %s defaults to %s, the code to %s", key, row[0], w)
		}
	}
	// Defaults the table states in a row's meaning.
	for key, w := range map[string]string{
		"`secrets.awsSecretsManager`": "cached `cacheTtl` (default " + readmeDuration(c.Secrets.AWSSecretsManager.CacheTTL) + ")",
		"`runner.minFreeBytes`":       "at least " + readmeSize(runner.MinMinFreeBytes, " "),
	} {
		if row, ok := rows[key]; !ok || !strings.Contains(row[1], w) {
			t.Errorf("README: %s's meaning does not say %q: %q", key, w, row)
		}
	}
}

// readmeTable returns the rows of the first table under heading, by their
// first cell: the default and the meaning.
func readmeTable(t *testing.T, md, heading string) map[string][2]string {
	t.Helper()
	_, section, ok := strings.Cut(md, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README has no %q", heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	rows := map[string][2]string{}
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.SplitN(strings.TrimSuffix(strings.TrimPrefix(line, "| "), " |"), " | ", 3)
		if len(cells) != 3 {
			t.Fatalf("README row %q: want three cells", line)
		}
		rows[cells[0]] = [2]string{cells[1], cells[2]}
	}
	if len(rows) == 0 {
		t.Fatalf("README has no table under %q", heading)
	}
	return rows
}

// readmeDuration writes d as the README does: "2h", not "2h0m0s".
func readmeDuration(d Duration) string {
	s := d.D().String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// readmeSize writes n in the largest binary unit that divides it, as the
// README does: "64 MiB" in prose (sep " "), "4GiB" in a JSON value.
func readmeSize(n int64, sep string) string {
	for _, u := range []struct {
		name string
		size int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return fmt.Sprintf("%d%s%s", n/u.size, sep, u.name)
		}
	}
	return fmt.Sprint(n)
}
