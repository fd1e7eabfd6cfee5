"""A stratified, seeded subset of a class-folder dataset, hard-linked (no copies): `--per_class` images per class.

The cross-validation and search measurements use 500 CIFAR-10 JPEGs per class (5,000 images), the size of
dataset a user with a few thousand photos has:

    python -m benchmarks.cifar_subset --src /tmp/cifar10/train --dst /tmp/cifar5k --per_class 500 --seed 0
"""

import argparse
import os
import random
from pathlib import Path


def make_subset(src: Path, dst: Path, per_class: int, seed: int) -> int:
    """Link `per_class` files of every `src/<class>/` (drawn in sorted order with `seed`) into `dst/<class>/`."""
    rng = random.Random(seed)
    count = 0
    for folder in sorted(p for p in src.iterdir() if p.is_dir()):
        files = sorted(folder.iterdir())
        (dst / folder.name).mkdir(parents=True, exist_ok=False)
        for file in rng.sample(files, per_class):
            os.link(file, dst / folder.name / file.name)
            count += 1
    return count


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, required=True)
    parser.add_argument("--dst", type=Path, required=True)
    parser.add_argument("--per_class", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{make_subset(args.src, args.dst, args.per_class, args.seed)} images linked into {args.dst}")
