"""`python -m project predict_onnx`: batched inference from an exported ONNX model, without PyTorch Lightning.

Reads a folder of images of any size (or a CIFAR split), batches them, runs them through ONNX Runtime
and writes the same CSV as `python -m project predict` (input, class_index, class_name, probability; or
input, labels, p_<tag>... for a multi-label model). The images are decoded and normalised by the same
functions the DataModules use, with the facts from the model's JSON, so on the same inputs the answers
match `predict` from the checkpoint.
"""

import csv
from pathlib import Path

from torch.utils.data import DataLoader, Dataset

from project.atomic_files import atomic_path, check_writable
from project.data.decoded_cache import drop_bad
from project.data.image_reading import MAX_IMAGE_PIXELS, ImageFileDataset, check_image, list_images
from project.data.tensor_dataset import TensorImageDataset, collate_pre_batched
from project.errors import UserError
from project.export.decoding import decoder_for
from project.export.preprocessing import Preprocessing, read_metadata
from project.export.runtimes import exported_runtime

CIFAR_SPLITS = ("cifar10:test", "cifar10:train", "cifar100:test", "cifar100:train")


def _cifar(spec: str, data_dir: str, pre: Preprocessing) -> tuple[Dataset, list[str]]:
    import torch
    from torchvision import datasets

    name, split = spec.split(":")
    cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    try:
        ds = cls(data_dir, train=split == "train", download=False)
    except (RuntimeError, OSError) as e:
        raise UserError(
            f"{name} is not in {Path(data_dir).resolve()} ({e}); set --data_dir to where it is"
        ) from None
    if pre.decode_size != 32:
        raise UserError(
            f"the model expects images decoded at {pre.decode_size}x{pre.decode_size}; {name} images are 32x32"
        )
    images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
    return TensorImageDataset(images), [f"{name}/{split}/{i}" for i in range(len(images))]


def _folder(
    folder: Path, pre: Preprocessing, max_pixels: int, skip_corrupt: bool
) -> tuple[Dataset, list[str]]:
    if not folder.is_dir():
        raise UserError(f"--input {folder} is neither a folder nor one of {', '.join(CIFAR_SPLITS)}")
    files = list_images(folder)
    if not files:
        raise UserError(f"--input folder {folder} contains no images")
    # Every unreadable file named at once, before any is classified (or all of them left out, with a warning).
    bad = {i: reason for i, f in enumerate(files) if (reason := check_image(f, max_pixels))}
    if bad and not skip_corrupt:
        names = [f"{files[i]} ({bad[i]})" for i in sorted(bad)]
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        raise UserError(
            f"unreadable image file(s): {'; '.join(names[:3])}{more}. Remove or replace them, "
            "or add --skip_corrupt to leave them out with a warning"
        )
    files = [files[i] for i in drop_bad(list(range(len(files))), bad, files, skip_corrupt=True)]
    return ImageFileDataset(files, None, pre.decode_size, max_pixels), [str(f) for f in files]


def predict_onnx(
    model: str,
    input: str,
    output: str = "predictions.csv",
    batch_size: int = 64,
    data_dir: str = "data",
    num_workers: int = 0,
    threads: int | None = None,
    max_image_pixels: int = MAX_IMAGE_PIXELS,
    skip_corrupt: bool = False,
) -> Path:
    """Classify a folder of images (any size and mode) or a CIFAR split with an exported ONNX model (ONNX
    Runtime) or AOTInductor package (`model.pt2`, run by torch._inductor.aoti_load_package).

    Writes input,class_index,class_name,probability rows (input,labels,p_<tag>... for a multi-label model),
    like `python -m project predict`; the CSV appears only when every input was classified.

    Args:
        model: ONNX file written by `export` or `quantize`, or model.pt2 from `export --format aoti` (its
            model.json beside it).
        input: A folder of images (searched recursively), or cifar10:test, cifar10:train, cifar100:test,
            cifar100:train.
        output: The CSV file to write.
        batch_size: Images per model call.
        data_dir: Where the CIFAR dataset is, for a CIFAR input.
        num_workers: DataLoader processes decoding image files in parallel.
        threads: ONNX Runtime / torch intra-op threads (default: all cores).
        max_image_pixels: Largest width x height read; a larger image (a decompression bomb) is an error.
        skip_corrupt: Leave unreadable images out with one warning naming them, instead of stopping with an
            error that names every one.
    """
    if batch_size < 1:
        raise UserError(f"--batch_size must be at least 1, got {batch_size}")
    meta, pre = read_metadata(model)
    decoder = decoder_for(meta.get("task"), pre.class_names)
    path = Path(output)
    check_writable(path.parent, "output", hint="before any image is classified")
    dataset, names = (
        _cifar(input, data_dir, pre)
        if input in CIFAR_SPLITS
        else _folder(Path(input), pre, max_image_pixels, skip_corrupt)
    )
    batched = isinstance(dataset, TensorImageDataset)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=collate_pre_batched if batched else None,
    )
    runtime = exported_runtime(model, threads=threads)

    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["input", *decoder.csv_header()])
        for images, index in loader:
            probs = decoder.probabilities(runtime(pre.normalize(pre.to_input(images)).numpy()))
            for i, row in zip(index.tolist(), probs, strict=True):
                writer.writerow([names[i], *decoder.csv_row(row)])
    print(f"{len(names)} predictions written to {path}")
    return path


def parse_args(args: list[str]) -> dict:
    """The keyword arguments of `predict_onnx` for a command line (checks it without running anything)."""
    from project.cli.tool_args import parse_tool_args

    return parse_tool_args(predict_onnx, args, prog="python -m project predict_onnx")


def main(args: list[str]) -> None:
    predict_onnx(**parse_args(args))
