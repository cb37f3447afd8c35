#!/usr/bin/env bash
# Multi-machine training without a cluster manager (torchrun-style): explicit coordinator.
#
# On every machine i of N (same checkout and venv, a model dir all of them see):
#   scripts/slurm/launch_manual.sh --coordinator_address=10.0.0.1:12345 --num_processes=N \
#       --process_id=i -- --model_dir=/shared/runs/x --gin_file=gin/runs/pretrain.gin ...
# or from one machine, over ssh, one process per host (host 0 is the coordinator):
#   scripts/slurm/launch_manual.sh --hosts=node0,node1 --port=12345 -- TRAIN_FLAGS...
# --dry_run prints the exact commands instead. Arguments after `--` go to
# `python -m t5x_like.train`, which passes --coordinator_address/--num_processes/--process_id
# to jax.distributed.initialize(); process 0 hosts the coordinator service, so its address
# must be reachable from every machine (open the port). Each process uses all local devices.
set -euo pipefail

DRY_RUN=0
COORDINATOR=""
NUM_PROCESSES=""
PROCESS_ID=""
HOSTS=""
PORT=12345
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
TRAIN_ARGS=()

while [[ $# -gt 0 ]]; do
  case $1 in
    --dry_run) DRY_RUN=1 ;;
    --coordinator_address=*) COORDINATOR=${1#*=} ;;
    --num_processes=*) NUM_PROCESSES=${1#*=} ;;
    --process_id=*) PROCESS_ID=${1#*=} ;;
    --hosts=*) HOSTS=${1#*=} ;;
    --port=*) PORT=${1#*=} ;;
    --) shift; TRAIN_ARGS=("$@"); break ;;
    *) echo "error: unknown flag $1 (train flags go after --)" >&2; exit 2 ;;
  esac
  shift
done

# Shell-quote one word only when needed, so printed commands stay readable and exact.
quote() {
  if [[ $1 =~ ^[A-Za-z0-9_./=:,@%+-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# The words of a command, each quoted when needed, on one line.
join_quoted() {
  local out="" word
  for word in "$@"; do out+="$(quote "$word") "; done
  printf '%s' "${out% }"
}

# Print (--dry_run) or run a command.
run() {
  if [[ $DRY_RUN == 1 ]]; then
    join_quoted "$@"
    printf '\n'
  else
    "$@"
  fi
}

if [[ -n $HOSTS ]]; then
  IFS=, read -r -a hosts <<<"$HOSTS"
  coordinator="${hosts[0]}:$PORT"
  for i in "${!hosts[@]}"; do
    train=$(join_quoted "$PYTHON" -m t5x_like.train --coordinator_address="$coordinator" \
      --num_processes="${#hosts[@]}" --process_id="$i" "${TRAIN_ARGS[@]}")
    run ssh "${hosts[$i]}" "cd $(quote "$REPO") && nohup $train > t5x_like-$i.log 2>&1 &"
  done
  exit 0
fi

[[ -n $COORDINATOR && -n $NUM_PROCESSES && -n $PROCESS_ID ]] || {
  echo "error: give --coordinator_address=HOST:PORT --num_processes=N --process_id=I (or --hosts=a,b,...)" >&2
  exit 2
}
if ! [[ $PROCESS_ID =~ ^[0-9]+$ && $NUM_PROCESSES =~ ^[0-9]+$ ]] || ((PROCESS_ID >= NUM_PROCESSES)); then
  echo "error: --process_id=$PROCESS_ID must be in [0, --num_processes=$NUM_PROCESSES)" >&2
  exit 2
fi
cd "$REPO"
train=("$PYTHON" -m t5x_like.train --coordinator_address="$COORDINATOR"
  --num_processes="$NUM_PROCESSES" --process_id="$PROCESS_ID" "${TRAIN_ARGS[@]}")
if [[ $DRY_RUN == 1 ]]; then
  run "${train[@]}"
else
  exec "${train[@]}"  # the trainer gets this process's signals (a preemption's SIGTERM)
fi
