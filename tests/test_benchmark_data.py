"""The benchmark datasets are rebuilt from the JPEGs by one command each: split, enlarged copy and subset."""

from pathlib import Path

import pytest

from benchmarks.cifar_subset import make_enlarged, make_split, make_subset


@pytest.fixture
def jpegs(tmp_path: Path) -> Path:
    for name in ("cat", "dog"):
        (tmp_path / "src" / name).mkdir(parents=True)
        for i in range(10):
            (tmp_path / "src" / name / f"{i:04d}.jpg").write_bytes(f"{name}{i}".encode())
    return tmp_path / "src"


def names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_split_holds_out_the_same_images_per_class_and_keeps_the_rest(jpegs, tmp_path):
    assert make_split(jpegs, tmp_path / "a", test_per_class=3, seed=0) == 20
    make_split(jpegs, tmp_path / "b", test_per_class=3, seed=0)
    for name in ("cat", "dog"):
        test, train = names(tmp_path / "a/test" / name), names(tmp_path / "a/train" / name)
        assert len(test) == 3 and not test & train and test | train == names(jpegs / name)
        assert test == names(tmp_path / "b/test" / name)  # seeded: the same split every time
    assert next((tmp_path / "a/test/cat").iterdir()).stat().st_nlink > 1  # hard links, not copies


def test_enlarged_copy_and_subset(jpegs, tmp_path):
    assert make_enlarged(jpegs, tmp_path / "big", extra_per_class=4) == 28
    assert names(tmp_path / "big/cat") == names(jpegs / "cat") | {f"dup_{i:04d}.jpg" for i in range(4)}
    assert make_subset(jpegs, tmp_path / "small", per_class=5, seed=0) == 10
    assert names(tmp_path / "small/dog") <= names(jpegs / "dog")
    with pytest.raises(SystemExit, match="exists"):
        make_subset(jpegs, tmp_path / "small", per_class=5, seed=0)


# -- the benchmarks' datasets ------------------------------------------------------------------------------------
