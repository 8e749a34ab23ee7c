#!/usr/bin/env bash
# Start a local single-node Ray head for autoresearch (see README.md beside this file).
#
#   backends/ray/start.sh [--dir DIR] [--num-gpus N] [--num-cpus N] [--port P] [--dashboard-port P]
#
# Runs `ray start --head --block` in its own session, in the background, with its PID in
# DIR/head.pid and its output in DIR/head.log; waits until the Jobs API answers on
# http://127.0.0.1:DASHBOARD_PORT. Ports stay on 127.0.0.1; all but --port and --dashboard-port are chosen free, so
# two heads (two kits, two engineers' tests) start beside each other. Stop it with stop.sh (by PID:
# never `ray stop`, which kills every Ray process on the machine by name).
set -euo pipefail

DIR="${AUTORESEARCH_RAY_DIR:-${TMPDIR:-/tmp}/autoresearch-ray}"
GPUS=0
CPUS=""
PORT=6379
DASH=8265
WAIT=120
while [ $# -gt 0 ]; do
    case "$1" in
        --dir) DIR="$2"; shift 2 ;;
        --num-gpus) GPUS="$2"; shift 2 ;;
        --num-cpus) CPUS="$2"; shift 2 ;;
        --port) PORT="$2"; shift 2 ;;
        --dashboard-port) DASH="$2"; shift 2 ;;
        --wait) WAIT="$2"; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "start.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$GPUS" "$PORT" "$DASH" "$WAIT" ${CPUS:+"$CPUS"}; do
    case "$n" in ''|*[!0-9]*) echo "start.sh: $n is not a whole number" >&2; exit 2 ;; esac
done
command -v ray >/dev/null 2>&1 || {
    echo "start.sh: ray is not installed; hint: pip install 'autoresearch[ray]' (or 'ray[default]')" >&2; exit 2; }

mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
PIDFILE="$DIR/head.pid"
if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    echo "a Ray head from this kit is already running (pid $(cat "$PIDFILE"), dir $DIR)"; exit 0
fi
# Ray's sockets live under its temp dir; a Unix socket path must stay short.
TEMP="$DIR/t"
mkdir -p "$TEMP"

# Every other port the head opens is chosen free here (Ray's defaults are fixed: the client server
# on 10001, the dashboard agent on 52365, ...), so two kits' heads start beside each other.
launch() {
    read -r CLIENT AGENT AGENT_GRPC RUNTIME_ENV METRICS NODE_MANAGER OBJECT_MANAGER < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(7)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
for s in socks:
    s.close()
PY
)
    echo "$CLIENT" > "$DIR/client.port"
    export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0
    args=(--head --block --node-ip-address=127.0.0.1 --port="$PORT" --num-gpus="$GPUS"
          --include-dashboard=true --dashboard-host=127.0.0.1 --dashboard-port="$DASH"
          --ray-client-server-port="$CLIENT" --dashboard-agent-listen-port="$AGENT"
          --dashboard-agent-grpc-port="$AGENT_GRPC" --runtime-env-agent-port="$RUNTIME_ENV"
          --metrics-export-port="$METRICS" --node-manager-port="$NODE_MANAGER" --object-manager-port="$OBJECT_MANAGER"
          --temp-dir="$TEMP" --disable-usage-stats)
    [ -n "$CPUS" ] && args+=(--num-cpus="$CPUS")
    setsid ray start "${args[@]}" >>"$DIR/head.log" 2>&1 < /dev/null &
    echo $! > "$PIDFILE"
    echo "$DASH" > "$DIR/dashboard.port"
}

# `ray start` gives its raylet a fixed 30 s to register with the GCS and exits when it has not: on a
# loaded machine (a test suite on 2 cores) that happens now and then. A head that exits while starting
# is started once more, its leftovers stopped first; a second failure is reported with its log.
: > "$DIR/head.log"
launch
tries=1

# Ready means a job can be submitted (the dashboard answers before its job agent does): submit
# a no-op job until the Jobs API takes it.
deadline=$((SECONDS + WAIT))
until python - "$DASH" <<'PY' 2>/dev/null
import json, sys, time, urllib.request
body = json.dumps({"entrypoint": "true", "submission_id": f"autoresearch-kit-ready-{time.time():.0f}"}).encode()
request = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/api/jobs/", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
urllib.request.urlopen(request, timeout=10).read()
PY
do
    if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        kill -KILL -- "-$(cat "$PIDFILE")" 2>/dev/null || true  # what the failed start left in its group
        if [ "$tries" -lt 2 ] && [ $SECONDS -lt $deadline ]; then
            echo "start.sh: the Ray head exited while starting; starting it once more" >> "$DIR/head.log"
            tries=$((tries + 1))
            launch
            continue
        fi
        echo "start.sh: the Ray head exited; its log ($DIR/head.log) ends:" >&2; tail -20 "$DIR/head.log" >&2
        rm -f "$PIDFILE"; exit 1
    fi
    if [ $SECONDS -ge $deadline ]; then
        echo "start.sh: the Jobs API did not answer on 127.0.0.1:$DASH within ${WAIT}s; see $DIR/head.log" >&2
        exit 1
    fi
    sleep 0.5
done
echo "Ray head up: pid $(cat "$PIDFILE"), Jobs API http://127.0.0.1:$DASH, dir $DIR"
