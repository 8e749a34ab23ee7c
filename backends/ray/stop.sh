#!/usr/bin/env bash
# Stop the Ray head that start.sh started, by its PID file (its whole process group).
#
#   backends/ray/stop.sh [--dir DIR] [--kill]
#
# SIGTERM to the head's process group, then SIGKILL after 15 s (at once with --kill).
# Never `ray stop`: it kills every Ray process on the machine by name.
set -euo pipefail

DIR="${AUTORESEARCH_RAY_DIR:-${TMPDIR:-/tmp}/autoresearch-ray}"
SIG=TERM
while [ $# -gt 0 ]; do
    case "$1" in
        --dir) DIR="$2"; shift 2 ;;
        --kill) SIG=KILL; shift ;;
        -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
        *) echo "stop.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
PIDFILE="$DIR/head.pid"
[ -f "$PIDFILE" ] || { echo "no Ray head from this kit in $DIR (no head.pid)"; exit 0; }
PID="$(cat "$PIDFILE")"
case "$PID" in ''|*[!0-9]*) echo "stop.sh: $PIDFILE does not hold a PID" >&2; exit 2 ;; esac
# start.sh ran the head with setsid: its PID is its process group's id.
kill -"$SIG" -- "-$PID" 2>/dev/null || true
for _ in $(seq 150); do
    kill -0 -- "-$PID" 2>/dev/null || break
    sleep 0.1
done
kill -KILL -- "-$PID" 2>/dev/null || true
rm -f "$PIDFILE"
echo "Ray head $PID stopped"
