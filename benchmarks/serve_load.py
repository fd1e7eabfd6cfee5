"""Load test of `python -m project serve`: requests/s and p50/p99 latency with dynamic batching on vs off.

Starts the server twice on a free 127.0.0.1 port, from the same model: once with `--max_batch_size N`
(batching on) and once with `--max_batch_size 1` (off). Each time it sends `--warmup` requests, then
`--requests` POSTs of real images from `--concurrency` client threads (stopping early after
`--max_seconds`), and stops the server. Prints one JSON line per mode, then `ratio: X` = requests/s with
batching / without.

    python -m benchmarks.serve_load --onnx quantize/model.onnx --images /tmp/cifar10/cifar10/train/cat
    python -m benchmarks.serve_load --ckpt_path logs/runs/version_0/checkpoints/last.ckpt --concurrency 32

The clients run on the same machine as the server: on a small CPU they compete with it for cores, so
compare the two modes with each other (same clients, same load), not with another machine's figures.
"""

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from benchmarks.common import emit, machine

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_images(folder: str | None, count: int = 64) -> list[bytes]:
    """Up to `count` image files from `folder`, or generated JPEGs of mixed sizes without one."""
    if folder:
        files = sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))[
            :count
        ]
        if not files:
            raise SystemExit(f"no .jpg/.png images in {folder}")
        return [f.read_bytes() for f in files]
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    images = []
    for _ in range(count):
        h, w = rng.integers(32, 96, 2)
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buffer, "JPEG")
        images.append(buffer.getvalue())
    return images


class Server:
    """`python -m project serve ...` in its own process group, stopped (with its workers) on exit."""

    def __init__(
        self, model_args: list[str], max_batch_size: int, batch_timeout: float, threads: int | None
    ) -> None:
        self.port = free_port()
        args = [*model_args, "--port", str(self.port), "--max_batch_size", str(max_batch_size)]
        args += ["--batch_timeout", str(batch_timeout), "--timeout", "60"]
        if threads:
            args += ["--threads", str(threads)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "project", "serve", *args],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "Server":
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited: {self.proc.stderr.read().decode()[-2000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return self
            time.sleep(0.5)
        self.__exit__()
        raise SystemExit("server not ready in 600 s")

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def run_load(
    url: str, images: list[bytes], requests: int, concurrency: int, max_seconds: float, warmup: int
) -> dict:
    """Send the requests from `concurrency` threads; latency per request and overall requests/s."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(base_url=url, timeout=120, limits=limits) as client:

        def post(i: int) -> tuple[float, int]:
            start = time.perf_counter()
            status = client.post("/predict", files={"file": ("img.jpg", images[i % len(images)])}).status_code
            return time.perf_counter() - start, status

        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(post, range(warmup)))
            deadline = time.monotonic() + max_seconds
            lock, results = threading.Lock(), []
            counter = iter(range(requests))

            def worker() -> None:
                while time.monotonic() < deadline:
                    with lock:
                        i = next(counter, None)
                    if i is None:
                        return
                    latency = post(i)
                    with lock:
                        results.append(latency)

            start = time.perf_counter()
            for future in [pool.submit(worker) for _ in range(concurrency)]:
                future.result()
            wall = time.perf_counter() - start
    latencies = sorted(t for t, status in results if status == 200)
    if not latencies:
        raise SystemExit("no request succeeded")
    return {
        "requests": len(results),
        "errors": sum(status != 200 for _, status in results),
        "seconds": round(wall, 2),
        "requests_per_s": round(len(latencies) / wall, 2),
        "p50_ms": round(1000 * statistics.median(latencies), 1),
        "p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--onnx", help="ONNX model written by export/quantize (model.json beside it)")
    model.add_argument("--ckpt_path", help="checkpoint written by fit")
    parser.add_argument("--config", action="append", default=[], help="config(s) of the run, for --ckpt_path")
    parser.add_argument("--images", help="folder of images to send (default: generated JPEGs)")
    parser.add_argument("--requests", type=int, default=400, help="timed requests per mode")
    parser.add_argument("--concurrency", type=int, default=32, help="client threads")
    parser.add_argument(
        "--max_seconds", type=float, default=120, help="stop sending after this long, per mode"
    )
    parser.add_argument("--warmup", type=int, default=32, help="untimed requests per mode")
    parser.add_argument("--max_batch_size", type=int, default=32, help="batch size of the batching-on mode")
    parser.add_argument("--batch_timeout", type=float, default=0.01, help="seconds a batch waits to fill")
    parser.add_argument("--threads", type=int, help="CPU threads of the inference worker")
    args = parser.parse_args()

    model_args = ["--onnx", args.onnx] if args.onnx else ["--ckpt_path", args.ckpt_path]
    for config in args.config:
        model_args += ["--config", config]
    images = load_images(args.images)
    emit(
        benchmark="serve_load",
        machine=machine(),
        model=args.onnx or args.ckpt_path,
        concurrency=args.concurrency,
    )
    throughput = {}
    for mode, batch in (("batching_on", args.max_batch_size), ("batching_off", 1)):
        with Server(model_args, batch, args.batch_timeout if batch > 1 else 0.0, args.threads) as server:
            result = run_load(
                server.url, images, args.requests, args.concurrency, args.max_seconds, args.warmup
            )
        throughput[mode] = result["requests_per_s"]
        emit(mode=mode, max_batch_size=batch, **result)
    print(f"ratio: {throughput['batching_on'] / throughput['batching_off']:.2f}")


if __name__ == "__main__":
    main()
