"""A multi-label dataset from real photos: CIFAR-10 JPEGs pasted 1 to 4 to a canvas, tagged with the classes present.

Each canvas is a 2x2 grid of `size`/2-pixel cells; 1 to `max_per_canvas` of them (uniformly many) hold a photo of
a class drawn uniformly, the others stay black, so a canvas has 1 to 4 distinct tags. Train and test canvases draw
their photos from disjoint halves of each class (no photo is in both). Writes

  dst/images/<split>_<n>.jpg    the canvases
  dst/train.csv, dst/test.csv   path,tags (the tags sorted and separated by a space)
  dst/baseline.json             each split's tag frequencies, and the test mAP of the frequency baseline (a
                                constant score per tag ranks nothing: its AP is the tag's frequency)

    python -m benchmarks.multilabel_canvas --src /tmp/cifar10/train --dst /tmp/canvas --train 8000 --test 2000
    python -m project fit --config configs/csv_multilabel.yaml --data.csv /tmp/canvas/train.csv \\
        --data.test_csv /tmp/canvas/test.csv --data.image_size 64 --model.net SimpleCNN --trainer.max_epochs 10
"""

import argparse
import csv
import json
import random
from pathlib import Path

from PIL import Image

from project.data.image_reading import list_images


def canvases(
    pools: dict[str, list[Path]], count: int, size: int, most: int, rng: random.Random, out: Path, split: str
):
    """`count` canvases from `pools` (class -> photos, drawn without replacement while they last); yields
    (file name, sorted tags)."""
    cell = size // 2
    classes = sorted(pools)
    cursor = dict.fromkeys(classes, 0)
    for n in range(count):
        canvas = Image.new("RGB", (size, size))
        tags = set()
        for slot in rng.sample(range(4), rng.randint(1, most)):
            name = rng.choice(classes)
            photo = pools[name][cursor[name] % len(pools[name])]
            cursor[name] += 1
            with Image.open(photo) as im:
                canvas.paste(im.convert("RGB").resize((cell, cell)), ((slot % 2) * cell, (slot // 2) * cell))
            tags.add(name)
        file = f"{split}_{n:05d}.jpg"
        canvas.save(out / file, quality=90)
        yield file, sorted(tags)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--src", type=Path, required=True, help="CIFAR-10 JPEGs in class folders")
    parser.add_argument("--dst", type=Path, required=True)
    parser.add_argument("--train", type=int, default=8000, help="training canvases")
    parser.add_argument("--test", type=int, default=2000, help="test canvases")
    parser.add_argument("--size", type=int, default=64, help="canvas side in pixels (a 2x2 grid of photos)")
    parser.add_argument("--max_per_canvas", type=int, default=4, choices=[1, 2, 3, 4])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.dst.exists():
        raise SystemExit(f"error: {args.dst} exists; choose a new --dst")
    rng = random.Random(args.seed)
    halves: dict[str, dict[str, list[Path]]] = {"train": {}, "test": {}}
    for folder in sorted(p for p in args.src.iterdir() if p.is_dir()):
        photos = list_images(folder)
        rng.shuffle(photos)
        halves["test"][folder.name], halves["train"][folder.name] = (
            photos[: len(photos) // 2],
            photos[len(photos) // 2 :],
        )
    (args.dst / "images").mkdir(parents=True)
    summary = {}
    for split, count in (("train", args.train), ("test", args.test)):
        rows = list(
            canvases(halves[split], count, args.size, args.max_per_canvas, rng, args.dst / "images", split)
        )
        with (args.dst / f"{split}.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["path", "tags"])
            writer.writerows([f"images/{file}", " ".join(tags)] for file, tags in rows)
        frequency = {c: sum(c in tags for _, tags in rows) / len(rows) for c in sorted(halves[split])}
        summary[split] = {"canvases": len(rows), "mean_tags": sum(map(len, (t for _, t in rows))) / len(rows),
                          "tag_frequency": frequency}  # fmt: skip
    summary["test_map_frequency_baseline"] = sum(summary["test"]["tag_frequency"].values()) / len(
        summary["test"]["tag_frequency"]
    )
    (args.dst / "baseline.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "train"}))


if __name__ == "__main__":
    main()
