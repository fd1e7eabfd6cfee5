"""A regression from real photos: each photo rotated by a known random angle, the target the angle (degrees).

Every photo is resized so that its shorter side is `size` x sqrt(2), rotated about its centre by an angle drawn
uniformly from [-max_angle, max_angle] (seeded, one per photo), and the central `size` x `size` square cut out:
the largest square that no rotation up to 45 degrees brings a border into, the same for every angle, so that
neither black corners nor the zoom tell the angle. A positive angle turns the photo anticlockwise. Photos in a
folder named `test` (at any depth) make the test split, every other photo the training split; writes

  dst/images/<split>/<n>.jpg    the rotated crops
  dst/train.csv, dst/test.csv   path,angle
  dst/baseline.json             the test MAE of predicting the training angles' mean (the baseline to beat)

    git clone https://github.com/alexeygrigorev/clothing-dataset-small /tmp/clothing
    python -m benchmarks.rotation_regression --src /tmp/clothing --dst /tmp/rotation
    python -m project fit --config configs/csv_regression.yaml --data.csv /tmp/rotation/train.csv \\
        --data.test_csv /tmp/rotation/test.csv --data.augment.flip false
"""

import argparse
import csv
import json
import math
import random
from pathlib import Path

from PIL import Image

from project.data.image_reading import list_images


def rotated_crop(photo: Path, angle: float, size: int) -> Image.Image:
    """The central `size` square of `photo` rotated by `angle` degrees (anticlockwise), without borders."""
    with Image.open(photo) as im:
        im = im.convert("RGB")
        side = math.ceil(size * math.sqrt(2)) + 2  # the square's diagonal, and a pixel of margin each way
        scale = side / min(im.size)
        im = im.resize(
            (max(side, round(im.width * scale)), max(side, round(im.height * scale))), Image.BICUBIC
        )
        im = im.rotate(angle, resample=Image.BICUBIC)
        left, top = (im.width - size) // 2, (im.height - size) // 2
        return im.crop((left, top, left + size, top + size))


def build(src: Path, dst: Path, size: int, max_angle: float, seed: int) -> dict[str, float]:
    """Write the dataset (see the module docstring); returns what `baseline.json` holds."""
    rng = random.Random(seed)
    photos = list_images(src)
    if not photos:
        raise SystemExit(f"no photos under {src}")
    angles: dict[str, list[float]] = {"train": [], "test": []}
    for split in angles:
        (dst / "images" / split).mkdir(parents=True, exist_ok=True)
    writers = {}
    with (dst / "train.csv").open("w", newline="") as train, (dst / "test.csv").open("w", newline="") as test:
        for split, f in (("train", train), ("test", test)):
            writers[split] = csv.writer(f)
            writers[split].writerow(["path", "angle"])
        for n, photo in enumerate(photos):
            split = "test" if "test" in photo.relative_to(src).parts[:-1] else "train"
            angle = round(rng.uniform(-max_angle, max_angle), 3)
            name = f"images/{split}/{n:05d}.jpg"
            rotated_crop(photo, angle, size).save(dst / name, quality=92)
            writers[split].writerow([name, angle])
            angles[split].append(angle)
    mean = sum(angles["train"]) / len(angles["train"])
    baseline = sum(abs(a - mean) for a in angles["test"]) / max(1, len(angles["test"]))
    result = {
        "train_images": len(angles["train"]),
        "test_images": len(angles["test"]),
        "train_mean_angle": mean,
        "test_mae_predicting_the_mean": baseline,
    }
    (dst / "baseline.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--src", type=Path, required=True, help="a folder of photos, any depth (test/ = test split)"
    )
    parser.add_argument("--dst", type=Path, required=True)
    parser.add_argument("--size", type=int, default=64, help="side of the square crops, in pixels")
    parser.add_argument(
        "--max_angle", type=float, default=45.0, help="angles are drawn from [-max, max] degrees"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not 0 < args.max_angle <= 45:
        raise SystemExit("--max_angle must be in (0, 45]: a larger rotation brings the border into the crop")
    print(json.dumps(build(args.src, args.dst, args.size, args.max_angle, args.seed), indent=2))


if __name__ == "__main__":
    main()
