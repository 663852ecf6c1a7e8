#!/bin/sh
# demo-run.sh: dispatch a run and follow its stream in one go, with curl.
#
#   infra/scripts/demo-run.sh DISPATCH_URL TOKEN BODY
#
# POSTs BODY (a POST /fleet/runs body) to DISPATCH_URL (Fleet's
# .../fleet/runs) with TOKEN as the bearer, prints the answer, then follows
# the stream the answer links (links.stream: no path is assembled here),
# printing it as it comes, and reconnects from the last event seen when the
# stream ends with a retry hint (a planned end) before the run's done.
# `make dev` gives this command with its arguments filled in (its banner,
# its log's "ready" record); the usage's example is the README quick
# start's, which works as written from the repository's folder with
# `make dev` running on its defaults.
#
# Exit status: 0 when the run ended succeeded; 1 when the dispatch was
# answered with anything but 2xx (a refusal: the answer says why), when the
# run ended otherwise, or when the answer or the stream was not what Fleet
# sends; curl's own status when curl failed (7: Fleet not reachable); 2 on
# wrong usage.
#
# The answer is the compact JSON Fleet writes (no whitespace between
# tokens), so sed finds the link: a URL holds no '"', and a '"stream":"'
# inside a string value would be escaped (\"stream\":\"), so it cannot be
# mistaken for the key. No jq or python needed.
set -u

if [ $# -ne 3 ]; then
	cat >&2 <<-EOF
	usage: $0 DISPATCH_URL TOKEN BODY
	e.g., from the repository's folder with make dev running on its defaults: a run of the demo
	agent, the demo caller's token read from the data dir, the demo secret declared for its domain:
	  infra/scripts/demo-run.sh http://127.0.0.1:8080/fleet/runs "\$(cat .dev/demo-caller-token)" '{"agent":"demo","prompt":"hello","secrets":[{"projectId":"demo","key":"DEMO_API_KEY","domains":["api.demo.test:7443"]}]}'
	EOF
	exit 2
fi
dispatch_url=$1 token=$2 body=$3

tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The dispatch: the answer to a file, the status apart.
code=$(curl -sS -o "$tmp/answer" -w '%{http_code}' -H "Authorization: Bearer $token" \
	-H 'Content-Type: application/json' --data-binary "$body" "$dispatch_url") || exit $?
awk 1 "$tmp/answer" # the answer, ending with a newline
case $code in
2??) ;;
*)
	echo "demo-run.sh: the dispatch was answered HTTP $code (above: why)" >&2
	exit 1
	;;
esac
stream=$(sed -n 's/.*"links":{[^}]*"stream":"\([^"]*\)".*/\1/p' "$tmp/answer")
if [ -z "$stream" ]; then
	echo "demo-run.sh: the answer links no stream (links.stream)" >&2
	exit 1
fi

# The stream, printed as it comes and kept, until done. curl's status
# leaves the pipe through a file (POSIX sh has no pipefail).
last=
while :; do
	: >"$tmp/stream"
	{
		curl -sS -N --fail-with-body -H "Authorization: Bearer $token" -H "Last-Event-ID:$last" "$stream"
		echo $? >"$tmp/rc"
	} | tee "$tmp/stream"
	rc=$(cat "$tmp/rc")
	[ "$rc" -eq 0 ] || exit "$rc"
	done_data=$(sed -n '/^event: done$/,/^data: /s/^data: //p' "$tmp/stream")
	if [ -n "$done_data" ]; then
		case $done_data in
		*'"status":"succeeded"'*) exit 0 ;;
		*) exit 1 ;;
		esac
	fi
	if ! grep -q '^retry: ' "$tmp/stream"; then
		echo "demo-run.sh: the stream ended without done or a retry hint" >&2
		exit 1
	fi
	id=$(sed -n 's/^id: //p' "$tmp/stream" | tail -n 1)
	last=${id:-$last}
	sleep 1
done
