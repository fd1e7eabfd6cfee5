"""A folder of class folders split into root/train, root/val and root/test class folders, per class, by one seeded
shuffle: what the photo benchmarks read (benchmarks.photo_recipes). The images are copied; the source is left
as it is.

    python -m benchmarks.split_folder --src /tmp/signs/Dataset --dst /tmp/signs_split --test 0.2 --val 0.1
"""

import argparse
import json
import random
import shutil
from pathlib import Path

IMAGES = (".jpg", ".jpeg", ".png")


def split(src: Path, dst: Path, test: float, val: float, seed: int) -> dict[str, int]:
    """Copies each class's images of `src` into `dst/{test,val,train}/<class>`; returns the images per split."""
    rng = random.Random(seed)
    counts = {"test": 0, "val": 0, "train": 0}
    for folder in sorted(p for p in src.iterdir() if p.is_dir()):
        files = sorted(f for f in folder.iterdir() if f.suffix.lower() in IMAGES)
        rng.shuffle(files)
        n_test, n_val = round(len(files) * test), round(len(files) * val)
        parts = {
            "test": files[:n_test],
            "val": files[n_test : n_test + n_val],
            "train": files[n_test + n_val :],
        }
        for name, part in parts.items():
            (dst / name / folder.name).mkdir(parents=True, exist_ok=True)
            for file in part:
                shutil.copy(file, dst / name / folder.name / file.name)
            counts[name] += len(part)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, required=True, help="class folders: src/<class>/*.jpg")
    parser.add_argument("--dst", type=Path, required=True, help="a new folder")
    parser.add_argument("--test", type=float, default=0.2, help="share of each class tested")
    parser.add_argument("--val", type=float, default=0.1, help="share of each class validated")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.dst.exists():
        raise SystemExit(f"--dst {args.dst} exists: choose a new folder")
    print(json.dumps(split(args.src, args.dst, args.test, args.val, args.seed)))


if __name__ == "__main__":
    main()
