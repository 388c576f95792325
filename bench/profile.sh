#!/usr/bin/env bash
# Where conch's time goes, per process, under perf_analyzer load.
#
#   bench/profile.sh MODEL CONCURRENCY [SECONDS]        # CPU ms per request, by process
#   PYSPY=1 bench/profile.sh mlp_py 16 15               # + py-spy of the gateway and the worker
#   PERF=gateway bench/profile.sh add_sub 1 12          # + perf record of one gateway process
#   PERF=worker  bench/profile.sh add_sub 1 12          #   ... or of the worker
#   GATEWAY_ARGS="--http-workers 1" bench/profile.sh mlp_py 16
#   REDIS_TCP=1 bench/profile.sh mlp_py 16              # loopback TCP instead of a Unix socket
#   PROTOCOL=grpc bench/profile.sh mlp 16               # perf_analyzer -i grpc against `conch grpc`
#   PROTOCOL=grpc GRPC_ARGS="--grpc-infer-thread-count 16" PYSPY=1 bench/profile.sh mlp 16
#
# Serves the benchmark repository (bench/models.py) as `make bench` does: a private
# redis-server, one worker, one gateway, perf_analyzer -i http with binary tensors (with
# PROTOCOL=grpc: one `conch grpc` process instead of the gateway, perf_analyzer -i grpc). Prints
# perf_analyzer's throughput and latency, then user+system CPU milliseconds per request of
# each process (from /proc, over the measured span). py-spy (`pip install py-spy`) writes
# raw stacks to OUT/*.txt and bench/pyspy_top.py summarises them; perf writes OUT/perf.data
# (`perf report -i OUT/perf.data --no-children --sort dso,sym`). py-spy samples wall time:
# a thread that is runnable but preempted counts where it stands, so read its shares with
# the CPU table beside them. OUT is .cache/bench/profile/ unless OUT is set.
set -euo pipefail
MODEL=${1:?model}; CONC=${2:?concurrency}; SECS=${3:-12}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$ROOT/.venv/bin/python
OUT=${OUT:-$ROOT/.cache/bench/profile}
PA=$("$ROOT/bench/perf-analyzer-setup" | tail -1)
mkdir -p "$OUT"; rm -f "$OUT"/*.txt "$OUT"/perf.data "$OUT"/cpu.*
export PYTHONPATH=$ROOT/platform
REPO=$(cd "$ROOT" && "$PY" -c 'import sys; sys.path.insert(0, "bench"); import models; print(models.build_repository())')
free_port() { "$PY" -c 'from conch.devtools.redis_server import free_port; print(free_port())'; }
RP=$(free_port); HP=$(free_port); MP=$(free_port); GP=$(free_port)
PROTOCOL=${PROTOCOL:-http}
redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
  --logfile "$OUT/redis.log" --pidfile "$OUT/redis.pid" --unixsocket "$OUT/redis.sock" --unixsocketperm 700
URL="unix://$OUT/redis.sock?db=0"; [ -n "${REDIS_TCP:-}" ] && URL="redis://127.0.0.1:$RP/0"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
  sleep 2
  for p in "${PIDS[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
  redis-cli -p "$RP" shutdown nosave >/dev/null 2>&1 || true
}
trap cleanup EXIT
setsid "$PY" -m conch worker --model-repository "$REPO" --redis-url "$URL" >"$OUT/worker.log" 2>&1 &
WPID=$!; PIDS+=("$WPID")
# shellcheck disable=SC2086
setsid "$PY" -m conch gateway --model-repository "$REPO" --redis-url "$URL" --http-address 127.0.0.1 \
  --http-port "$HP" --metrics-port "$MP" ${GATEWAY_ARGS:-} >"$OUT/gateway.log" 2>&1 &
GPID=$!; PIDS+=("$GPID")
for _ in $(seq 240); do curl -sf "127.0.0.1:$HP/v2/models/$MODEL/ready" && break; sleep 0.5; done
ENDPOINT=127.0.0.1:$HP
if [ "$PROTOCOL" = grpc ]; then  # the gateway stays up (readiness, statistics) but idle
  # shellcheck disable=SC2086
  setsid "$PY" -m conch grpc --model-repository "$REPO" --redis-url "$URL" --grpc-address 127.0.0.1 \
    --grpc-port "$GP" ${GRPC_ARGS:-} >"$OUT/grpc.log" 2>&1 &
  RPID=$!; PIDS+=("$RPID"); ENDPOINT=127.0.0.1:$GP
  for _ in $(seq 240); do grep -q "Started GRPCInferenceService" "$OUT/grpc.log" && break; sleep 0.5; done
fi
"$PA" -m "$MODEL" -u "$ENDPOINT" -i "$PROTOCOL" --concurrency-range "$CONC" --measurement-mode time_windows \
  --measurement-interval $((SECS * 1000 / 3)) --stability-percentage 1000 --max-trials 3 >"$OUT/pa.log" 2>&1 &
PAPID=$!
sleep 3  # perf_analyzer's warm-up
gateways() { pgrep -s "$GPID" -f "conch gateway" | grep -vx "$GPID"; }
snapshot() {  # name user_ticks system_ticks, every thread of every process
  for p in $(gateways); do awk '{print "gateway", $14, $15}' "/proc/$p/stat"; done
  [ -n "${RPID:-}" ] && awk '{print "grpc", $14, $15}' "/proc/$RPID/stat"
  cat /proc/"$WPID"/task/*/stat 2>/dev/null | awk '{print "worker", $14, $15}'
  awk '{print "redis", $14, $15}' "/proc/$(cat "$OUT/redis.pid")/stat"
  cat /proc/"$(pgrep -P "$PAPID" -f perf_analyzer | head -1 || echo "$PAPID")"/task/*/stat 2>/dev/null |
    awk '{print "perf_analyzer", $14, $15}'
}
snapshot >"$OUT/cpu.0"; T0=$(date +%s.%N)
SPAN=$((SECS - 5))
SAMPLERS=()
SPY=$ROOT/.venv/bin/py-spy; [ -x "$SPY" ] || SPY=py-spy
if [ -n "${PYSPY:-}" ]; then
  if [ -n "${RPID:-}" ]; then
    "$SPY" record -p "$RPID" -d "$SPAN" -r 250 --nonblocking ${SPY_FLAGS:-} --format raw -o "$OUT/grpc-$RPID.txt" >/dev/null 2>&1 &
    SAMPLERS+=($!)
  fi
  for p in $(gateways); do
    "$SPY" record -p "$p" -d "$SPAN" -r 250 --nonblocking ${SPY_FLAGS:-} --format raw -o "$OUT/gateway-$p.txt" >/dev/null 2>&1 &
    SAMPLERS+=($!)
  done
  "$SPY" record -p "$WPID" -d "$SPAN" -r 250 --nonblocking ${SPY_FLAGS:-} --format raw -o "$OUT/worker-$WPID.txt" >/dev/null 2>&1 &
  SAMPLERS+=($!)
fi
if [ -n "${PERF:-}" ]; then
  case $PERF in worker) target=$WPID ;; grpc) target=$RPID ;; *) target=$(gateways | head -1) ;; esac
  perf record -F 499 -g -o "$OUT/perf.data" -p "$target" -- sleep "$SPAN" >/dev/null 2>&1 &
fi
sleep "$SPAN"; snapshot >"$OUT/cpu.1"; T1=$(date +%s.%N)
wait "$PAPID" || true
grep -E "Throughput|p50 latency|p99 latency" "$OUT/pa.log" | tail -3
"$PY" - "$OUT" "$T0" "$T1" <<'PY'
import collections, os, re, sys
out, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
tick = os.sysconf("SC_CLK_TCK")
def read(path):
    d = collections.defaultdict(lambda: [0, 0])
    for line in open(path):
        name, user, system = line.split()
        d[name][0] += int(user); d[name][1] += int(system)
    return d
a, b = read(f"{out}/cpu.0"), read(f"{out}/cpu.1")
rate = float(re.findall(r"Throughput: ([0-9.]+)", open(f"{out}/pa.log").read())[-1])
n = rate * (t1 - t0)
print("CPU ms per request (user + system):")
for k in b:
    u, s = ((b[k][i] - a[k][i]) * 1000 / tick / n for i in (0, 1))
    print(f"  {k:14} {u:.3f} + {s:.3f} = {u + s:.3f}")
PY
[ -n "${PYSPY:-}" ] && wait "${SAMPLERS[@]}" && "$PY" "$ROOT/bench/pyspy_top.py" "$OUT"/gateway-*.txt "$OUT"/worker-*.txt $([ -n "${RPID:-}" ] && echo "$OUT"/grpc-*.txt)
exit 0
