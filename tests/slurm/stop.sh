#!/usr/bin/env bash
# Stop the daemons tests/slurm/start.sh started (found by their pid files only) and remove its config.
# Idempotent: missing pid files or dead processes are fine. Jobs still in this test cluster are cancelled first.
set -uo pipefail

STATE="${DECODE_GAP_SLURM_STATE:-/tmp/decode-gap-slurm}"
MARKER="# decode-gap single-node test cluster"
CONF="$(cat "$STATE/run/conf-path" 2>/dev/null || echo "${SLURM_CONF:-/etc/slurm/slurm.conf}")"

pid_of() {  # pid_of PIDFILE NAME: the pid, if the file names a running process called NAME
    local pid
    [ -s "$1" ] || return 1
    pid="$(cat "$1")"
    [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$2" ] && echo "$pid"
}

stop() {  # stop PIDFILE NAME
    local pid
    pid="$(pid_of "$1" "$2")" || { rm -f "$1"; return 0; }
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 30); do
        [ -d "/proc/$pid" ] || break
        sleep 0.5
    done
    if [ -d "/proc/$pid" ]; then
        echo "tests/slurm/stop.sh: $2 ($pid) ignored SIGTERM; sending SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$1"
    echo "slurm: stopped $2 ($pid)"
}

# Cancel what is left in this cluster (only while our controller runs, so a real cluster is never touched).
if pid_of "$STATE/run/slurmctld.pid" slurmctld >/dev/null && grep -q "^$MARKER" "$CONF" 2>/dev/null; then
    ids="$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')"
    if [ -n "${ids// /}" ]; then
        # shellcheck disable=SC2086
        scancel $ids 2>/dev/null
        sleep 2
    fi
fi

stop "$STATE/run/slurmd.pid" slurmd
stop "$STATE/run/slurmctld.pid" slurmctld
stop "$STATE/run/munged.pid" munged

if [ -f "$CONF" ] && grep -q "^$MARKER" "$CONF"; then
    rm -f "$CONF"
fi
rm -f "$STATE/run/conf-path"
exit 0
