#!/usr/bin/env bash
# The sweeps behind docs/results/time-split.md and fsdp-memory.md (about 20 short runs; ~10 min on 2 cores).
# Tabulate them with: python -m ringexp.compare outputs/multirun/time-table/* (or outputs/multirun/memory/*)
set -euo pipefail
cd "$(dirname "$0")/.."
source .venv/bin/activate
i=0
run() { i=$((i+1)); python -m ringexp.train -m name="$1" hydra.sweep.dir="outputs/multirun/$1/$i" logger=none "${@:2}"; }
run time-table steps=100 eval_every=100 +parallel=ddp,ring,hierarchical,naive,fsdp,fsdp_bf16
run time-table steps=100 eval_every=100 +parallel=ddp,ring parallel.bucket_cap_mb=0.05
run memory steps=5 eval_every=5 throughput_warmup=1 +parallel=ddp,fsdp launcher.nproc_per_node=2,4
run memory steps=5 eval_every=5 throughput_warmup=1 +parallel=ddp,fsdp launcher.nproc_per_node=2,4 \
  model=resnet18 data.batch_size=8
