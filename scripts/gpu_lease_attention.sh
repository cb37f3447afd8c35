#!/usr/bin/env bash
# One call on a leased sm_90 GPU for the Hopper flash kernels (issue 38), run by the `device`
# tool from the repository root, writing under $OUT:
#   1. their float64-reference tests compiled for the GPU (JAX_PLATFORMS=cuda: tests/conftest.py
#      defaults to the CPU, where they would run interpreted) -> mgpu_tests.log;
#   2. the attention grid, ours (Hopper) vs cuDNN, in the order given by GRID (one
#      `bench_attention.py` run per entry "head_dims:lengths[:extra args]", all into the same
#      attention.jsonl with --resume), each bounded by what is left of LEASE_TIMEOUT seconds.
#   LEASE_TIMEOUT=420 GRID="64:512 2048 8192;128:512 2048 8192" scripts/gpu_lease_attention.sh
# An entry's extra args go to bench_attention.py (e.g. "--block-k 64 --label fwd_bk64 --t5 no"
# into a subfolder: "64:4096:--out-sub ab_bk64 ..." writes $OUT/ab_bk64).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_lease_attention}
mkdir -p "$OUT"
start=$SECONDS
export PYTHONPATH="$PWD:${PYTHONPATH:-}"  # the package from this checkout (the fourth loan lacked it)
left() { echo $(( ${LEASE_TIMEOUT:-420} - (SECONDS - start) )); }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
} > "$OUT/run.log" 2>&1
# Unbuffered, verbose and with faulthandler: twice this log came back empty (rc 1, 6 s).
{ python3 -m pytest --version; JAX_PLATFORMS=cuda timeout "${TESTS_TIMEOUT:-90}" \
  python3 -X faulthandler -u -m pytest -v -p no:cacheprovider \
  tests/kernels/test_flash_attention.py -k "mgpu"; } > "$OUT/mgpu_tests.log" 2>&1
echo "mgpu tests rc $? after $((SECONDS - start)) s: $(tail -1 "$OUT/mgpu_tests.log")" >> "$OUT/run.log"
IFS=';' read -ra entries <<< "${GRID:-64:512 2048 8192;128:512 2048 8192;64:1024 4096}"
for entry in "${entries[@]}"; do
  IFS=':' read -r dims lengths extra <<< "$entry"
  dir="$OUT"
  if [[ "$extra" == --out-sub* ]]; then
    sub=$(echo "$extra" | awk '{print $2}'); extra=$(echo "$extra" | cut -d' ' -f3-)
    dir="$OUT/$sub"
  fi
  budget=$(left)
  if (( budget < 30 )); then echo "skipped [$entry]: ${budget} s left" >> "$OUT/run.log"; continue; fi
  # shellcheck disable=SC2086 - the entry's lists are word lists on purpose
  timeout "$budget" python3 scripts/bench_attention.py --head-dims $dims --lengths $lengths \
    --impls pallas_hopper cudnn --rounds "${ROUNDS:-3}" --out-dir "$dir" --resume $extra \
    >> "$OUT/attn.log" 2>&1
  echo "[$entry] rc $? at $((SECONDS - start)) s" >> "$OUT/run.log"
done
cat "$OUT/run.log"; tail -c 3000 "$OUT/attn.log"
