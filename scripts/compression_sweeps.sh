#!/usr/bin/env bash
# The sweeps behind docs/results/compression-quality.md (about 50 runs of the default experiment; ~1 h on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
source .venv/bin/activate
i=0
run() { i=$((i+1)); python -m ringexp.train -m name="$1" hydra.sweep.dir="outputs/multirun/$1/$i" "${@:2}"; }
run compression-table +parallel=ddp compression=none optim=adamw,sgd
run compression-table +parallel=ring compression=fp16,bf16,int8
run compression-table +parallel=ddp_powersgd compression.start_step=2
run compression-table +parallel=ddp compression=topk,randomk compression.ratio=0.1,0.01 \
  compression.error_feedback=true,false optim=adamw,sgd
run compression-table +parallel=ddp compression=sign compression.error_feedback=true,false optim=adamw,sgd
run compression-table +parallel=ddp compression=topk compression.ratio=0.01 compression.warmup_steps=50 optim=adamw,sgd
run compression-table +parallel=ddp compression=topk compression.ratio=0.01 optim=sgd \
  compression.momentum_correction=true compression.warmup_steps=0,50
run compression-seeds +parallel=ring compression=none,fp16,bf16,int8 seed=0,1,2
run compression-seeds +parallel=ring compression=none,bf16 seed=3,4,5,6
run powersgd +parallel=ddp_powersgd compression.start_step=50 compression.rank=4,8
run powersgd +parallel=ddp_powersgd compression.start_step=2 optim=sgd
run powersgd +parallel=ddp,ddp_powersgd seed=1,2
