package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("these tests change the kernel's nftables rules and mount namespaces: run them as root (as in CI)")
	}
}

// listTable is `nft list table inet <name>`: its text, or ok false when
// there is no such table.
func listTable(t *testing.T, name string) (string, bool) {
	t.Helper()
	out, err := exec.Command(DefaultNFT, "list", "table", "inet", name).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "No such file or directory") {
			return "", false
		}
		t.Fatalf("nft list table: %v: %s", err, out)
	}
	return string(out), true
}

func TestNFTablesInstallsReplacesAndRemovesItsTable(t *testing.T) {
	requireRoot(t)
	n := NFTables{Table: fmt.Sprintf("runfleet_test_%d", os.Getpid())}
	t.Cleanup(func() { n.Remove() })

	if err := n.Install(1879048192, 1879048199); err != nil {
		t.Fatal(err)
	}
	rules, ok := listTable(t, n.Table)
	if !ok || !strings.Contains(rules, `meta skgid 1879048192-1879048199 meta l4proto tcp reject with tcp reset`) ||
		!strings.Contains(rules, `meta skgid 1879048192-1879048199 drop`) || !strings.Contains(rules, "hook output") {
		t.Fatalf("the installed table is\n%s", rules)
	}
	// A second Install (an edge restarting after a crash) replaces the
	// table: the new range alone, its two rules once.
	if err := n.Install(1879048200, 1879048300); err != nil {
		t.Fatal(err)
	}
	rules, _ = listTable(t, n.Table)
	if strings.Count(rules, "meta skgid") != 2 || strings.Count(rules, "meta skgid 1879048200-1879048300") != 2 {
		t.Fatalf("after a second Install the table is\n%s", rules)
	}
	if err := n.Remove(); err != nil {
		t.Fatal(err)
	}
	if rules, ok := listTable(t, n.Table); ok {
		t.Fatalf("the table is still there after Remove:\n%s", rules)
	}
	if err := n.Remove(); err != nil {
		t.Fatalf("removing a table that is not there: %v", err)
	}
}

func TestNFTablesRefusesWhatItCannotWriteSafely(t *testing.T) {
	// nft is never run: a name or range that could change what the
	// ruleset says is refused first.
	missing := "/nonexistent/nft"
	for _, name := range []string{"", "Edge", "edge; flush ruleset", "edge\ntable inet x", "1edge", "edge-1", strings.Repeat("a", 64)} {
		n := NFTables{Table: name, NFT: missing}
		if err := n.Install(1000, 2000); err == nil || !strings.Contains(err.Error(), "table name") {
			t.Errorf("Install with table %q = %v, want a refused name", name, err)
		}
		if err := n.Remove(); err == nil || !strings.Contains(err.Error(), "table name") {
			t.Errorf("Remove with table %q = %v, want a refused name", name, err)
		}
	}
	for _, r := range [][2]uint32{{0, 10}, {20, 10}} {
		if err := (NFTables{Table: "edge", NFT: missing}).Install(r[0], r[1]); err == nil || !strings.Contains(err.Error(), "group range") {
			t.Errorf("Install of the range %d-%d = %v, want it refused", r[0], r[1], err)
		}
	}
	if err := (NFTables{Table: "edge", NFT: missing}).Install(1000, 2000); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("Install without nft = %v, want an error naming %s", err, missing)
	}
}
