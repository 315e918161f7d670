#!/usr/bin/env bash
# Run the smcsd benchmarks on a Cloud TPU VM: single host or a multi-host pod slice.
# See experiments/tpu_vm.md for the full walkthrough. Runs from your workstation (needs gcloud).
#
#   experiments/launch_tpu.sh create                 # create the TPU VM (TPU_TYPE / TPU_VERSION below)
#   experiments/launch_tpu.sh setup                  # copy this checkout to every worker, install
#   experiments/launch_tpu.sh bench [bench flags]    # experiments/bench/speed.py on every worker
#   experiments/launch_tpu.sh overhead [flags]       # experiments/bench/mesh_overhead.py on every worker
#   experiments/launch_tpu.sh train [flags]          # `smcsd train-drafter` on every worker (one global mesh)
#   experiments/launch_tpu.sh corpus [flags]         # experiments/train/build_corpus.py on every worker (one global mesh)
#   experiments/launch_tpu.sh fetch                  # copy worker 0's experiments/results back
#   experiments/launch_tpu.sh delete
#
# Environment (defaults in brackets):
#   TPU_NAME [smcsd-tpu]  ZONE [us-west4-a]  PROJECT [gcloud's default]
#   TPU_TYPE [v5litepod-8]  TPU_VERSION [v2-alpha-tpuv5-lite]   (multi-host e.g. v4-32 + tpu-ubuntu2204-base)
#   MESH [DATAxMODEL; default all chips on "data"]  REMOTE_DIR [~/smcsd]
#   NUM_HOSTS [from `gcloud ... describe`: one per network endpoint]
# Every worker runs the same command (--worker=all); with more than one host, the runner calls
# jax.distributed.initialize() first (it reads the pod topology from the TPU metadata server), so
# jax.devices() spans every host and smcsd.make_mesh() builds one global mesh.
set -euo pipefail

TPU_NAME=${TPU_NAME:-smcsd-tpu}
ZONE=${ZONE:-us-west4-a}
TPU_TYPE=${TPU_TYPE:-v5litepod-8}
TPU_VERSION=${TPU_VERSION:-v2-alpha-tpuv5-lite}
REMOTE_DIR=${REMOTE_DIR:-smcsd}
PROJECT_FLAG=()
if [[ -n "${PROJECT:-}" ]]; then PROJECT_FLAG=(--project="$PROJECT"); fi
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

ssh_all() {  # run a command on every worker of the slice
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --worker=all --command="$1"
}

num_hosts() {  # hosts in the slice (one network endpoint each); override with NUM_HOSTS=...
  if [[ -n "${NUM_HOSTS:-}" ]]; then echo "$NUM_HOSTS"; return; fi
  gcloud compute tpus tpu-vm describe "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" \
    --format='value(networkEndpoints[].ipAddress)' | tr ';,' '\n\n' | grep -c .
}

# A python runner: jax.distributed.initialize() first when the slice has several hosts (it finds the
# coordinator and this process's id from the TPU metadata), then the module as __main__.
runner() {  # runner MODULE ARGS...
  local module=$1; shift
  printf 'cd ~/%s && SMCSD_NUM_HOSTS=%s python3 -c %q %q %s' "$REMOTE_DIR" "$(num_hosts)" \
    "import os, runpy, sys
if int(os.environ.get('SMCSD_NUM_HOSTS', '1')) > 1:
    import jax
    jax.distributed.initialize()
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)" "$module" "$*"
}

cmd=${1:-help}; shift || true
case "$cmd" in
  create)
    gcloud compute tpus tpu-vm create "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" \
      --accelerator-type="$TPU_TYPE" --version="$TPU_VERSION"
    ;;
  setup)
    # Ship the working tree (no .git, no venvs, no results) to every worker and install it with JAX for TPU.
    tarball=$(mktemp /tmp/smcsd.XXXXXX.tgz)
    tar -C "$HERE" --exclude=.git --exclude=.venv --exclude='experiments/results' --exclude='__pycache__' \
      -czf "$tarball" .
    gcloud compute tpus tpu-vm scp "$tarball" "$TPU_NAME":smcsd.tgz --zone="$ZONE" "${PROJECT_FLAG[@]}" --worker=all
    rm -f "$tarball"
    ssh_all "mkdir -p ~/$REMOTE_DIR && tar -xzf ~/smcsd.tgz -C ~/$REMOTE_DIR && cd ~/$REMOTE_DIR && \
      python3 -m pip install -q -U 'jax[tpu]' && python3 -m pip install -q -e . && \
      python3 -c 'import jax; print(jax.process_index(), jax.local_device_count(), jax.device_count())'"
    ;;
  bench)
    # experiments/bench/speed.py with a device mesh. Batch sizes must be multiples of the data axis.
    if ! grep -q -- '"--mesh"' "$HERE/experiments/bench_speed.py"; then
      echo "experiments/bench/speed.py has no --mesh flag yet (see experiments/tpu_vm.md, 'bench.speed --mesh');" \
           "use '$0 overhead' meanwhile" >&2
      exit 2
    fi
    mesh_flag=()
    if [[ -n "${MESH:-}" ]]; then mesh_flag=(--mesh "$MESH"); fi
    ssh_all "$(runner experiments.bench.speed "${mesh_flag[@]}" --no-progress "$@")"
    ;;
  train|corpus)
    # Drafter training / corpus generation on one global mesh. Every worker runs the same command; with several
    # hosts it joins the others first (--distributed). MESH=DATAxMODEL (default: every chip on data); the
    # batch size must be a multiple of DATA. --ckpt-dir (train) must be a directory every host sees (NFS / GCS FUSE).
    #   MESH=8x4 experiments/launch_tpu.sh train --target ~/llama-8b --corpus ~/corpus --out ~/drafter \
    #       --ckpt-dir /mnt/shared/ckpt --batch-size 32 --steps 20000
    #   MESH=32x1 experiments/launch_tpu.sh corpus --pair <pair> --batch-size 256
    dist_flag=()
    if (( $(num_hosts) > 1 )); then dist_flag=(--distributed); fi
    mesh_flag=(--mesh "${MESH:-auto}")
    args_q=$(printf '%q ' "$@")   # the flags as typed, quoted for the remote shell
    if [[ "$cmd" == train ]]; then
      ssh_all "cd ~/$REMOTE_DIR && python3 -m smcsd train-drafter ${dist_flag[*]} ${mesh_flag[*]} --no-progress $args_q"
    else
      ssh_all "cd ~/$REMOTE_DIR && python3 -m experiments.train.build_corpus ${dist_flag[*]} ${mesh_flag[*]} --no-progress $args_q"
    fi
    ;;
  overhead)
    # experiments/bench/mesh_overhead.py on the real chips: --host-devices 0 keeps the TPU platform.
    ssh_all "$(runner experiments.bench.mesh_overhead --host-devices 0 "$@")"
    ;;
  fetch)
    mkdir -p "$HERE/experiments/results/tpu"
    gcloud compute tpus tpu-vm scp --recurse "$TPU_NAME":"$REMOTE_DIR/experiments/results/*" \
      "$HERE/experiments/results/tpu/" --zone="$ZONE" "${PROJECT_FLAG[@]}" --worker=0
    ;;
  delete)
    gcloud compute tpus tpu-vm delete "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --quiet
    ;;
  *)
    sed -n '2,22p' "$0"
    ;;
esac
