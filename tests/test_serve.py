"""`python -m project serve`: a real server on a free loopback port, real and bad uploads, clean stop."""

import io
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.responses import JSONResponse
from PIL import Image

from project.errors import UserError
from project.export.trained import load_trained
from project.serve.api import ClassifierAPI, Rejected
from project.serve.server import serve
from tests import docs_pages
from tests.conftest import ROOT
from tests.deploy_helpers import serving
from tests.fakes import class_images

pytest_plugins = ["tests.deploy_fixtures"]  # fixtures: trained_run, exported


def _png(label: int, size: tuple[int, int] = (45, 60), seed: int = 0) -> bytes:
    """An image of class `label` of the fake CIFAR data, at another size than the model's input."""
    rng = np.random.default_rng(seed)
    image = Image.fromarray(class_images(label, 1, max(size), rng, 10)[0][: size[1], : size[0]])
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def _eager_class(ckpt: Path, image: bytes) -> int:
    trained = load_trained(ckpt)
    x = trained.preprocessing.normalize(trained.preprocessing.decode(image)[None])
    with torch.no_grad():
        return int(trained.net(x).argmax())


@pytest.fixture
def server(trained_run, tmp_path):
    """`python -m project serve` from the checkpoint, batching on; always stopped, with its workers."""
    args = ["--ckpt_path", trained_run.ckpt, "--max_batch_size", "8", "--batch_timeout", "0.05"]
    with serving([*args, "--max_upload_mb", "0.5", "--threads", "1"], tmp_path) as running:
        yield running


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def documented_uploads() -> list[str]:
    """The pages' `curl ... /predict` lines (docs/production.md), each followed by the answer it shows."""
    return [line for line in docs_pages.lines() if line.startswith("curl ") and "/predict" in line]


@pytest.mark.slow
def test_serve_classifies_rejects_and_stops(server, trained_run, tmp_path):
    client, proc, log = server
    good = _png(label=4)
    answer = client.post("/predict", files={"file": ("img.png", good, "image/png")})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["class_index"] == _eager_class(trained_run.ckpt, good)
    assert body["class_name"] == client.get("/info").json()["model"]["classes"][body["class_index"]]
    assert 0.1 <= body["probability"] <= 1.0

    # The documented upload, run with curl as written but for the image and the port, answers the same.
    (image := tmp_path / "upload.png").write_bytes(good)
    lines = docs_pages.lines()
    assert documented_uploads()
    for command in documented_uploads():
        words = shlex.split(command.replace("path/to/image.jpg", str(image)))
        words = [w.replace("127.0.0.1:8000", f"{client.base_url.host}:{client.base_url.port}") for w in words]
        shown = json.loads(lines[lines.index(command) + 1].lstrip("# "))  # the answer the page shows
        run = subprocess.run([*words, "--silent", "--show-error"], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        reply = json.loads(run.stdout)
        assert shown.keys() == reply.keys() == body.keys()
        assert (reply["class_index"], reply["class_name"]) == (body["class_index"], body["class_name"])
        assert reply["probability"] == pytest.approx(body["probability"], abs=1e-5)

    # Bad uploads: each a 4xx with a message; the server keeps serving.
    text = client.post("/predict", files={"file": ("notes.txt", b"not an image", "text/plain")})
    assert text.status_code == 415 and "not an image" in text.json()["detail"]
    assert client.post("/predict", files={"image": ("img.png", good, "image/png")}).status_code == 422
    too_big = client.post("/predict", files={"file": ("big.png", b"\0" * 600_000, "image/png")})
    assert too_big.status_code == 413

    # Concurrent requests share batches; a bad upload among them fails alone.
    uploads = [("file", _png(label=i % 10, seed=i)) for i in range(12)] + [("file", _png(label=3)[:120])]
    with ThreadPoolExecutor(len(uploads)) as pool:
        replies = list(pool.map(lambda u: client.post("/predict", files={u[0]: ("x.png", u[1])}), uploads))
    assert [r.status_code for r in replies] == [200] * 12 + [400]  # the last one: a truncated PNG
    assert all(
        r.json()["class_index"] == _eager_class(trained_run.ckpt, u[1])
        for r, u in zip(replies[:12], uploads[:12], strict=True)
    )

    # SIGTERM stops the server and every worker process it started.
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    deadline = time.monotonic() + 30
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _group_alive(proc.pid), "worker processes outlived the server"
    assert "Traceback" not in log.read_text()


def test_api_from_onnx_in_process(exported, trained_run):
    """The same API over an exported ONNX model: decode, batch with a rejected upload, encode."""
    api = ClassifierAPI(onnx_path=str(exported), max_batch_size=4, max_image_pixels=10_000)
    api.setup("cpu")
    image = _png(label=7)
    decoded = [
        api.decode_request(image),
        api.decode_request(b"plain text"),
        api.decode_request(_png(1, (120, 100))),
    ]
    assert isinstance(decoded[0], torch.Tensor) and decoded[0].shape == (3, 32, 32)
    assert isinstance(decoded[1], Rejected) and decoded[1].status == 415
    assert isinstance(decoded[2], Rejected) and decoded[2].status == 413 and "120x100" in decoded[2].detail
    outputs = api.predict(api.batch(decoded))
    answers = [api.encode_response(o) for o in outputs]
    assert answers[0]["class_index"] == _eager_class(trained_run.ckpt, image)
    assert all(isinstance(a, JSONResponse) for a in answers[1:]) and answers[1].status_code == 415
    # Without batching LitServe passes one request at a time.
    single = api.encode_response(api.predict(api.decode_request(image)))
    assert single["class_index"] == answers[0]["class_index"]
    assert single["probability"] == pytest.approx(answers[0]["probability"], rel=1e-5)


@pytest.mark.slow
def test_api_from_an_aoti_package_in_process_answers_as_eager(exported_aoti, trained_run):
    api = ClassifierAPI(aoti_path=str(exported_aoti), max_batch_size=4, top_k=3)
    api.setup("cpu")
    images = [_png(label=i, seed=i) for i in (2, 5, 8)]
    answers = [
        api.encode_response(o) for o in api.predict(api.batch([api.decode_request(b) for b in images]))
    ]
    trained = load_trained(trained_run.ckpt)
    for image, answer in zip(images, answers, strict=True):
        x = trained.preprocessing.normalize(trained.preprocessing.decode(image)[None])
        with torch.no_grad():
            probs = trained.net(x).softmax(1)[0]
        assert answer["class_index"] == int(probs.argmax())
        assert answer["probability"] == pytest.approx(float(probs.max()), abs=1e-5)
        top = probs.argsort(descending=True)[:3].tolist()
        assert [c["class_name"] for c in answer["top_k"]] == [
            trained.preprocessing.class_names[i] for i in top
        ]


def test_the_page_replaces_litserves_root_answer(exported):
    import litserve as ls
    from fastapi.testclient import TestClient

    from project.serve.server import PAGE, add_page

    server = ls.LitServer(ClassifierAPI(onnx_path=str(exported)), accelerator="cpu")
    client = TestClient(server.app)
    assert client.get("/").text == "litserve running"  # LitServe's own
    add_page(server.app)
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<input id="files" type="file" accept="image/*" multiple' in page.text
    assert page.text == PAGE.read_text()
    assert client.get("/info").json()["server"]["devices"] == ["cpu"]  # LitServe's other routes stay


def test_serve_argument_errors(trained_run, exported, tmp_path):
    with pytest.raises(UserError, match="exactly one of --ckpt_path"):
        serve(ckpt_path=str(trained_run.ckpt), onnx=str(exported))
    with pytest.raises(UserError, match=r"exactly one of --ckpt_path .*--onnx .*--aoti"):
        serve(onnx=str(exported), aoti=str(exported))
    not_a_package = tmp_path / "model.pt2"  # a .pt2 that holds no compiled model
    not_a_package.write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip
    not_a_package.with_name("model.json").write_bytes(exported.with_name("model.json").read_bytes())
    with pytest.raises(UserError, match=r"model\.pt2 is not an AOTInductor package .*export --format aoti"):
        serve(aoti=str(not_a_package))
    with pytest.raises(UserError, match="--batch_timeout < --timeout"):
        serve(onnx=str(exported), batch_timeout=5, timeout=1)
    lonely = tmp_path / "lonely.onnx"
    lonely.write_bytes(exported.read_bytes())
    with pytest.raises(UserError, match=r"lonely\.json does not exist: an exported model needs the JSON"):
        serve(onnx=str(lonely))


# part: benchmarks
@pytest.mark.slow
def test_serve_load_benchmark_reports_both_modes(exported, tmp_path):
    """benchmarks/serve_load.py (the figures in benchmarks/README.md section 7) runs end to end on a tiny model:
    one JSON line per batching mode with every request answered, then the ratio of their requests/s."""
    import json

    images = tmp_path / "images"
    images.mkdir()
    for label in range(3):
        (images / f"{label}.png").write_bytes(_png(label, seed=label))
    proc = subprocess.run(
        [
            sys.executable, "-m", "benchmarks.serve_load", "--onnx", str(exported), "--images", str(images),
            "--requests", "12", "--concurrency", "3", "--warmup", "3", "--max_batch_size", "4", "--threads", "1",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    modes = {row["mode"]: row for row in map(json.loads, lines[1:3])}
    assert set(modes) == {"batching_on", "batching_off"}
    assert modes["batching_on"]["max_batch_size"] == 4 and modes["batching_off"]["max_batch_size"] == 1
    for row in modes.values():
        assert row["requests"] == 12 and row["errors"] == 0
        assert row["requests_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"]
    ratio = modes["batching_on"]["requests_per_s"] / modes["batching_off"]["requests_per_s"]
    assert lines[3] == f"ratio: {ratio:.2f}"


# /part: benchmarks


def test_stopping_drops_only_the_monitors_expected_broken_pipe(caplog):
    """On SIGTERM LitServe closes the manager its monitoring thread polls: that thread's crash report is
    noise then, and only then; every other LitServe message still gets through."""
    from project.serve.server import _stop_gracefully_on_signals

    logger = logging.getLogger("litserve.server")
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    filters = list(logger.filters)
    try:
        _stop_gracefully_on_signals()
        with caplog.at_level(logging.INFO, logger="litserve.server"):
            logger.error("Monitoring worker crashed")  # while serving: a real fault, shown
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGTERM)
            logger.error("Monitoring worker crashed")  # during the shutdown: dropped
            logger.info("Shutting down LitServe...")
        assert [r.getMessage() for r in caplog.records] == [
            "Monitoring worker crashed",
            "Shutting down LitServe...",
        ]
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
        logger.filters[:] = filters
