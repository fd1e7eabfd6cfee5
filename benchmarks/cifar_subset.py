"""Class-folder datasets derived from the CIFAR-10 JPEGs by hard links (no copies), each stratified and seeded.

subset  : `--per_class` images per class. The cross-validation and search measurements use 500 per class
          (5,000 images), the size of dataset a user with a few thousand photos has.
split   : `dst/test/<class>/` holds `--test_per_class` images per class that nothing trains or validates on,
          `dst/train/<class>/` the rest (the speed-run and SimpleCNN measurements: 10,000 held out, 40,000 left).
enlarge : every image, plus the first `--extra_per_class` of each class again as `dup_<name>` (the whole-process
          and start-up measurements: 60,000 files).

  python -m benchmarks.cifar_subset --src /tmp/cifar10/train --dst /tmp/cifar5k --per_class 500 --seed 0
  python -m benchmarks.cifar_subset --src /tmp/cifar10/train --dst /tmp/cifar_split --test_per_class 1000 --seed 0
  python -m benchmarks.cifar_subset --src /tmp/cifar10/train --dst /tmp/cifar60k --extra_per_class 1000
"""

import argparse
import os
import random
from pathlib import Path


def _class_files(src: Path) -> list[tuple[str, list[Path]]]:
    return [(d.name, sorted(d.iterdir())) for d in sorted(p for p in src.iterdir() if p.is_dir())]


def _link(files: list[Path], folder: Path, prefix: str = "") -> int:
    folder.mkdir(parents=True, exist_ok=True)
    for file in files:
        os.link(file, folder / f"{prefix}{file.name}")
    return len(files)


def make_subset(src: Path, dst: Path, per_class: int, seed: int) -> int:
    """Link `per_class` files of every `src/<class>/` (drawn in sorted order with `seed`) into `dst/<class>/`."""
    rng = random.Random(seed)
    if dst.exists():
        raise SystemExit(f"error: {dst} exists; choose a new --dst")
    return sum(_link(rng.sample(files, per_class), dst / name) for name, files in _class_files(src))


def make_split(src: Path, dst: Path, test_per_class: int, seed: int) -> int:
    """Shuffle each class with `seed`; its first `test_per_class` go to `dst/test/<class>/`, the rest to train."""
    rng = random.Random(seed)
    if dst.exists():
        raise SystemExit(f"error: {dst} exists; choose a new --dst")
    count = 0
    for name, files in _class_files(src):
        rng.shuffle(files)
        count += _link(files[:test_per_class], dst / "test" / name)
        count += _link(files[test_per_class:], dst / "train" / name)
    return count


def make_enlarged(src: Path, dst: Path, extra_per_class: int) -> int:
    """Every file of `src/<class>/` in `dst/<class>/`, and its first `extra_per_class` again as `dup_<name>`."""
    if dst.exists():
        raise SystemExit(f"error: {dst} exists; choose a new --dst")
    return sum(
        _link(files, dst / name) + _link(files[:extra_per_class], dst / name, prefix="dup_")
        for name, files in _class_files(src)
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, required=True)
    parser.add_argument("--dst", type=Path, required=True)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--per_class", type=int, help="subset: images per class")
    mode.add_argument("--test_per_class", type=int, help="split: held-out test images per class")
    mode.add_argument("--extra_per_class", type=int, help="enlarge: images per class linked a second time")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.per_class is not None:
        count = make_subset(args.src, args.dst, args.per_class, args.seed)
    elif args.test_per_class is not None:
        count = make_split(args.src, args.dst, args.test_per_class, args.seed)
    else:
        count = make_enlarged(args.src, args.dst, args.extra_per_class)
    print(f"{count} images linked into {args.dst}")
