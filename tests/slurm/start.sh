#!/usr/bin/env bash
# Start a single-node SLURM cluster on this host: munged, slurmctld and slurmd, as root, bound to 127.0.0.1.
# Idempotent: a daemon whose pid file names a live process is left alone. Stop with tests/slurm/stop.sh.
#
# Environment (all optional):
#   DECODE_GAP_SLURM_STATE   state dir (spool, logs, pid files, munge key)   [/tmp/decode-gap-slurm]
#   DECODE_GAP_SLURM_PORTS   "slurmctld_port slurmd_port"                    ["16817 16818"]
#   DECODE_GAP_SLURM_MEM_MB  RealMemory of the node                          [what `slurmd -C` reports]
#   SLURM_CONF               where the config goes; jobs' `srun` reads the default path, so keep it
#                            [/etc/slurm/slurm.conf]; an existing file not written by this script is never replaced.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${DECODE_GAP_SLURM_STATE:-/tmp/decode-gap-slurm}"
read -r CTLD_PORT SLURMD_PORT <<<"${DECODE_GAP_SLURM_PORTS:-16817 16818}"
CONF="${SLURM_CONF:-/etc/slurm/slurm.conf}"
MARKER="# decode-gap single-node test cluster"

die() { echo "tests/slurm/start.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (slurmd runs jobs as their submitting user)"
for bin in munged slurmctld slurmd sinfo scontrol; do
    command -v "$bin" >/dev/null || die "'$bin' not found: apt-get install -y slurm-wlm munge"
done

alive() {  # alive PIDFILE NAME: the pid file names a running process called NAME
    local pid
    [ -s "$1" ] || return 1
    pid="$(cat "$1")"
    [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$2" ]
}

mkdir -p "$STATE"/{munge,spool/ctld,spool/d,run,log}
chmod 0755 "$STATE"
chmod 0700 "$STATE/munge"

# --- the config: node shape from what slurmd itself detects, so the node is never drained as too small
HOST="$(hostname -s)"
DETECTED="$(slurmd -C | head -1)"
field() { sed -n "s/.*\b$1=\([0-9]*\).*/\1/p" <<<"$DETECTED"; }
CPUS="$(field CPUs)"; BOARDS="$(field Boards)"; SOCKETS="$(field SocketsPerBoard)"
CORES="$(field CoresPerSocket)"; THREADS="$(field ThreadsPerCore)"
MEM_MB="${DECODE_GAP_SLURM_MEM_MB:-$(field RealMemory)}"
[ -n "$CPUS" ] && [ -n "$MEM_MB" ] || die "could not read CPUs/RealMemory from 'slurmd -C': $DETECTED"

if [ -e "$CONF" ] && ! grep -q "^$MARKER" "$CONF"; then
    die "$CONF exists and was not written by this script; refusing to replace it"
fi
mkdir -p "$(dirname "$CONF")"
sed -e "s|@HOST@|$HOST|g" -e "s|@STATE@|$STATE|g" -e "s|@CTLD_PORT@|$CTLD_PORT|g" \
    -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" -e "s|@CPUS@|$CPUS|g" -e "s|@BOARDS@|${BOARDS:-1}|g" \
    -e "s|@SOCKETS@|${SOCKETS:-1}|g" -e "s|@CORES@|${CORES:-$CPUS}|g" -e "s|@THREADS@|${THREADS:-1}|g" \
    -e "s|@MEM_MB@|$MEM_MB|g" "$HERE/slurm.conf.in" >"$CONF.tmp.$$"
mv "$CONF.tmp.$$" "$CONF"
echo "$CONF" >"$STATE/run/conf-path"

# --- munge, on a private key and socket
if ! alive "$STATE/run/munged.pid" munged; then
    if [ ! -s "$STATE/munge/munge.key" ]; then
        dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
        chmod 0400 "$STATE/munge/munge.key"
    fi
    munged --force --key-file="$STATE/munge/munge.key" --socket="$STATE/munge/munge.socket" \
        --pid-file="$STATE/run/munged.pid" --log-file="$STATE/log/munged.log" \
        --seed-file="$STATE/munge/munged.seed"
fi

# --- slurmctld (-c: start from a clean job state) and slurmd; both write their pid files themselves
if ! alive "$STATE/run/slurmctld.pid" slurmctld; then
    slurmctld -c -f "$CONF"
fi
if ! alive "$STATE/run/slurmd.pid" slurmd; then
    slurmd -f "$CONF"
fi

# --- wait until the node takes jobs
for _ in $(seq 1 60); do
    st="$(sinfo -h -n "$HOST" -o %T 2>/dev/null | head -1 || true)"
    case "$st" in
        idle|mixed|allocated|completing) echo "slurm: node $HOST $st (state in $STATE, config $CONF)"; exit 0 ;;
        down*|drain*|drained*) scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 1
done
echo "--- slurmctld.log" >&2; tail -20 "$STATE/log/slurmctld.log" >&2 || true
echo "--- slurmd.log" >&2; tail -20 "$STATE/log/slurmd.log" >&2 || true
die "node $HOST did not become idle within 60 s (last state: '${st:-none}')"
