"""examples/aoti_cpp: a C++ program, built with CMake against the torch wheel's libtorch, runs a freshly exported
AOTInductor package on image files (read and preprocessed as model.json says) and agrees with Python."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from project.export.preprocessing import read_metadata
from project.export.runtimes import AotiRuntime
from tests import docs_pages
from tests.conftest import ROOT
from tests.fakes import class_images

pytest_plugins = ["tests.deploy_fixtures"]  # fixtures: trained_run, exported_aoti

EXAMPLE = ROOT / "examples" / "aoti_cpp"


def _is_cpp_line(line: str) -> bool:
    return line.startswith("cmake ") or " build/aoti_cpp/classify " in f" {line}"


def documented() -> list[str]:
    """The build and run lines of the docs (docs/production.md), which the example's README repeats."""
    lines = [line for _, line in docs_pages.shell_lines() if _is_cpp_line(line)]
    readme, inside = [], False
    for line in (EXAMPLE / "README.md").read_text().splitlines():
        if line.startswith("```"):
            inside = line == "```bash"
        elif inside and _is_cpp_line(line):
            readme.append(line)
    assert lines and lines == readme, (lines, readme)
    return lines


def _shell(line: str, **replace: str) -> subprocess.CompletedProcess:
    """A documented line run by bash from the repository's root, its `python` this one, its paths replaced."""
    for old, new in {"$(python ": f"$({sys.executable} ", **replace}.items():
        line = line.replace(old, new)
    proc = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (line, (proc.stdout + proc.stderr)[-4000:])
    return proc


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    """The example built by the documented commands, into a fresh build folder."""
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed: the C++ example builds with CMake and a C++ compiler")
    folder = tmp_path_factory.mktemp("aoti_cpp_build")
    for line in documented():
        if line.startswith("cmake "):
            _shell(line, **{"build/aoti_cpp": str(folder)})
    return folder


def _answers(stdout: str) -> dict[str, list[tuple[str, float]]]:
    """`IMAGE` lines, each followed by `  PROBABILITY  CLASS` lines -> {image: [(class, probability), ...]}."""
    answers: dict[str, list[tuple[str, float]]] = {}
    rows: list[tuple[str, float]] = []
    for line in stdout.splitlines():
        if line.startswith("  "):
            probability, name = line.split(maxsplit=1)
            rows.append((name, float(probability)))
        else:
            rows = answers[line] = []
    return answers


def _images(folder: Path) -> dict[Path, float]:
    """Real image files -> how closely C++ must match Python on each: exactly where no resampling happens,
    else within the rounding of an antialiased resize (libtorch's and PIL's round a pixel differently at most)."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    at_size = folder / "at_input_size.png"
    Image.fromarray(class_images(3, 1, 32, rng, 10)[0]).save(at_size)
    larger = folder / "larger.png"
    Image.fromarray(class_images(7, 1, 60, rng, 10)[0][:, :45]).save(larger)
    jpeg = folder / "photo.jpg"  # decoded at half scale first, as PIL's draft does
    Image.fromarray(class_images(1, 1, 96, rng, 10)[0][:80]).save(jpeg, quality=90)
    gray = folder / "gray.png"
    Image.fromarray(class_images(4, 1, 32, rng, 10)[0][..., 1]).save(gray)
    rgba = folder / "alpha.png"
    pixels = class_images(5, 1, 40, rng, 10)[0]
    Image.fromarray(np.dstack([pixels, np.full(pixels.shape[:2], 90, np.uint8)])).save(rgba)
    return {at_size: 1e-5, gray: 1e-5, larger: 2e-2, jpeg: 2e-2, rgba: 2e-2}


@pytest.mark.slow
def test_the_cpp_example_classifies_image_files_as_python_does(build, exported_aoti, tmp_path):
    # A folder as `export` leaves it: the package and its model.json.
    export = tmp_path / "export"
    export.mkdir()
    for name in ("model.pt2", "model.json"):
        shutil.copy(exported_aoti.with_name(name), export / name)
    images = _images(tmp_path / "images")
    (run,) = [line for line in documented() if not line.startswith("cmake ")]
    replace = {"build/aoti_cpp": str(build), "export/model.pt2": str(export / "model.pt2")}
    proc = _shell(run, **replace, **{"path/to/image.jpg": " ".join(map(str, images))})
    answers = _answers(proc.stdout)
    assert list(answers) == [str(p) for p in images]

    _, pre = read_metadata(export / "model.pt2")
    python = AotiRuntime(export / "model.pt2")
    for image, tolerance in images.items():
        logits = torch.from_numpy(python(pre.normalize(pre.decode(image)[None]).numpy()))
        probs = logits.softmax(1)[0]
        top = probs.argsort(descending=True)[:3].tolist()
        cpp = answers[str(image)]
        assert len(cpp) == 3 and cpp[0][0] == pre.class_names[top[0]], (image.name, cpp)
        for name, probability in cpp:
            assert probability == pytest.approx(float(probs[pre.class_names.index(name)]), abs=tolerance), (
                image.name
            )
        if tolerance < 1e-3:  # the same input: the same classes, in the same order
            assert [name for name, _ in cpp] == [pre.class_names[i] for i in top]

    # Bad input: one line naming it, exit status 1.
    classify = [str(build / "classify"), str(export / "model.pt2")]
    env = {**os.environ, "LD_LIBRARY_PATH": str(Path(torch.__file__).parent / "lib")}
    (tmp_path / "notes.txt").write_text("not an image")
    bad = subprocess.run([*classify, str(tmp_path / "notes.txt")], env=env, capture_output=True, text=True)
    assert (bad.returncode, bad.stderr) == (
        1,
        f"error: cannot read image {tmp_path / 'notes.txt'}: not a PNG or JPEG file\n",
    )
    (export / "model.json").unlink()
    lonely = subprocess.run([*classify, *map(str, images)], env=env, capture_output=True, text=True)
    assert lonely.returncode == 1 and lonely.stderr.startswith(
        f"error: {export / 'model.json'} does not exist"
    )
