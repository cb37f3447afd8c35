#!/usr/bin/env bash
# One call on a leased GPU machine (the `device` tool runs it from the repository root):
# install the wheels carried in .whl/ (gin-config: the machine's image lacks it), record the
# environment, then run scripts/bench_gpu_step.py with the arguments given, writing under $OUT.
#   scripts/gpu_lease.sh --variants base:128:cudnn,... --budget_s 200
# LEASE_TIMEOUT (seconds, default 540) bounds the benchmark; the tail of its log is printed last.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_lease}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import jax, flax, optax, torch, transformers; print('jax', jax.__version__, \
'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__, \
'transformers', transformers.__version__, jax.devices())"
} > "$OUT/run.log" 2>&1
timeout "${LEASE_TIMEOUT:-540}" python3 scripts/bench_gpu_step.py --out_dir "$OUT" "$@" \
  >> "$OUT/run.log" 2>&1
rc=$?
tail -c 9000 "$OUT/run.log"
exit $rc
