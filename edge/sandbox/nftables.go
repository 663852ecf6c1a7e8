package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"time"
)

// DefaultNFT is where Debian's nftables package installs nft.
const DefaultNFT = "/usr/sbin/nft"

// nftTimeout bounds one nft run: it only guards against a hung command
// (a wall-clock bound on an outside process, not a timing of ours).
const nftTimeout = 30 * time.Second

// tableName is what NFTables accepts as a table name: an nft identifier,
// so nothing of it can be read as nft syntax.
var tableName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// NFTables is the host-wide backstop of tasks' confinement: an nftables
// table of edge's own (family inet: IPv4 and IPv6) whose output chain
// refuses every packet a socket of a task's group sends in edge's network
// namespace, loopback included. Every process of a task runs in a network
// of its own (Network), where this table does not apply; a task's process
// found in edge's namespace is a bug, and this keeps it from the network
// and from the host's loopback services. It runs nft (the nftables
// command), so edge needs CAP_NET_ADMIN.
type NFTables struct {
	// Table names the table: lower-case letters, digits and underscores,
	// starting with a letter. Required.
	Table string
	// NFT is the nft executable; default DefaultNFT.
	NFT string
}

// Install replaces the table (one that an edge which crashed left behind
// included) with one that confines the groups firstGID to lastGID, in one
// nft transaction: the old rules hold until the new ones do.
func (n NFTables) Install(firstGID, lastGID uint32) error {
	ruleset, err := confinement(n.Table, firstGID, lastGID)
	if err != nil {
		return err
	}
	return n.run(ruleset)
}

// Remove deletes the table; a table that is not there is no error.
func (n NFTables) Remove() error {
	if !tableName.MatchString(n.Table) {
		return fmt.Errorf("sandbox: nftables table name %q: want lower-case letters, digits and underscores", n.Table)
	}
	return n.run(declareAndDelete(n.Table))
}

// declareAndDelete declares the table (which creates it if missing) and
// deletes it, so the deletion cannot fail for want of a table.
func declareAndDelete(table string) string {
	return "table inet " + table + "\ndelete table inet " + table + "\n"
}

// confinement is the ruleset Install loads. Its inputs are validated here,
// so the text holds nothing but what this function writes.
func confinement(table string, firstGID, lastGID uint32) (string, error) {
	if !tableName.MatchString(table) {
		return "", fmt.Errorf("sandbox: nftables table name %q: want lower-case letters, digits and underscores", table)
	}
	if firstGID == 0 || firstGID > lastGID {
		return "", fmt.Errorf("sandbox: group range %d-%d is empty or includes root's group", firstGID, lastGID)
	}
	// meta skgid is the group of the credentials that opened the socket,
	// which a task (an unprivileged process with no new privileges) cannot
	// change. A dropped packet fails its send with EPERM, but TCP ignores
	// that error on a SYN and retries for minutes: a connect is answered
	// with a reset instead, so it fails at once (ECONNREFUSED).
	return declareAndDelete(table) + fmt.Sprintf(`table inet %[1]s {
	chain output {
		type filter hook output priority filter; policy accept;
		meta skgid %[2]d-%[3]d meta l4proto tcp reject with tcp reset
		meta skgid %[2]d-%[3]d drop
	}
}
`, table, firstGID, lastGID), nil
}

func (n NFTables) run(ruleset string) error {
	nft := n.NFT
	if nft == "" {
		nft = DefaultNFT
	}
	ctx, cancel := context.WithTimeout(context.Background(), nftTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, nft, "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		if len(msg) > 512 {
			msg = msg[:512]
		}
		if msg != "" {
			return fmt.Errorf("sandbox: running %s: %w: %s", nft, err, msg)
		}
		return fmt.Errorf("sandbox: running %s: %w", nft, err)
	}
	return nil
}
