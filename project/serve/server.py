"""`python -m project serve`: an HTTP classification endpoint on LitServe, with dynamic batching."""

import logging
import os
import signal
from pathlib import Path
from typing import Any, Literal

from project.errors import UserError
from project.export.decoding import decoder_for
from project.export.preprocessing import read_metadata
from project.serve.api import ClassifierAPI


def serve(
    ckpt_path: str | None = None,
    config: list[str] | None = None,
    onnx: str | None = None,
    aoti: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch_size: int = 16,
    batch_timeout: float = 0.01,
    timeout: float = 30.0,
    max_upload_mb: float = 10.0,
    max_image_pixels: int = 40_000_000,
    workers: int = 1,
    accelerator: Literal["auto", "cpu", "cuda", "mps"] = "auto",
    threads: int | None = None,
    top_k: int = 5,
    log_level: str = "warning",
    overrides: list[str] | None = None,
) -> None:
    """Serve a trained classifier over HTTP: POST /predict with the image as multipart form field `file`; a page
    to try it in a browser at / (choose or drop images, see each answer).

    Answers JSON {"class_name", "class_index", "probability", "top_k": [the top_k classes, each {"class_name",
    "probability"}]}; for a multi-label model {"labels": [the tags at or above their thresholds], "probabilities":
    {tag: probability}}; for a regression model {"values": {target: value}}. Requests are batched dynamically (up to
    max_batch_size, waiting at most batch_timeout for a batch to fill). An upload that is not an image,
    is empty or has too many pixels gets a 4xx with a message; a body above max_upload_mb gets 413; a
    request that waits longer than timeout gets 504. GET /health answers "ok" once the model is loaded,
    GET /info describes the model (network, classes, input size, limits), GET / is the page. Serve a checkpoint (--ckpt_path, with --config), an exported ONNX model
    (--onnx) or an AOTInductor package (--aoti), each export with the model.json written beside it.

    Args:
        ckpt_path: Checkpoint written by `python -m project fit`.
        config: Config file(s) of the training run.
        onnx: An ONNX model written by `export` or `quantize` (instead of --ckpt_path).
        aoti: An AOTInductor package (model.pt2) written by `export --format aoti` (instead of --ckpt_path).
        host: Interface to bind; 127.0.0.1 accepts local connections only, 0.0.0.0 all (containers).
        port: TCP port.
        max_batch_size: Most requests per forward pass; 1 disables batching.
        batch_timeout: Seconds a batch waits to fill before it runs.
        timeout: Seconds a request may wait for the model before it is answered 504.
        max_upload_mb: Largest request body in MB (413 above).
        max_image_pixels: Largest width x height of an uploaded image (413 above).
        workers: Inference worker processes per device.
        accelerator: `auto`, `cpu`, `cuda` or `mps` (ONNX models run on the CPU, AOTInductor packages on the
            device they were compiled for).
        threads: CPU threads per inference worker.
        top_k: Also return the top_k most likely classes when above 1 (the page draws their bars).
        log_level: Server log level (`info` logs every request).
        overrides: --model.* / --data.* flags for the config parser.
    """
    import litserve as ls

    if sum(source is not None for source in (ckpt_path, onnx, aoti)) != 1:
        raise UserError(
            "give exactly one of --ckpt_path (a checkpoint), --onnx (an exported ONNX model) and --aoti (an "
            "AOTInductor package)"
        )
    exported = onnx or aoti
    for name, value in (("max_batch_size", max_batch_size), ("workers", workers), ("top_k", top_k)):
        if value < 1:
            raise UserError(f"--{name} must be at least 1, got {value}")
    if batch_timeout < 0 or timeout <= batch_timeout:
        raise UserError(f"need 0 <= --batch_timeout < --timeout, got {batch_timeout} and {timeout}")
    if max_upload_mb <= 0 or max_image_pixels < 1:
        raise UserError("--max_upload_mb and --max_image_pixels must be positive")

    # Load once here so a bad checkpoint, config or model stops with one clear line, not a worker crash.
    if exported:
        meta, pre = read_metadata(exported)
        outputs, network = meta.get("task"), (meta.get("source") or {}).get("network")
        accelerator = "cpu"  # the runtime picks its own device: a package runs where it was compiled for
        if aoti:
            from project.export.runtimes import AotiRuntime, aoti_device

            AotiRuntime(aoti, aoti_device(meta))  # a file that is no package stops here, not in a worker
    else:
        from project.export.trained import load_trained

        assert ckpt_path is not None  # exactly one of the three, checked above
        trained = load_trained(ckpt_path, config, overrides)
        pre, outputs, network = trained.preprocessing, trained.outputs, type(trained.net).__name__
    info = {
        "source": exported or ckpt_path,
        "network": network,
        "classes": list(pre.class_names),
        "input_shape": list(pre.input_shape),
        "limits": {"max_upload_mb": max_upload_mb, "max_image_pixels": max_image_pixels},
    } | decoder_for(outputs, pre.class_names).describe()

    api = ClassifierAPI(
        ckpt_path=ckpt_path,
        configs=config,
        overrides=overrides,
        onnx_path=onnx,
        aoti_path=aoti,
        max_batch_size=max_batch_size,
        batch_timeout=batch_timeout,
        max_image_pixels=max_image_pixels,
        threads=threads,
        top_k=top_k,
    )
    server = ls.LitServer(
        api,
        accelerator=accelerator,
        devices=1,
        workers_per_device=workers,
        timeout=timeout,
        max_payload_size=int(max_upload_mb * 2**20),
        model_metadata=info,
    )
    add_page(server.app)
    logging.getLogger("litserve").setLevel(log_level.upper())
    _stop_gracefully_on_signals()
    print(
        f"serving {info['source']} on http://{host}:{port}/predict (max_batch_size={max_batch_size}); "
        f"try it in a browser at http://{host}:{port}/",
        flush=True,
    )
    server.run(host=host, port=port, log_level=log_level, generate_client_file=False, num_api_servers=1)


#: The page at /: plain HTML and a few lines of JavaScript, no build step and nothing fetched from elsewhere.
PAGE = Path(__file__).with_name("page.html")


def add_page(app: Any) -> None:
    """Answer GET / on the FastAPI `app` with the page, in place of LitServe's plain "litserve running"."""
    from fastapi.responses import HTMLResponse

    html = PAGE.read_text(encoding="utf-8")
    app.router.routes[:] = [
        route
        for route in app.router.routes
        if not (getattr(route, "path", None) == "/" and "GET" in (getattr(route, "methods", None) or ()))
    ]

    async def page() -> HTMLResponse:
        return HTMLResponse(html)

    app.add_api_route("/", page, methods=["GET"], include_in_schema=False)


def _stop_gracefully_on_signals() -> None:
    """SIGTERM (docker stop, Kubernetes) and SIGINT both run LitServe's graceful shutdown, which stops the
    HTTP and inference worker processes too. Without this SIGTERM kills only this process and orphans
    the workers, and a server started in the background by a non-interactive shell ignores SIGINT."""

    main_pid = os.getpid()
    stopping = False
    # LitServe's worker-monitoring thread polls a multiprocessing manager that the shutdown closes under it;
    # its "Monitoring worker crashed" BrokenPipe traceback is then expected noise, and only then dropped.
    logging.getLogger("litserve.server").addFilter(
        lambda record: not (stopping and record.getMessage().startswith("Monitoring worker crashed"))
    )

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        if os.getpid() != main_pid:  # a forked HTTP worker (it inherits this handler) that uvicorn stopped
            raise SystemExit(0)
        stopping = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def parse_args(args: list[str]) -> dict:
    """The keyword arguments of `serve` for a command line (checks it without running anything)."""
    from project.cli.tool_args import parse_tool_args

    return parse_tool_args(serve, args, prog="python -m project serve")


def main(args: list[str]) -> None:
    serve(**parse_args(args))
