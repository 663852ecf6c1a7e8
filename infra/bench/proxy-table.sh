#!/usr/bin/env bash
# The proxy performance table of the README: a real `edge serve` with a live task beside going
# direct, a stock goproxy MITM doing the same header substitution, and tlsrelay (the floor: TLS
# in, TLS out, bytes copied, no other work), all on loopback, in one run, at several
# concurrencies, in two modes:
#   keepalive-cN  N clients, one keep-alive connection each, for KA_D
#   newconn-cN    N clients, a fresh connection (CONNECT + both handshakes) per request, for NEW_D
# Direct and the relay send the real secret; goproxy and edge get the placeholder and swap it.
# The upstream answers 401 to anything but the real secret, so every run must end with 0 errors
# and 0 non-200 responses. Ratios are to direct in the same mode; client, upstream and proxy share
# the machine's CPUs, so a ratio is total CPU per request.
#
# Run from the repository's root, as root (tasks run as nobody):
#   make bench-proxy
#   CONCS="1 16" KA_D=3s NEW_D=2s infra/bench/proxy-table.sh     # a quick check
# Knobs: PROXYBENCH (the harness's proxybench Go module, default ../shared/bench/proxybench),
# CONCS (default "1 8 16 64"), KA_D (10s), NEW_D (5s), PPROF (e.g. 127.0.0.1:6060: edge's
# proxy.pprof, to profile edge during the run). Needs go, curl, python3.
set -euo pipefail
export PATH=/usr/local/go/bin:$PATH

die() { echo "proxy-table: $*" >&2; exit 2; }
[[ -f go.mod && -d edge && -d infra/bench/tlsrelay ]] || die "run from the repository's root"
[[ $EUID -eq 0 ]] || die "needs root: edge runs its tasks as nobody"
PROXYBENCH=${PROXYBENCH:-../shared/bench/proxybench}
if ! PB_SRC=$(cd "$PROXYBENCH" 2>/dev/null && pwd) || [[ ! -f $PB_SRC/go.mod ]]; then
  die "PROXYBENCH=$PROXYBENCH is not the harness's proxybench module (a directory with go.mod); set PROXYBENCH to it"
fi
CONCS=${CONCS:-1 8 16 64} KA_D=${KA_D:-10s} NEW_D=${NEW_D:-5s} PPROF=${PPROF:-}

# Under /var/lib, not /tmp: the task (nobody) must reach nothing here but what edge gives it.
W=$(mktemp -d /var/lib/edgebench.XXXXXX); chmod 711 "$W"
pids=()   # each started with setsid: a process group of its own, ended as a group
RID='' API='' H=()
stop_all() {
  local p
  if [[ -n $RID ]]; then curl -s -m 5 "${H[@]}" -X POST "http://127.0.0.1:$API/runs/$RID/cancel" >/dev/null || true; RID=; fi
  for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
  for _ in $(seq 50); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 -- "-$p" 2>/dev/null && alive=1; done
    ((alive)) || break; sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  pids=()
}
trap 'stop_all; rm -rf "$W"' EXIT
trap 'exit 130' INT TERM

port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
# wait_addr FILE PID: print the address a server wrote once it listens.
wait_addr() {
  for _ in $(seq 100); do
    [[ -s $1 ]] && { cat "$1"; return; }
    kill -0 "$2" 2>/dev/null || { echo "server $2 exited early:" >&2; cat "$W"/*.log >&2; return 1; }
    sleep 0.1
  done
  echo "timed out waiting for $1" >&2; return 1
}

echo "proxy-table: $(nproc) CPUs, $(go version | cut -d' ' -f3-), edge $(git describe --always --dirty 2>/dev/null || echo '?'),"
echo "  CONCS=\"$CONCS\" KA_D=$KA_D NEW_D=$NEW_D, load average $(cut -d' ' -f1-3 /proc/loadavg)${PPROF:+, edge pprof on $PPROF}"
go build -o "$W/edge" ./edge
go build -o "$W/tlsrelay" ./infra/bench/tlsrelay
(cd "$PB_SRC" && go build -o "$W/pb" .)
CERTDIR=$W/certs; "$W/pb" certs -certdir "$CERTDIR" >/dev/null

API=$(port); PROXY=$(port); UP_PORT=$(port); SECRET=bench-real-$RANDOM$RANDOM; TOK=host-$RANDOM$RANDOM
PIN=api.example.test=127.0.0.1
setsid "$W/pb" upstream -addr "127.0.0.1:$UP_PORT" -addr-file "$W/upstream.addr" -certdir "$CERTDIR" \
  -expect "$SECRET" 2>"$W/upstream.log" </dev/null & pids+=($!)
wait_addr "$W/upstream.addr" "${pids[-1]}" >/dev/null
setsid "$W/pb" goproxy -addr 127.0.0.1:0 -addr-file "$W/goproxy.addr" -ca-out "$W/goproxy-ca.pem" \
  -upstream-ca "$CERTDIR/ca.pem" -placeholder PB_PLACEHOLDER_TOKEN -value "$SECRET" -resolve "$PIN" \
  2>"$W/goproxy.log" </dev/null & pids+=($!)
GP=$(wait_addr "$W/goproxy.addr" "${pids[-1]}")
setsid "$W/tlsrelay" -addr 127.0.0.1:0 -addr-file "$W/relay.addr" -ca-out "$W/relay-ca.pem" \
  -upstream-ca "$CERTDIR/ca.pem" -resolve "$PIN" 2>"$W/relay.log" </dev/null & pids+=($!)
RELAY=$(wait_addr "$W/relay.addr" "${pids[-1]}")

# edge: the same config as ../shared/bench/edge-vs-peers.sh (plus proxy.pprof when PPROF is set).
( umask 077; echo -n "$TOK" > "$W/host-token"; echo "{\"acme/API_KEY\": \"$SECRET\"}" > "$W/secrets.json" )
cat > "$W/edge.json" <<JSON
{"dataDir": "$W/data", "api": {"listen": "127.0.0.1:$API", "tokenFile": "$W/host-token"},
 "proxy": {"listen": "127.0.0.1:$PROXY", "egress": "open", "upstream": {"resolver": "system",
   "resolve": {"api.example.test": "127.0.0.1"}, "allowPrivate": ["127.0.0.0/8"], "extraRootsFile": "$CERTDIR/ca.pem"}${PPROF:+,
   \"pprof\": \"$PPROF\"}},
 "ca": {"sealKeyFile": "$W/seal.key"},
 "policy": {"projects": {"acme": {"keys": {"API_KEY": {"domains": ["api.example.test:$UP_PORT"], "in": ["header"]}}}}},
 "secrets": {"file": "$W/secrets.json"}, "agents": {"shell": {"argv": ["sh", "-c", "{prompt}"]}}}
JSON
setsid "$W/edge" serve --config "$W/edge.json" > "$W/edge.log" 2>&1 < /dev/null & pids+=($!)
for _ in $(seq 150); do
  curl -s -o /dev/null -m 1 "http://127.0.0.1:$API/healthz" && break
  kill -0 "${pids[-1]}" 2>/dev/null || { cat "$W/edge.log" >&2; die "edge serve exited"; }
  sleep 0.2
done
H=(-H "Authorization: Bearer $TOK" -H 'content-type: application/json')
# A task that lives while the load runs: its proxy URL (with its credential) and placeholder.
# shellcheck disable=SC2016 # $HTTPS_PROXY and $API_KEY are the task's, expanded by its shell.
body='{"clientToken":"bench","agent":"shell","prompt":"echo P=$HTTPS_PROXY; echo K=$API_KEY; sleep 3600","secrets":[{"projectId":"acme","key":"API_KEY","domains":["api.example.test:'$UP_PORT'"]}]}'
RID=$(curl -s "${H[@]}" -X POST --data "$body" "http://127.0.0.1:$API/runs" | python3 -c 'import json,sys; print(json.load(sys.stdin)["runId"])')
ev=
for _ in $(seq 50); do
  ev=$(curl -s "${H[@]}" "http://127.0.0.1:$API/runs/$RID/events?limit=1000"); grep -q 'K=' <<<"$ev" && break; sleep 0.2; done
grep -q 'K=' <<<"$ev" || die "the task printed no placeholder (see its events: GET /runs/$RID/events)"
field() { python3 -c 'import json,sys,re; t="".join(e["data"] for e in json.load(sys.stdin)["events"] if isinstance(e.get("data"),str)); print(re.search(sys.argv[1]+r"=(\S+)", t).group(1))' "$1" <<<"$ev"; }
EDGE_URL=$(field P); PLACEHOLDER=$(field K)
"$W/edge" ca bundle --config "$W/edge.json" > "$W/edge-ca.pem"

url="https://api.example.test:$UP_PORT/x"
bad=0
# run TARGET MODE LOAD-ARGS...: one load run through TARGET, recorded as "TARGET MODE {json}".
run() {
  local target=$1 mode=$2 out
  shift 2
  case $target in
    direct)  set -- -header "Authorization: Bearer $SECRET" -ca "$CERTDIR/ca.pem" "$@" ;;
    goproxy) set -- -header "Authorization: Bearer PB_PLACEHOLDER_TOKEN" -proxy "http://user:pass@$GP" -ca "$W/goproxy-ca.pem" "$@" ;;
    relay)   set -- -header "Authorization: Bearer $SECRET" -proxy "http://user:pass@$RELAY" -ca "$W/relay-ca.pem" "$@" ;;
    edge)    set -- -header "Authorization: Bearer $PLACEHOLDER" -proxy "$EDGE_URL" -ca "$W/edge-ca.pem" "$@" ;;
  esac
  out=$("$W/pb" load -url "$url" -resolve "$PIN" "$@")
  echo "$target $mode $out" | tee -a "$W/results"
  if ! python3 -c 'import json,sys; r=json.loads(sys.argv[1]); sys.exit(1 if r["errors"] or r["non200"] else 0)' "$out"; then
    echo "!!!!! $target $mode: errors or non-200 responses: this run does not count !!!!!"
    bad=1
  fi
}

targets=(direct goproxy relay edge)
i=0
for c in $CONCS; do
  # Rotate the order per concurrency, so that no target always runs first (on a warmer or colder machine).
  order=("${targets[@]:i%4}" "${targets[@]:0:i%4}")
  for target in "${order[@]}"; do run "$target" "keepalive-c$c" -c "$c" -d "$KA_D"; done
  for target in "${order[@]}"; do run "$target" "newconn-c$c" -newconn -c "$c" -d "$NEW_D"; done
  i=$((i + 1))
done
stop_all

# The table in a fixed row order (modes as run, targets as listed), whatever order they ran in.
python3 - "$W/results" "${targets[@]}" > "$W/table" <<'PY'
import sys
lines = [l.split(" ", 2) for l in open(sys.argv[1]).read().split("\n") if l]
modes = list(dict.fromkeys(l[1] for l in lines))
order = {t: i for i, t in enumerate(sys.argv[2:])}
for l in sorted(lines, key=lambda l: (modes.index(l[1]), order[l[0]])):
    print(" ".join(l))
PY
echo
"$W/pb" report "$W/table"
echo
python3 - "$W/table" <<'PY'
import json, sys
rows = {}
for l in open(sys.argv[1]):
    t, m, j = l.split(" ", 2)
    rows.setdefault(m, {})[t] = json.loads(j)
ratio = lambda a, b: "%.2f" % (a / b) if b else "-"
print("%16s  %12s  %10s  %14s  %12s" % ("mode", "edge/goproxy", "edge/relay", "edge p50/relay", "relay/direct"))
for m, r in rows.items():
    e, g, f, d = (r.get(k, {}) for k in ("edge", "goproxy", "relay", "direct"))
    print("%16s  %12s  %10s  %14s  %12s" % (m, ratio(e.get("rps", 0), g.get("rps", 0)), ratio(e.get("rps", 0), f.get("rps", 0)),
          ratio(e.get("p50_ms", 0), f.get("p50_ms", 0)), ratio(f.get("rps", 0), d.get("rps", 0))))
print("(rps ratios, except edge p50/relay: edge's median latency over the relay's)")
PY
echo
grep '^upstream:' "$W/upstream.log" || true
echo "goproxy warnings: $(grep -c WARN "$W/goproxy.log" || true)"
if ((bad)); then
  echo "!!!!! some runs had errors or non-200 responses (marked above): the table is not valid !!!!!"
  exit 1
fi
