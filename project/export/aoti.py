"""AOTInductor packages: a network compiled ahead of time into a `.pt2` that C++ and Python load without its code.

`torch.export` captures the evaluation network with a dynamic batch dimension; `aoti_compile_and_package`
compiles that graph to a shared library (a C++ compiler runs here) and zips it with the weights. Python runs
the package with `torch._inductor.aoti_load_package`, C++ with `torch::inductor::AOTIModelPackageLoader`
(`examples/aoti_cpp/`). This is PyTorch's maintained replacement for TorchScript as the C++ route.
"""

import contextlib
import copy
import io
import logging
import platform
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from project.atomic_files import is_disk_full, no_space_left
from project.errors import UserError

#: Where the package is compiled to run: CPU (the default; any x86-64 machine) or an NVIDIA GPU.
AotiDevice = Literal["cpu", "cuda"]
#: The largest batch the compiled package accepts (its dynamic batch dimension runs from 1 to this).
MAX_BATCH = 1 << 16


def first_line(error: BaseException) -> str:
    """`Type: the first line of its message` (a compiler's or exporter's error can run to pages)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:300]}" if text else type(error).__name__


def disk_full(error: BaseException) -> bool:
    """Whether `error`, or one it was raised from, is a full disk (also as torch's C++ writers report it)."""
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        if is_disk_full(link):
            return True
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return False


def check_device(device: str) -> None:
    """A UserError unless packages can be compiled for, and run on, `device` on this machine."""
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "--device cuda: no CUDA device is available here; compile the package with --device cpu"
        )


#: Torch's loggers whose notes during an export are not the user's business: that a CUDA_HOME exists without a
#: CUDA runtime (logged once per process where inductor first loads; true of many CPU machines, and irrelevant to
#: a CPU package), and torch.export's account of a capture failure, which the one error line already names.
QUIETED_LOGGERS = ("torch.utils.cpp_extension", "torch.fx.experimental.symbolic_shapes", "torch.export")


@contextlib.contextmanager
def _torch_notes_hidden(stderr: bool = False) -> Iterator[None]:
    """Within the block: QUIETED_LOGGERS silent, no Python warnings (inductor's notes on its own compile
    choices), and with `stderr` nothing printed to sys.stderr (torch.export prints the partial graph of a
    network it cannot capture there, before raising)."""
    logs = [logging.getLogger(name) for name in QUIETED_LOGGERS]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.ExitStack() as stack:
            warnings.simplefilter("ignore")
            if stderr:
                stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
            yield
    finally:
        for log, level in zip(logs, levels, strict=True):
            log.setLevel(level)


def export_aoti(
    net: nn.Module, input_shape: tuple[int, int, int], path: str | Path, device: AotiDevice = "cpu"
) -> None:
    """Compile `net` (eval mode) into an AOTInductor package at `path`, batch dimension dynamic (1..MAX_BATCH).

    A network `torch.export` cannot capture (data-dependent Python control flow, unsupported operations) is a
    UserError that names it and points to ONNX, whose exporter falls back to TorchScript's tracer; so is a
    failed compilation (no C++ compiler) and a full disk under the compiler's files. Writing `path` on a full disk
    raises OSError (ENOSPC), for the caller to report.
    """
    check_device(device)
    example = torch.randn(2, *input_shape, device=device)  # 2, not 1: a size-1 example would be specialised
    # A copy on the GPU: moving `net` there and back would move the exported program's weights with it.
    module = net if device == "cpu" else copy.deepcopy(net).to(device)
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    try:
        with torch.no_grad(), _torch_notes_hidden(stderr=True):
            program = torch.export.export(module, (example,), dynamic_shapes=({0: batch},))
    except Exception as e:
        raise UserError(
            f"torch.export cannot capture the network {type(net).__name__} for an AOTInductor package "
            f"({first_line(e)}); export it with --format onnx instead"
        ) from None
    package = io.BytesIO()
    try:
        with _torch_notes_hidden():
            torch._inductor.aoti_compile_and_package(program, package_path=package)
    except Exception as e:
        if disk_full(e):
            from torch._inductor.runtime.cache_dir_utils import cache_dir

            raise UserError(
                no_space_left(
                    f"the compiler's files in {cache_dir()}",
                    "nothing was written to --output_dir",
                    "Free some space there, or set TORCHINDUCTOR_CACHE_DIR to a folder on a disk with room",
                )
            ) from None
        raise UserError(
            f"AOTInductor could not compile the network {type(net).__name__} ({first_line(e)}); it needs a "
            "working C++ compiler (g++ or clang++); export with --format onnx instead"
        ) from None
    # Written from memory: torch's C++ zip writer ends the whole process when the disk fills (it raises, then
    # terminates in its destructor); a Python write of the same bytes raises OSError (ENOSPC) instead.
    Path(path).write_bytes(package.getbuffer())


def compiled_for(device: AotiDevice) -> str:
    """What the package's kernels need of the machine that runs them: the CPU's vector instructions Inductor
    chose here (a package made on an AVX-512 machine stops with an illegal instruction on one without), or the
    GPU's compute capability."""
    if device == "cuda":
        major, minor = torch.cuda.get_device_capability()
        return f"CUDA sm_{major}{minor} ({torch.cuda.get_device_name()})"
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return f"{platform.machine()} CPU with {str(pick_vec_isa()) or 'no vector instructions'}"


def is_aoti_package(path: str | Path) -> bool:
    """Whether `path` is an AOTInductor package (a zip holding a compiled model), not e.g. a torch.export program."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any("/data/aotinductor/" in f"/{name}" for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def load_aoti(path: str | Path) -> Callable[[torch.Tensor], torch.Tensor]:
    """The compiled model in an AOTInductor package, called with one batch; UserError naming a bad file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"AOTInductor package {path} does not exist")
    if not is_aoti_package(path):
        raise UserError(
            f"{path} is not an AOTInductor package (no compiled model inside): write one with "
            "`export --format aoti`"
        )
    try:
        with _torch_notes_hidden():
            return torch._inductor.aoti_load_package(str(path))
    except Exception as e:
        raise UserError(f"cannot load the AOTInductor package {path} ({first_line(e)})") from None
