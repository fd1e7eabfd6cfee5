"""The page `serve` answers at /, in a real browser: Debian's chromium driven by Playwright.

Real image files are chosen (and one dropped) and each answer is read off the page: the class with its
probability bars, the tags with their thresholds, the values; a decompression bomb, a non-image and an upload
above the size limit each show their one-line message. The classifier's page is saved as a
screenshot; with UPDATE_SCREENSHOT=1 it replaces the docs' (docs/_static/serve_page.png), so a test run
leaves the checkout as it found it.
"""

import base64
import os
import shutil
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from project.export.decoding import decoder_for
from project.export.model_export import export_trained
from project.export.preprocessing import Preprocessing, read_metadata
from project.export.runtimes import OnnxRuntime
from project.export.trained import TrainedModel, load_trained
from project.models import MLP
from project.serve.server import PAGE
from tests.conftest import ROOT
from tests.deploy_helpers import serving
from tests.fakes import bomb_png, class_images

pytest_plugins = ["tests.deploy_fixtures"]  # fixtures: trained_run, exported_aoti

CHROMIUM = "/usr/bin/chromium"  # Debian's (apt-get install chromium); Playwright's own download is not used
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT = ROOT / "docs" / "_static" / "serve_page.png"

#: Everything the page shows of each answer, read from the page itself.
READ_ANSWERS = """() => [...document.querySelectorAll(".result")].map((card) => {
  const box = card.querySelector(".answer");
  return {
    file: card.dataset.file,
    kind: box.dataset.kind || null,
    error: box.classList.contains("error") ? box.textContent : null,
    top: card.querySelector(".top-class")?.textContent ?? null,
    labels: card.querySelector(".labels")?.textContent ?? null,
    rows: [...box.querySelectorAll(".row")].map((r) => ({
      name: r.querySelector(".name").textContent, p: Number(r.dataset.probability),
      shown: r.querySelector(".p").textContent, chosen: r.classList.contains("chosen"),
      threshold: r.querySelector("i")?.title ?? null,
    })),
    values: [...box.querySelectorAll("tr")].map((r) => ({
      name: r.cells[0].textContent, shown: r.querySelector(".value").textContent,
    })),
  };
})"""

#: Files dropped on the page as a person drops them: a `drop` event whose DataTransfer holds them.
DROP = """([name, data]) => {
  const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
  const files = new DataTransfer();
  files.items.add(new File([bytes], name, {type: "image/png"}));
  document.getElementById("drop").dispatchEvent(new DragEvent("drop", {dataTransfer: files, bubbles: true}));
}"""


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import Error, sync_playwright

    with sync_playwright() as playwright:
        try:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, timeout=120_000)
        except Error as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            pytest.skip(f"chromium cannot start here ({first}); on Debian: apt-get install chromium")
        try:
            yield chromium
        finally:
            chromium.close()


def _open(browser, client):
    page = browser.new_page(viewport={"width": 1100, "height": 800})
    page.goto(f"{client.base_url}/")
    page.wait_for_selector("#model-name[data-loaded]", timeout=60_000)
    return page


def _answers(page, count: int) -> dict[str, dict]:
    page.wait_for_function(
        f"document.querySelectorAll('.result[data-done]').length === {count}", timeout=120_000
    )
    return {answer["file"]: answer for answer in page.evaluate(READ_ANSWERS)}


def _image(path: Path, label: int, size: tuple[int, int], seed: int) -> Path:
    """A real image file of class `label` of the fake CIFAR data, of another size than the network's input."""
    pixels = class_images(label, 1, max(size), np.random.default_rng(seed), 10)[0][: size[1], : size[0]]
    Image.fromarray(pixels).save(path, quality=95)
    return path


@pytest.mark.slow
def test_a_person_tries_the_classifier_on_the_page(browser, trained_run, exported_aoti, tmp_path):
    # Served as a user serves an export: the package and its model.json in a folder, named on the command line.
    (tmp_path / "export").mkdir()
    for name in ("model.pt2", "model.json"):
        shutil.copy(exported_aoti.with_name(name), tmp_path / "export" / name)
    images = tmp_path / "photos"
    images.mkdir()
    good = [
        _image(images / "truck.png", 9, (45, 60), 1),
        _image(images / "frog.jpg", 6, (50, 50), 2),
        _image(images / "ship.png", 8, (32, 32), 3),
    ]
    (images / "huge.png").write_bytes(bomb_png())
    (images / "notes.txt").write_text("not an image")
    (images / "big.png").write_bytes(np.random.default_rng(0).bytes(300_000))
    dropped = _image(images / "dropped.png", 2, (70, 40), 4)

    trained = load_trained(trained_run.ckpt)
    names = trained.preprocessing.class_names
    args = ["--aoti", "export/model.pt2", "--max_upload_mb", "0.2", "--threads", "1"]
    with serving(args, tmp_path) as (client, _, log):
        page = _open(browser, client)
        assert page.text_content("#model-name") == "SimpleCNN"
        facts = page.text_content("#model-facts")
        assert f"10 classes: {', '.join(names)}" in facts and "input 3 × 32 × 32" in facts
        assert "export/model.pt2" in facts and "0.2 MB" in page.text_content("#limits")

        page.set_input_files("#files", [*good, images / "huge.png", images / "notes.txt", images / "big.png"])
        _answers(page, 6)
        page.evaluate(DROP, [dropped.name, base64.b64encode(dropped.read_bytes()).decode()])
        answers = _answers(page, 7)

        for path in [*good, dropped]:
            x = trained.preprocessing.normalize(trained.preprocessing.decode(path)[None])
            with torch.no_grad():
                probs = trained.net(x).softmax(1)[0]
            top = probs.argsort(descending=True)[:5].tolist()
            shown = answers[path.name]
            assert shown["kind"] == "class" and shown["error"] is None
            assert shown["top"] == names[top[0]]
            assert [row["name"] for row in shown["rows"]] == [names[i] for i in top]
            assert [row["chosen"] for row in shown["rows"]] == [True, False, False, False, False]
            for row, i in zip(shown["rows"], top, strict=True):
                assert row["p"] == pytest.approx(float(probs[i]), abs=1e-4)
                assert row["shown"] == f"{100 * row['p']:.1f}%"

        bomb = answers["huge.png"]["error"]  # the API's own message, as it is
        assert bomb.startswith("error: the image declares ") and bomb.endswith(
            "the limit of 40,000,000 (HTTP 413)"
        )
        assert answers["notes.txt"]["error"].startswith("error: the upload is not an image PIL can read")
        assert answers["big.png"]["error"] == (
            "error: the file is larger than this server accepts (0.2 MB, serve --max_upload_mb) (HTTP 413)"
        )
        shot = SCREENSHOT if os.environ.get("UPDATE_SCREENSHOT") == "1" else tmp_path / SCREENSHOT.name
        page.screenshot(path=str(shot), full_page=True)
        page.close()
    assert "Traceback" not in log.read_text()
    assert Image.open(shot).size[0] == 1100


def _export(tmp_path: Path, spec: dict, names: tuple[str, ...]) -> Path:
    """A tiny network's ONNX export whose task record is `spec` (no training: the page only shows answers)."""
    torch.manual_seed(0)
    net = MLP(num_classes=len(names), input_shape=(3, 8, 8), hidden=8).eval()
    pre = Preprocessing((3, 8, 8), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), names)
    export_trained(TrainedModel(net, pre, Namespace(), Path("m.ckpt"), spec), tmp_path, formats=("onnx",))
    return tmp_path / "model.onnx"


def _png(colour: tuple[int, int, int], path: Path) -> Path:
    Image.new("RGB", (13, 9), colour).save(path)
    return path


def _expected(model: Path, image: Path) -> dict:
    meta, pre = read_metadata(model)
    decoder = decoder_for(meta["task"], pre.class_names)
    outputs = OnnxRuntime(model)(pre.normalize(pre.decode(image)[None]).numpy())
    return decoder.answer(decoder.probabilities(outputs)[0])


@pytest.mark.slow
def test_the_page_shows_tags_with_their_thresholds_and_values_as_they_are(browser, tmp_path):
    cases = [  # the kinds of target present, each as its task records it
        # part: tags
        ("tags", {"task": "MultiLabelClassifier", "kind": "tags", "outputs": "logits", "thresholds": [0.4, 0.6]},
         ("cat", "outdoor")),
        # /part: tags
        # part: regression
        ("values", {"task": "ImageRegressor", "kind": "values", "names": ["age", "angle"], "outputs": "values"},
         ("age", "angle")),
        # /part: regression
    ]  # fmt: skip
    images = [_png(c, tmp_path / f"{i}.png") for i, c in enumerate([(255, 0, 0), (0, 0, 255), (30, 200, 30)])]
    for kind, spec, names in cases:
        folder = tmp_path / kind
        model = _export(folder, spec, names)
        with serving(["--onnx", model, "--threads", "1"], folder) as (client, _, _):
            page = _open(browser, client)
            noun = "tags" if kind == "tags" else "targets"
            assert f"2 {noun}: {', '.join(names)}" in page.text_content("#model-facts")
            page.set_input_files("#files", images)
            answers = _answers(page, len(images))
            page.close()
        for image in images:
            expected, shown = _expected(model, image), answers[image.name]
            assert shown["kind"] == kind and shown["error"] is None
            if kind == "tags":
                assert shown["labels"] == (", ".join(expected["labels"]) or "no tag")
                assert [row["name"] for row in shown["rows"]] == list(names)
                assert [row["threshold"] for row in shown["rows"]] == ["threshold 0.4", "threshold 0.6"]
                for row in shown["rows"]:
                    assert row["p"] == pytest.approx(expected["probabilities"][row["name"]], abs=1e-6)
                    assert row["chosen"] == (row["name"] in expected["labels"])
            else:
                assert [row["name"] for row in shown["values"]] == list(names)
                for row in shown["values"]:
                    assert float(row["shown"]) == pytest.approx(
                        expected["values"][row["name"]], rel=1e-4, abs=1e-4
                    )


def test_the_page_reads_nothing_from_elsewhere():
    """Offline: no script, style, font or image from another host; only the server's own /info and /predict."""
    page = PAGE.read_text()
    assert "http://" not in page and "https://" not in page and "//cdn" not in page
    assert 'fetch("info")' in page and 'fetch("predict"' in page
    assert page.count("<script") == 1 and "<script src" not in page and "<link" not in page  # inline only
