#!/usr/bin/env bash
# Installs the agents' CLIs from npm (Claude Code, OpenAI Codex) into PREFIX
# and runs tests/agents: each CLI as an edge task, with
# infra/edge.example.json's entries as written, through the secrets proxy to
# a fake of its vendor's API. Not part of `make test`: it needs the npm
# registry and root (edge runs tasks as nobody).
#
# Usage: e2e-agents.sh PREFIX CLAUDE_CODE_VERSION CODEX_VERSION
#
# Tasks run as nobody, so the install must be reachable by nobody: every
# directory above PREFIX traversable (a checkout under /root is not), files
# a+rX (npm's under umask 022). Not under /tmp or /var/tmp either: a task
# gets private ones and sees nothing of the host's there.
set -euo pipefail
prefix=${1:?usage: e2e-agents.sh PREFIX CLAUDE_CODE_VERSION CODEX_VERSION}
claude_version=${2:?claude code version}
codex_version=${3:?codex version}
cd "$(dirname "$0")/../.."

if [ "$(id -u)" != 0 ]; then
	echo "e2e-agents: run as root: edge runs its tasks as nobody" >&2
	exit 2
fi
umask 022
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd -P)
case $prefix/ in
/tmp/* | /var/tmp/* | /dev/shm/*)
	echo "e2e-agents: AGENTS_PREFIX $prefix is under a temporary dir, which tasks get a private one of: choose another" >&2
	exit 2
	;;
esac
if ! setpriv --reuid=nobody --regid=nogroup --clear-groups -- test -x "$prefix"; then
	echo "e2e-agents: nobody (the task user) cannot reach $prefix (a checkout under /root?):" >&2
	echo "  make e2e-agents AGENTS_PREFIX=/opt/runfleet-e2e-agents" >&2
	exit 2
fi

echo "installing @anthropic-ai/claude-code@$claude_version and @openai/codex@$codex_version into $prefix"
# Claude Code's postinstall puts its native binary in place of
# bin/claude.exe; the test runs each CLI's --version as nobody first.
npm install -g --prefix "$prefix" --no-fund --no-audit --loglevel=error \
	"@anthropic-ai/claude-code@$claude_version" "@openai/codex@$codex_version"

E2E_AGENTS_PREFIX=$prefix go test -race -tags e2eagents -count=1 -v -timeout 15m ./tests/agents/
