#!/usr/bin/env bash
# Cloud TPU VM slices for t5x_like: create, set up, train, watch, stop, delete.
#
#   scripts/tpu/tpu.sh create --name=t5x --zone=us-east5-a --accelerator_type=v5p-64
#   scripts/tpu/tpu.sh setup  --name=t5x --zone=us-east5-a
#   scripts/tpu/tpu.sh train  --name=t5x --zone=us-east5-a --model_dir=gs://BUCKET/runs/xxl \
#       --gin_file=gin/models/t5_1_1_xxl.gin --gin_file=gin/runs/pretrain.gin \
#       --gin_file=gin/sharding/fsdp.gin --tfds_data_dir=gs://BUCKET/tfds
#   scripts/tpu/tpu.sh logs   --name=t5x --zone=us-east5-a [--worker=all]
#   scripts/tpu/tpu.sh stop   --name=t5x --zone=us-east5-a   # SIGTERM: checkpoint, exit 0
#   scripts/tpu/tpu.sh delete --name=t5x --zone=us-east5-a
#
# Every command takes --dry_run: print the exact commands (one per line, shell-quoted) instead
# of running them. --project=P is passed to every gcloud call. Flags may also come from the
# environment: TPU_NAME, TPU_ZONE, TPU_PROJECT, TPU_ACCELERATOR_TYPE, TPU_VERSION.
#
# How it works (one process per TPU VM worker; JAX's own multi-controller runtime):
# - setup copies `git archive HEAD` of this checkout (commit first: uncommitted edits are not
#   copied; or --repo_url=URL to clone) to every worker (--worker=all), creates ~/t5x_like/.venv
#   with Python 3.11, installs requirements.txt plus "jax[tpu]==0.10.2" (libtpu from PyPI), runs
#   `python -m t5x_like.data.prepare` (vocabularies) and installs gcsfuse.
# - train mounts the model_dir bucket with gcsfuse on every worker and starts
#   `python -m t5x_like.train` there in the background with T5X_LIKE_DISTRIBUTED=1, so
#   t5x_like/train/distributed.py calls jax.distributed.initialize() and JAX reads the slice's
#   topology (worker id, worker addresses) from the GCE metadata server. The trainer's paths are
#   POSIX paths, so gs://BUCKET/PATH (--model_dir, --tfds_data_dir) becomes $HOME/gcs/BUCKET/PATH
#   on every worker; orbax writes the checkpoints through the mount (--rename-dir-limit lets its
#   atomic directory rename work).
# - stop sends SIGTERM to each worker's trainer: it saves a checkpoint and exits 0; `train`
#   again resumes from it.
set -euo pipefail

usage() {
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

DRY_RUN=0
NAME=${TPU_NAME:-}
ZONE=${TPU_ZONE:-}
PROJECT=${TPU_PROJECT:-}
ACCELERATOR_TYPE=${TPU_ACCELERATOR_TYPE:-v5p-8}
VERSION=${TPU_VERSION:-}
SPOT=0
WORKER=""
REPO_URL=""
PYTHON=python3.11
JAX_VERSION=0.10.2
MODEL_DIR=""
TFDS_DATA_DIR=""
# shellcheck disable=SC2016  # expanded on the workers, not here
REMOTE_DIR='$HOME/t5x_like'
TRAIN_ARGS=()

# Shell-quote one word only when needed, so printed commands stay readable and exact.
quote() {
  if [[ $1 =~ ^[A-Za-z0-9_./=:,@%+-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# Run a command, or print it with --dry_run.
run() {
  if [[ $DRY_RUN == 1 ]]; then
    local out="" word
    for word in "$@"; do out+="$(quote "$word") "; done
    printf '%s\n' "${out% }"
  else
    "$@"
  fi
}

# `gcloud compute tpus tpu-vm SUBCOMMAND ...` with --zone and --project.
tpu_vm() {
  local sub=$1
  shift
  local extra=(--zone="$ZONE")
  [[ -n $PROJECT ]] && extra+=(--project="$PROJECT")
  run gcloud compute tpus tpu-vm "$sub" "$@" "${extra[@]}"
}

# Run a shell command on the workers (default: all).
on_workers() {
  tpu_vm ssh "$NAME" --worker="${WORKER:-all}" --command="$1"
}

default_version() {
  case $1 in
    v4-*) echo tpu-ubuntu2204-base ;;
    v5litepod-* | v5e-*) echo v2-alpha-tpuv5-lite ;;
    v5p-*) echo v2-alpha-tpuv5 ;;
    v6e-*) echo v2-alpha-tpuv6e ;;
    *) echo "error: no default --version for --accelerator_type=$1; pass --version" >&2; exit 2 ;;
  esac
}

[[ $# -ge 1 ]] || usage 2
COMMAND=$1
shift
while [[ $# -gt 0 ]]; do
  arg=$1
  case $arg in
    --*=*) key=${arg%%=*}; value=${arg#*=} ;;
    --dry_run | --spot | --help) key=$arg; value="" ;;
    --gin.* | --gin_file | --gin_bindings) key=$arg; value=${2:?"$arg needs a value"}; shift ;;
    --*) key=$arg; value=${2:?"$arg needs a value"}; shift ;;
    *) echo "error: unexpected argument '$arg' (flags are --name=VALUE ...)" >&2; exit 2 ;;
  esac
  shift
  case $key in
    --dry_run) DRY_RUN=1 ;;
    --spot) SPOT=1 ;;
    --help) usage 0 ;;
    --name) NAME=$value ;;
    --zone) ZONE=$value ;;
    --project) PROJECT=$value ;;
    --accelerator_type) ACCELERATOR_TYPE=$value ;;
    --version) VERSION=$value ;;
    --worker) WORKER=$value ;;
    --repo_url) REPO_URL=$value ;;
    --python) PYTHON=$value ;;
    --model_dir) MODEL_DIR=$value ;;
    --tfds_data_dir) TFDS_DATA_DIR=$value ;;
    --gin_file | --gin_bindings | --gin.*) TRAIN_ARGS+=("$key=$value") ;;
    *) echo "error: unknown flag $key for '$COMMAND'" >&2; exit 2 ;;
  esac
done

[[ $COMMAND == help ]] && usage 0
[[ -n $NAME ]] || { echo "error: --name (or TPU_NAME) is required" >&2; exit 2; }
[[ -n $ZONE ]] || { echo "error: --zone (or TPU_ZONE) is required" >&2; exit 2; }

case $COMMAND in
  create)
    args=(--accelerator-type="$ACCELERATOR_TYPE" --version="${VERSION:-$(default_version "$ACCELERATOR_TYPE")}")
    [[ $SPOT == 1 ]] && args+=(--spot)
    tpu_vm create "$NAME" "${args[@]}"
    ;;
  setup)
    if [[ -n $REPO_URL ]]; then
      fetch="rm -rf $REMOTE_DIR && git clone --depth=1 $(quote "$REPO_URL") $REMOTE_DIR"
    else
      tarball=${TMPDIR:-/tmp}/t5x_like-$NAME.tar.gz
      repo_root=$(cd "$(dirname "$0")/../.." && pwd)
      run git -C "$repo_root" archive --format=tar.gz --output="$tarball" HEAD
      tpu_vm scp "$tarball" "$NAME:t5x_like.tar.gz" --worker=all
      fetch="rm -rf $REMOTE_DIR && mkdir -p $REMOTE_DIR && tar -xzf \$HOME/t5x_like.tar.gz -C $REMOTE_DIR"
    fi
    # shellcheck disable=SC2016  # $(lsb_release) runs on the workers
    gcsfuse_repo='deb [signed-by=/usr/share/keyrings/cloud.google.asc] https://packages.cloud.google.com/apt gcsfuse-$(lsb_release -c -s) main'
    on_workers "set -euo pipefail; $fetch && cd $REMOTE_DIR \
&& sudo apt-get update -q && sudo apt-get install -y -q $PYTHON $PYTHON-venv \
&& $PYTHON -m venv .venv && .venv/bin/pip install -q -r requirements.txt 'jax[tpu]==$JAX_VERSION' \
&& .venv/bin/python -m t5x_like.data.prepare \
&& echo \"$gcsfuse_repo\" | sudo tee /etc/apt/sources.list.d/gcsfuse.list \
&& curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null \
&& sudo apt-get update -q && sudo apt-get install -y -q gcsfuse"
    ;;
  train)
    [[ $MODEL_DIR == gs://*/* ]] || { echo "error: --model_dir=gs://BUCKET/PATH is required" >&2; exit 2; }
    # gs://BUCKET/PATH -> the gcsfuse mount $HOME/gcs/BUCKET/PATH (the trainer's paths are POSIX).
    buckets=()
    to_mount() {
      local bucket=${1#gs://}
      bucket=${bucket%%/*}
      [[ " ${buckets[*]} " == *" $bucket "* ]] || buckets+=("$bucket")
      LOCAL="\$HOME/gcs/$bucket/${1#gs://"$bucket"/}"
    }
    to_mount "$MODEL_DIR"
    train="T5X_LIKE_DISTRIBUTED=1 nohup .venv/bin/python -m t5x_like.train --model_dir=$LOCAL"
    if [[ $TFDS_DATA_DIR == gs://*/* ]]; then
      to_mount "$TFDS_DATA_DIR"
      train+=" --tfds_data_dir=$LOCAL"
    elif [[ -n $TFDS_DATA_DIR ]]; then
      train+=" --tfds_data_dir=$(quote "$TFDS_DATA_DIR")"
    fi
    for a in "${TRAIN_ARGS[@]}"; do train+=" $(quote "$a")"; done
    mounts=""
    for b in "${buckets[@]}"; do
      mounts+=" && mkdir -p \$HOME/gcs/$b && (mountpoint -q \$HOME/gcs/$b || gcsfuse --implicit-dirs --rename-dir-limit=1000000 $b \$HOME/gcs/$b)"
    done
    on_workers "set -euo pipefail; cd $REMOTE_DIR$mounts \
&& ($train > train.log 2>&1 & echo \$! > train.pid) && echo \"worker \$(hostname): started pid \$(cat train.pid)\""
    ;;
  logs)
    WORKER=${WORKER:-0}
    on_workers "tail -n 200 -F $REMOTE_DIR/train.log"
    ;;
  stop)
    on_workers "if [ -f $REMOTE_DIR/train.pid ]; then kill -TERM \$(cat $REMOTE_DIR/train.pid) || true; fi"
    ;;
  delete)
    tpu_vm delete "$NAME" --quiet
    ;;
  *)
    echo "error: unknown command '$COMMAND' (create, setup, train, logs, stop, delete)" >&2
    exit 2
    ;;
esac
