#!/usr/bin/env bash
# Time the CIFAR-10 speed-run recipe on a GPU and record its accuracy (mean over seeds).
# Prepared for a lent GPU machine, which has no network: it trains on the CIFAR-10 JPEGs shipped in
# shared/data (50,000 training images), holding out a stratified 20% (10,000 images, the size of the
# official test set) for measuring accuracy. Writes one JSON line per seed to $OUT/speedrun.jsonl.
#
#   bash benchmarks/speedrun_gpu.sh [seeds=3]
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${1:-3}
OUT=${OUT:-/tmp/speedrun}
mkdir -p "$OUT" /tmp/speedrun-data
[ -d /tmp/speedrun-data/cifar10 ] || tar xzf ../shared/data/cifar10-train-jpg.tar.gz -C /tmp/speedrun-data
for seed in $(seq 1 "$SEEDS"); do
  start=$(date +%s.%N)
  python -m project fit --config configs/experiment/cifar10_speedrun.yaml \
    --data ImageFolderDataModule --data.root /tmp/speedrun-data/cifar10/train --data.image_size 32 \
    --data.val_fraction 0.2 --data.batch_size 1024 --data.augment.crop_padding 2 --data.on_device true \
    --data.cache_dir /tmp/speedrun-data/cache --seed_everything "$seed" \
    --trainer.logger false --trainer.enable_progress_bar false --trainer.default_root_dir "$OUT/seed$seed" \
    > "$OUT/seed$seed.log" 2>&1
  end=$(date +%s.%N)
  acc=$(python - "$OUT/seed$seed" <<'PY'
import sys, torch, pathlib
ckpt = sorted(pathlib.Path(sys.argv[1]).glob("checkpoints/last.ckpt"))[0]
c = torch.load(ckpt, weights_only=True)
print(max(float(v["best_model_score"]) for k, v in c["callbacks"].items() if "Checkpoint" in k))
PY
)
  echo "{\"seed\": $seed, \"wall_seconds_including_startup\": $(echo "$end - $start" | bc), \"val_acc\": $acc}" | tee -a "$OUT/speedrun.jsonl"
done
