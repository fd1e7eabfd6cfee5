#!/usr/bin/env bash
# GPU checks of the scale-out presets, for one lent GPU: runs the gpu-marked tests, then measures
# peak GPU memory of the CIFAR ResNet-18 (batch 256, 16-mixed, 20 steps) under DDP, FSDP and FSDP with
# CPU offload, and prints a Markdown table for benchmarks/README.md. Needs no network: fake CIFAR files.
#
#   bash benchmarks/scale_out_gpu.sh            # writes $OUT/scale_out.md and one log per run
#
# On one GPU FSDP has nothing to shard across (torch falls back to NO_SHARD); what it can still save there
# is what CPU offload and activation checkpointing save. With N GPUs the sharded state shrinks ~N-fold.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/scale_out}
PY=${PY:-python}
mkdir -p "$OUT"
export PYTHONPATH=$PWD WANDB_MODE=offline

$PY -m pytest -q -m gpu tests/test_distributed.py tests/test_precision.py tests/test_cli.py 2>&1 | tee "$OUT/pytest_gpu.log"

DATA=$OUT/cifar
[ -d "$DATA/cifar-10-batches-py" ] || $PY -c "from tests.fakes import make_fake_cifar; from pathlib import Path; make_fake_cifar(Path('$DATA'), per_batch=2000, n_test=500)"

declare -A RUNS=(
  [ddp]="--config configs/trainer/ddp.yaml"
  [fsdp]="--config configs/trainer/fsdp.yaml"
  [fsdp_cpu_offload]="--config configs/trainer/fsdp.yaml --trainer.strategy.init_args.cpu_offload true"
)
echo "| strategy (1 GPU, ResNet-18, batch 256, 16-mixed) | peak allocated (GiB) | peak reserved (GiB) |" > "$OUT/scale_out.md"
echo "| --- | --- | --- |" >> "$OUT/scale_out.md"
for name in ddp fsdp fsdp_cpu_offload; do
  # shellcheck disable=SC2086
  $PY tests/patched_main.py fit --config configs/cifar10.yaml ${RUNS[$name]} --config configs/debug/memory.yaml \
    --trainer.devices 1 --trainer.max_steps 20 --trainer.limit_val_batches 0 --trainer.enable_progress_bar false \
    --data.data_dir "$DATA" --data.download false --data.batch_size 256 \
    --trainer.logger lightning.pytorch.loggers.CSVLogger --trainer.logger.save_dir "$OUT/$name" \
    --trainer.default_root_dir "$OUT/$name" > "$OUT/$name.log" 2>&1
  $PY - "$OUT/$name" "$name" >> "$OUT/scale_out.md" <<'PY'
import csv, pathlib, sys
rows = [r for f in pathlib.Path(sys.argv[1]).rglob("metrics.csv") for r in csv.DictReader(open(f))]
peak = lambda key: max(float(r[key]) for r in rows if r.get(key))
print(f"| {sys.argv[2]} | {peak('memory/max_allocated_gib'):.2f} | {peak('memory/max_reserved_gib'):.2f} |")
PY
done
cat "$OUT/scale_out.md"
