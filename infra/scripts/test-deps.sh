#!/usr/bin/env bash
# What the tests need beyond the Go toolchain, checked (and installed where a
# package manager can) so `make test` works on a fresh machine of this kind.
# With the argument "dev", only what `make dev` needs: curl (the demo task
# and the printed commands) and, as root, nftables (the local edge confines
# its tasks' egress, as edge does).
set -euo pipefail
mode=${1:-test}
case $mode in
test | dev) ;;
*)
	echo "usage: $0 [test|dev]" >&2
	exit 2
	;;
esac

need_apt=()
# Tasks run as an unprivileged user, so the clients a test task runs must be
# Debian's, usable by that user (not a tool under root's home).
[ -x /usr/bin/curl ] || need_apt+=(curl)
# edge confines tasks' egress with nftables (runner.egress "confined").
if [ "$mode" = test ] || [ "$(id -u)" = 0 ]; then
	[ -x /usr/sbin/nft ] || need_apt+=(nftables)
fi
if [ "$mode" = test ]; then
	[ -x /usr/bin/git ] || need_apt+=(git)
	/usr/bin/python3 -c 'import requests' 2>/dev/null || need_apt+=(python3-requests)
	# A real WebSocket client for the intercepted-WebSocket test (edge/host).
	/usr/bin/python3 -c 'import websockets' 2>/dev/null || need_apt+=(python3-websockets)
	# Every kind of client a task would run, run as that user by the tests:
	# wget and openssl read only the system trust store (which a task's
	# sandbox points at its trust file); Node ignores HTTPS_PROXY.
	[ -x /usr/bin/wget ] || need_apt+=(wget)
	[ -x /usr/bin/openssl ] || need_apt+=(openssl)
	[ -x /usr/bin/node ] || need_apt+=(nodejs)
	# The AWS clients a task runs through edge's SigV4 re-signing
	# (tests/kit/awsfront is their AWS): Debian's, since the task user
	# cannot run the pyenv Python's packages under root's home.
	[ -x /usr/bin/aws ] || need_apt+=(awscli)
	/usr/bin/python3 -c 'import boto3' 2>/dev/null || need_apt+=(python3-boto3)
	# Git over SSH: tasks run Debian's ssh, sftp and git (openssh-client),
	# and tests/kit/gitsshd runs Debian's sshd (openssh-server) as their
	# upstream, started by the tests alone (see below).
	[ -x /usr/bin/ssh ] && [ -x /usr/bin/sftp ] || need_apt+=(openssh-client)
	[ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
	# The tests build network namespaces with ip (iproute2).
	[ -x /usr/sbin/ip ] || need_apt+=(iproute2)
	# systemd-analyze verifies infra/systemd's unit (no running systemd needed).
	command -v systemd-analyze >/dev/null || need_apt+=(systemd)
	# The dashboard's tests drive a real headless browser: tests/kit/browser
	# runs Debian's chromium (the binary, not the /usr/bin launcher). Its
	# package brings the libraries; its fonts are only recommended, and
	# without them a screenshot shows no text.
	[ -x /usr/lib/chromium/chromium ] || need_apt+=(chromium)
	# runfleet's completion scripts are parsed and queried by the shells
	# they are for (shared/cli).
	[ -x /usr/bin/zsh ] || need_apt+=(zsh)
	[ -x /usr/bin/fish ] || need_apt+=(fish)
	[ -e /usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf ] || need_apt+=(fonts-liberation)
fi

if [ ${#need_apt[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "installing Debian packages: ${need_apt[*]}" >&2
		export DEBIAN_FRONTEND=noninteractive
		# A package's service (openssh-server's sshd on port 22) must not
		# start on this machine: where no policy-rc.d says so already, one
		# refuses every start (exit 101) for the install's length.
		policy_rc=/usr/sbin/policy-rc.d
		if [ ! -e "$policy_rc" ]; then
			printf '#!/bin/sh\nexit 101\n' >"$policy_rc"
			chmod 0755 "$policy_rc"
			trap 'rm -f "$policy_rc"' EXIT
		fi
		apt-get update -qq >/dev/null
		apt-get install -y -qq "${need_apt[@]}" >/dev/null
	else
		echo "missing Debian packages: ${need_apt[*]}; install them with: sudo apt-get install -y ${need_apt[*]}" >&2
		exit 1
	fi
fi

[ "$mode" = test ] || exit 0

# The pyenv Python's tools: template.yaml (cfn-lint, the SAM translator) and
# infra/openapi.yaml (openapi-spec-validator).
for tool in cfn-lint openapi-spec-validator; do
	if ! command -v "$tool" >/dev/null && [ ! -x "/root/.pyenv/shims/$tool" ]; then
		echo "$tool not found: install it with: pip install cfn-lint aws-sam-translator openapi-spec-validator" >&2
		exit 1
	fi
done

# moto_server is installed on these machines; the tests start and stop it.
if ! command -v moto_server >/dev/null && [ ! -x /root/.pyenv/shims/moto_server ]; then
	echo "moto_server not found: install it with: pip install 'moto[server]'" >&2
	exit 1
fi
