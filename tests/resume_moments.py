"""Stopping a real `python -m project fit` from outside at chosen moments, resuming it, and comparing the end
with the run never stopped: what tests/test_exact_resume.py and benchmarks/resume_moments.py share.

The child runs with `Progress`, which appends one line per event (a batch of the sanity check or of a
validation, a training step starting, a checkpoint being written) to a file with its time. A first,
uninterrupted run gives the timeline; each moment to stop at is an event of that timeline plus a random delay
shorter than the event's duration, so SIGTERM lands inside the sanity check, a step, a validation or a
checkpoint write. The test process waits for the event in the running process's file, sleeps the delay and
sends SIGTERM to one of the run's processes (a random rank under DDP); the run continues with the same command
plus `--ckpt_path last` until the next moment, and so on.

No timing is assumed: a loaded machine may see the event late, or sleep longer than asked, so the signal could
land steps later, or after the run has ended. The running process therefore waits at the event that follows
the moment's until the signal has been sent (`Progress` reads the moment from `<progress>.moment` and waits for
`<progress>.sent`): the signal lands inside the moment's event on any machine, only the point within it
varies, and every moment stops the run.
"""

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from tests.conftest import ROOT, subprocess_env

#: The last line a run stopped by SIGTERM prints.
STOPPED = "error: stopped by SIGTERM; resume with the same command plus --ckpt_path last"
#: What a moment can be: inside the sanity check, a training step, a validation batch, or a checkpoint write.
KINDS = ("sanity", "step", "validation", "checkpoint")


class Progress(Callback):
    """Appends `<event> <global step> <time>` to `path`.rank<N> at each event of the run (unbuffered); draws
    from no random generator and changes nothing in the run.

    On rank 0, when `path`.moment names an event (`<kind> <step> <occurrence>`), the event after that one waits
    until `path`.sent exists: the signal sent from outside at that moment lands before the run goes on."""

    #: How long the run waits for the signal at most (the test process is gone, or failed).
    WAIT = 300.0

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._moment: tuple[str, int, int] | None = None
        self._seen: dict[tuple[str, int], int] = {}
        self._armed = False

    def _say(self, trainer: L.Trainer, event: str) -> None:
        if self._fd is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
            self._fd = os.open(f"{self.path}.rank{trainer.global_rank}", flags, 0o644)
            moment = Path(f"{self.path}.moment")
            if trainer.global_rank == 0 and moment.is_file():
                kind, step, occurrence = moment.read_text().split()
                self._moment = (kind, int(step), int(occurrence))
        if self._armed:  # the moment's event is over: not beyond it before the signal is sent
            self._armed = False
            deadline = time.monotonic() + self.WAIT
            while not os.path.exists(f"{self.path}.sent") and time.monotonic() < deadline:
                time.sleep(0.001)
        step = trainer.global_step
        os.write(self._fd, f"{event} {step} {time.time():.6f}\n".encode())
        occurrence = self._seen.get((event, step), 0)
        self._seen[(event, step)] = occurrence + 1
        self._armed = self._moment == (event, step, occurrence)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._say(trainer, "step")

    def on_validation_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._say(trainer, "sanity" if trainer.sanity_checking else "validation")

    def on_save_checkpoint(self, trainer: L.Trainer, *args: Any) -> None:
        self._say(trainer, "checkpoint")

    def on_train_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._say(trainer, "end")


@dataclass(frozen=True)
class Event:
    kind: str
    step: int
    time: float


def read_events(path: Path) -> list[Event]:
    """The events written so far to one process's progress file (a line being written is left out)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    events = []
    for line in text.splitlines(keepends=True):
        if line.endswith("\n"):
            kind, step, at = line.split()
            events.append(Event(kind, int(step), float(at)))
    return events


@dataclass(frozen=True)
class Moment:
    """Stop with SIGTERM to process `rank`, `delay` seconds after the `occurrence`-th event `kind` at `step`
    has begun (counted in the running process)."""

    kind: str
    step: int
    occurrence: int
    delay: float
    rank: int = 0

    def __str__(self) -> str:
        return f"{self.kind}@{self.step}#{self.occurrence}+{self.delay * 1000:.1f}ms->rank{self.rank}"


def _reach(timeline: list[Event]) -> list[tuple[int, int]]:
    """For each event of `timeline`: (the number of training batches begun before the event that follows it,
    the index of the event before which a signal landing inside it has stopped the run at the latest).

    A signal landing before event i + 1 reaches every process by the end of the first batch b that begins at
    i + 1 or later; StopTogether stops after b, or, where b ends its epoch, after the next batch, or that
    batch's epoch (where it ends its epoch too): before batch b + 2 begins in any case."""
    starts = [i for i, e in enumerate(timeline) if e.kind == "step"]
    reach = []
    for i in range(len(timeline)):
        b = sum(s <= i for s in starts)  # the first batch beginning after event i
        reach.append((b, starts[b + 2] if b + 2 < len(starts) else len(timeline)))
    return reach


def choose_moments(
    timeline: list[Event], count: int, rng: random.Random, ranks: int = 1, first: tuple[str, ...] = ()
) -> list[Moment]:
    """`count` moments of `timeline` (the uninterrupted run's rank-0 events), spread over the run, kinds taken
    in turn (the kinds `first` first, the others in random order), each with a delay inside its event.

    Only moments a stop can follow: at least two training batches after the one that takes the signal (a
    signal in the last epoch's last batch, or its validation, finishes the run). Each moment comes after the
    latest point the one before it can stop the run (see `_reach`), so it happens in the resumed run. Raises
    ValueError when the timeline is too short for `count` such moments."""
    batches = sum(e.kind == "step" for e in timeline)
    reach = _reach(timeline)
    candidates: dict[str, list[int]] = {kind: [] for kind in KINDS}
    seen: dict[tuple[str, int], int] = {}
    occurrences = []
    for i, event in enumerate(timeline):
        occurrences.append(seen.get((event.kind, event.step), 0))
        seen[(event.kind, event.step)] = occurrences[-1] + 1
        if event.kind in KINDS and i + 1 < len(timeline) and reach[i][0] + 2 < batches:
            candidates[event.kind].append(i)

    every = sorted(i for kind in KINDS for i in candidates[kind])

    def apart(i: int, chosen: list[int]) -> bool:
        return all(j >= reach[i][1] if i < j else i >= reach[j][1] for j in chosen)

    def room(chosen: list[int]) -> int:
        """How many more moments fit beside `chosen` (the earliest that fits, again and again: the most)."""
        taken = list(chosen)
        for i in every:
            if apart(i, taken):
                taken.append(i)
        return len(taken) - len(chosen)

    if room([]) < count:
        raise ValueError(
            f"a run of {batches} training batches has room for {room([])} of {count} moments to stop at: make "
            "it longer (more batches or epochs)"
        )
    kinds = [k for k in KINDS if candidates[k] and k not in first]
    rng.shuffle(kinds)
    kinds = [*first, *kinds]
    chosen: list[int] = []
    for n in range(count):
        # This moment's kind, or the next one in turn that has a moment apart from those chosen which leaves
        # room for the moments still to choose (there is one: the earliest that fits).
        for kind in [*kinds[n % len(kinds) :], *kinds[: n % len(kinds)]]:
            free = [i for i in candidates[kind] if apart(i, chosen) and room([*chosen, i]) >= count - n - 1]
            if free:
                chosen.append(rng.choice(free))
                break
    moments = []
    for i in sorted(chosen):
        event, duration = timeline[i], timeline[i + 1].time - timeline[i].time
        delay = rng.uniform(0, max(duration, 0.0))
        moments.append(Moment(event.kind, event.step, occurrences[i], delay, rng.randrange(ranks)))
    return moments


def start(args: Sequence[object], cwd: Path) -> subprocess.Popen:
    """`python -m project <args>` in a process group of its own (its ranks and loader workers with it)."""
    cmd = [sys.executable, str(ROOT / "tests" / "patched_main.py"), *map(str, args)]
    return subprocess.Popen(
        cmd, cwd=cwd, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def end_all(proc: subprocess.Popen) -> None:
    """Kill the run started as `proc` and every process it started (a test that failed leaves none behind)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def process_of_rank(proc: subprocess.Popen, rank: int) -> int:
    """The process id of global rank `rank` of a run started as `proc` (Lightning starts the other ranks as
    children of rank 0)."""
    if rank == 0:
        return proc.pid
    import psutil

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if child.environ().get("LOCAL_RANK") == str(rank):
                    return child.pid
            except psutil.Error:
                continue
        time.sleep(0.05)
    raise TimeoutError(f"no process of rank {rank}")


def wait_for_moment(proc: subprocess.Popen, progress: Path, moment: Moment, timeout: float = 300) -> bool:
    """Wait until `moment`'s event has begun in the running process (True), or the run ends first (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in read_events(progress) if e.kind == moment.kind and e.step == moment.step]
        if len(found) > moment.occurrence:
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.0005)
    raise TimeoutError(f"the run did not reach {moment}")


@dataclass
class Segment:
    moment: Moment
    signalled: bool
    returncode: int
    stderr: str

    @property
    def stopped(self) -> bool:
        return self.returncode == 128 + signal.SIGTERM


def run_with_stops(
    args: list[str], progress: Path, moments: list[Moment], cwd: Path, timeout: float = 600
) -> list[Segment]:
    """Run `args` (a fit with `Progress` writing to `progress`), stopped from outside at each of `moments` in
    turn and continued with `--ckpt_path last` after each stop, to its end. Returns what each stop did."""
    segments: list[Segment] = []
    progress.parent.mkdir(parents=True, exist_ok=True)
    moment_file = progress.with_name(f"{progress.name}.moment")
    sent = progress.with_name(f"{progress.name}.sent")
    for i, moment in enumerate([*moments, None]):
        for old in progress.parent.glob(f"{progress.name}.rank*"):
            old.unlink()  # each process counts its own events
        sent.unlink(missing_ok=True)
        if moment is None:
            moment_file.unlink(missing_ok=True)
        else:  # where the run waits for the signal (Progress)
            moment_file.write_text(f"{moment.kind} {moment.step} {moment.occurrence}\n")
        proc = start([*args, *(["--ckpt_path", "last"] if i else [])], cwd)
        signalled = False
        try:
            try:
                if moment is not None and wait_for_moment(
                    proc, progress.with_name(f"{progress.name}.rank0"), moment
                ):
                    pid = process_of_rank(proc, moment.rank)
                    time.sleep(moment.delay)
                    if proc.poll() is None:
                        os.kill(pid, signal.SIGTERM)
                        signalled = True
            finally:
                sent.touch()  # the run goes on
            _, err = proc.communicate(timeout=timeout)
        except BaseException:
            end_all(proc)
            raise
        if moment is None:
            assert proc.returncode == 0, f"the last segment failed:\n{err[-4000:]}"
            break
        segments.append(Segment(moment, signalled, proc.returncode, err))
        assert proc.returncode in (0, 128 + signal.SIGTERM), (
            f"{moment}: exit {proc.returncode}\n{err[-4000:]}"
        )
        if proc.returncode == 0:  # the signal stopped nothing: the run is complete
            break
    return segments


def check_stops(segments: list[Segment]) -> None:
    """Every stopped segment said so in one line (one per process), without a traceback."""
    for segment in segments:
        if segment.returncode == 0:
            continue
        # The processes of a DDP run share stderr; unbuffered (PYTHONUNBUFFERED), print writes a line's text
        # and its newline apart, so another process's output can follow a line before its newline.
        errors = segment.stderr.count("error:")
        assert "Traceback" not in segment.stderr and errors and segment.stderr.count(STOPPED) == errors, (
            f"{segment.moment}:\n{segment.stderr[-4000:]}"
        )


def tensors(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, leaf) for every leaf of a nested checkpoint entry."""
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from tensors(value[key], f"{prefix}{key}.")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from tensors(item, f"{prefix}{i}.")
    else:
        yield prefix.rstrip("."), value


#: The entries of a checkpoint that say where training is: the weights, the optimizer and schedule, every
#: callback's state (EMA's average, Lookahead's slow weights, the random generators), the step and epoch.
COMPARED = ("state_dict", "optimizer_states", "lr_schedulers", "callbacks", "global_step", "epoch")
#: Leaves of the callbacks' states that record paths and times, not training.
UNCOMPARED = ("best_model_path", "last_model_path", "kth_best_model_path", "dirpath", "best_k_models", "time")


def differences(stopped: dict[str, Any], whole: dict[str, Any]) -> list[str]:
    """What differs between two checkpoints' training states (see COMPARED), with the largest gap."""
    found = []
    for key in COMPARED:
        a, b = dict(tensors(stopped.get(key))), dict(tensors(whole.get(key)))
        for path in sorted(set(a) | set(b)):
            if any(part in path for part in UNCOMPARED):
                continue
            x, y = a.get(path), b.get(path)
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
                if x.shape != y.shape or not torch.equal(x, y):
                    gap = (x.double() - y.double()).abs().max().item() if x.shape == y.shape else "shape"
                    found.append(f"{key}.{path} (max |diff| {gap})")
            elif x != y:
                found.append(f"{key}.{path}: {x!r} after stops, {y!r} uninterrupted")
    return found


def last_checkpoint(root: Path) -> dict[str, Any]:
    (last,) = root.glob("runs/version_*/checkpoints/last.ckpt")
    return torch.load(last, weights_only=True)


# -- the shipped configs, shrunk -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TinyData:
    """Tiny datasets for every shipped config: class folders (3 x 12 images), their labels and tags as CSVs,
    fake CIFAR-10 and CIFAR-100 (100 training images each), the folders prepared for streaming, and a timm
    weights file."""

    root: Path

    @property
    def images(self) -> Path:
        return self.root / "images"

    @property
    def cifar(self) -> Path:
        return self.root / "cifar"

    @property
    def labels(self) -> Path:
        return self.root / "labels.csv"

    @property
    def tags(self) -> Path:
        return self.root / "tags.csv"

    @property
    def prepared(self) -> Path:
        return self.root / "prepared"

    @property
    def weights(self) -> Path:
        return self.root / "timm.pth"


#: timm's own test network (a small ResNet with BatchNorm), standing in for photos_finetune's resnet18.
TINY_TIMM = "test_resnet.r160_in1k"


def make_tiny_data(root: Path) -> TinyData:
    """Write every dataset of `TinyData` under `root` that the configs present need."""
    from tests.fakes import make_fake_cifar, make_image_folder, patch_cifar_integrity

    data = TinyData(root)
    make_image_folder(data.images, classes=3, per_class=12, extras=False)
    files = sorted(p for p in data.images.rglob("*") if p.is_file())
    rows = [f"{p.relative_to(data.images)},{p.parent.name}" for p in files]
    data.labels.write_text("path,label\n" + "\n".join(rows) + "\n")
    tags = [
        f"{p.relative_to(data.images)},{p.parent.name}{' odd' if i % 2 else ''}" for i, p in enumerate(files)
    ]
    data.tags.write_text("path,tags\n" + "\n".join(tags) + "\n")
    patch_cifar_integrity()
    make_fake_cifar(data.cifar, per_batch=20, n_test=20)
    make_fake_cifar(data.cifar, name="cifar100", per_batch=20, n_test=20)
    configs = shipped_configs()
    # part: pretrained
    if "experiment/photos_finetune.yaml" in configs:
        import timm

        torch.manual_seed(1)
        torch.save(timm.create_model(TINY_TIMM, pretrained=False).state_dict(), data.weights)
    # /part: pretrained
    # part: streaming
    if "streaming.yaml" in configs:
        from project.cli import main

        main(["prepare", "--config", str(CONFIGS / "folder.yaml"), "--data.root", str(data.images),
              "--data.cache_dir", str(root / "cache"), "--data.val_fraction", "0.25", "--output_dir",
              str(data.prepared), "--size", "16", "--num_workers", "1"])  # fmt: skip
    # /part: streaming
    return data


#: What every shrunk run shares: 3 epochs, no logger or progress bar (they change no weight).
COMMON = ("--trainer.max_epochs", "3", "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
          "--trainer.enable_model_summary", "false")  # fmt: skip
#: A SimpleCNN of a few thousand weights in place of the config's network.
TINY_CNN = ("--model.net", "SimpleCNN", "--model.net.init_args.width", "4",
            "--model.net.init_args.hidden", "16")  # fmt: skip
CONFIGS = ROOT / "configs"


def _images(data: TinyData, config: str, *source: object) -> list[object]:
    """A config of image files on the tiny images, at 16 px in batches of 4, cached in the data's folder."""
    return ["--config", CONFIGS / config, *source, "--data.image_size", "16", "--data.batch_size", "4",
            "--data.cache_dir", data.root / "cache"]  # fmt: skip


def _folder(data: TinyData, *presets: str) -> list[object]:
    """configs/folder.yaml and the presets stacked on it, as users stack them; the tiny sizes after the presets
    (which set their own batch and image sizes: 128 of 27 training images is one step an epoch)."""
    stacked = [a for preset in presets for a in ("--config", CONFIGS / preset)]
    flag, folder, *shrunk = _images(data, "folder.yaml", "--data.root", data.images)
    return [flag, folder, *stacked, *shrunk]


def _cifar(data: TinyData, config: str) -> list[object]:
    return ["--config", CONFIGS / config, "--data.data_dir", data.cifar, "--data.download", "false",
            "--data.val_size", "20", "--data.batch_size", "10"]  # fmt: skip


#: Each shipped config (or preset, stacked as users stack it) -> its shrunk flags: tiny data and network, the
#: rest (scheduler, precision, augmentation, EMA, loader workers) as shipped.
# fmt: off
SHIPPED: dict[str, Any] = {
    "cifar10.yaml": lambda d: [*_cifar(d, "cifar10.yaml"), *TINY_CNN],
    "cifar100.yaml": lambda d: [*_cifar(d, "cifar100.yaml"), *TINY_CNN],
    # part: csv
    "csv.yaml": lambda d: [
        *_images(d, "csv.yaml", "--data.csv", d.labels, "--data.images", d.images), *TINY_CNN,
    ],
    # part: tags
    "csv_multilabel.yaml": lambda d: [
        *_images(d, "csv_multilabel.yaml", "--data.csv", d.tags, "--data.images", d.images), *TINY_CNN,
    ],
    # /part: tags
    # /part: csv
    "folder.yaml": lambda d: [*_folder(d), *TINY_CNN],
    "sample.yaml": lambda d: [*_images(d, "sample.yaml", "--data.root", d.images), *TINY_CNN[2:]],
    # part: streaming
    "streaming.yaml": lambda d: [
        "--config", CONFIGS / "streaming.yaml", "--data.input_dir", d.prepared, "--data.image_size", "16",
        "--data.batch_size", "4", *TINY_CNN,
    ],
    # /part: streaming
    "experiment/cifar10_speedrun.yaml": lambda d: [
        *_cifar(d, "experiment/cifar10_speedrun.yaml"), "--model.net.init_args.widths", "[8, 16, 16]",
    ],
    "experiment/folder_simplecnn.yaml": lambda d: [
        *_folder(d, "experiment/folder_simplecnn.yaml"), *TINY_CNN[2:],
    ],
    "experiment/photos.yaml": lambda d: [
        *_folder(d, "experiment/photos.yaml"), *TINY_CNN,
    ],
    # part: pretrained
    "experiment/photos_finetune.yaml": lambda d: [
        *_folder(d, "experiment/photos_finetune.yaml"), "--model.net.init_args.name", TINY_TIMM,
        "--model.net.init_args.weights_file", d.weights,
    ],
    # /part: pretrained
    "callbacks/ema.yaml": lambda d: [*_folder(d, "callbacks/ema.yaml"), *TINY_CNN],
}
# fmt: on
DDP = ("--config", CONFIGS / "trainer" / "ddp_cpu.yaml")


def fit_command(config: str, data: TinyData, root: Path, ddp: bool = False) -> list[str]:
    """`fit` of the shipped `config`, shrunk, into `root`, with `Progress` writing to `root/progress`."""
    args = ["fit", *SHIPPED[config](data), *(DDP if ddp else ()), *COMMON, "--trainer.default_root_dir", root,
            "--trainer.callbacks+=tests.resume_moments.Progress", "--trainer.callbacks.path", root / "progress"]  # fmt: skip
    return [str(a) for a in args]


def whole_run(config: str, data: TinyData, root: Path, ddp: bool = False) -> list[Event]:
    """Run `config` (shrunk) uninterrupted into `root`; its rank-0 timeline."""
    run_with_stops(fit_command(config, data, root, ddp), root / "progress", [], root.parent)
    return read_events(root / "progress.rank0")


def stopped_run(
    config: str, data: TinyData, root: Path, moments: list[Moment], whole: Path, ddp: bool = False
) -> tuple[list[Segment], list[str]]:
    """Run `config` (shrunk) into `root`, stopped at each of `moments` and resumed; (the stops, what differs
    between its end and that of the uninterrupted run in `whole`)."""
    segments = run_with_stops(fit_command(config, data, root, ddp), root / "progress", moments, root.parent)
    return segments, differences(last_checkpoint(root), last_checkpoint(whole))


def shipped_configs() -> list[str]:
    """The configs of `SHIPPED` this copy of the template has (a part left out takes its configs with it)."""
    return [c for c in SHIPPED if (CONFIGS / c).is_file()]
