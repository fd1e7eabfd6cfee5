"""Scale-out on CPUs: DDP and FSDP2 on 2 gloo processes, torchrun with 2 node ranks, the SLURM script.

The 2-process runs train a BatchNorm-free SimpleCNN on a train split of exactly one global batch, so a
1-process run of the same steps must reach the same weights (see tests/tiny_runs.py). GPU-only presets
(ddp, fsdp, fsdp2) are parsed and their strategies built here; they run in the `gpu`-marked tests.
"""

import csv
import inspect
import json
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
import yaml
from jsonargparse import ArgumentParser
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, Strategy
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch import nn
from torch.distributed.fsdp import CPUOffload, FSDPModule, FullyShardedDataParallel
from torch.distributed.tensor import DTensor
from torchmetrics.functional.classification import multiclass_accuracy
from torchvision.models.resnet import BasicBlock, Bottleneck

from project.cli import build, run_command
from project.data import CIFARDataModule
from project.distributed import sharding_units
from project.distributed.sharding import shard_network
from project.models import CIFARResNet, SimpleCNN
from project.tasks import ImageClassifier
from tests import docs_pages
from tests.conftest import CONFIGS, PACKAGE, ROOT, newest_run, run_cli, subprocess_env
from tests.probes import PredictionProbe
from tests.tiny_runs import TRAIN_SIZE, VAL_SIZE, csv_logger_config, fit_args, tiny_cifar

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def cifar(tmp_path_factory) -> Path:
    return tiny_cifar(tmp_path_factory.mktemp("tiny_cifar"))


def net_state(ckpt: Path) -> dict[str, torch.Tensor]:
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    return {k.removeprefix("net."): v for k, v in state.items() if k.startswith("net.")}


def last_val_row(run_dir: Path) -> dict[str, str]:
    with open(run_dir / "metrics.csv") as f:
        return [row for row in csv.DictReader(f) if row.get("val/acc")][-1]


def whole_val_set(cifar: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The validation split the runs use, normalised as in validation."""
    dm = CIFARDataModule(data_dir=str(cifar), download=False, val_size=VAL_SIZE)
    dm.setup("fit")
    x, y = zip(*(dm.val_set[i] for i in range(len(dm.val_set))), strict=True)
    return dm.transform_batch((torch.stack(x), torch.tensor(y)), train=False)


# -- DDP ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ddp_on_two_processes_matches_one_process(cifar, tmp_path):
    common = ["--data.global_batch_size", TRAIN_SIZE, "--trainer.max_epochs", "3"]
    logger = csv_logger_config(tmp_path / "csv.yaml", tmp_path / "ddp")
    out = run_cli(
        *fit_args(cifar, tmp_path / "ddp", *common),
        "--config", CONFIGS / "trainer" / "ddp_cpu.yaml", "--config", logger,
        cwd=tmp_path,
    )  # fmt: skip
    assert "Effective batch size: 32 samples per optimizer step = 16 per device x 2 device(s)" in out.stderr
    run_dir = tmp_path / "ddp" / "runs" / "version_0"
    two = net_state(run_dir / "checkpoints" / "last.ckpt")

    # The same 3 steps on one process, each on the whole 32-image split, from the same seed.
    one_proc = [
        *common,
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "1",
        "--trainer.precision",
        "32-true",
    ]
    off = ["--trainer.logger", "false", "--trainer.enable_checkpointing", "false"]
    cli = build(fit_args(cifar, tmp_path / "one", *one_proc, *off)[1:])
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 3 and cli.datamodule.batch_size == TRAIN_SIZE
    one = {k: v.detach() for k, v in cli.model.net.state_dict().items()}
    assert one.keys() == two.keys()
    start = SimpleCNN().state_dict()  # the weights moved: the comparison is not of two untrained nets
    assert not torch.allclose(one["classifier.4.weight"], start["classifier.4.weight"])
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-6, msg=name)

    # Logged val/acc and val/loss are over the whole validation set (68 images), not rank 0's 34.
    model = SimpleCNN()
    model.load_state_dict(two)
    x, y = whole_val_set(cifar)
    with torch.no_grad():
        logits = model.eval()(x)
    row = last_val_row(run_dir)
    accuracy = multiclass_accuracy(logits, y, num_classes=10, average="micro").item()  # as ImageClassifier's
    assert float(row["val/acc"]) == pytest.approx(accuracy, abs=1e-6)
    loss = F.cross_entropy(logits, y, label_smoothing=0.1).item()  # cifar10.yaml's label smoothing
    assert float(row["val/loss"]) == pytest.approx(loss, rel=1e-5)
    half = F.cross_entropy(logits[::2], y[::2], label_smoothing=0.1).item()  # what rank 0 alone saw
    assert abs(half - loss) > 1e-4


# -- FSDP2 -------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_fsdp2_on_two_processes_trains_clips_and_checkpoints_for_one_process(cifar, tmp_path):
    grads, logits_path = tmp_path / "grads.json", tmp_path / "logits.pt"
    probes = tmp_path / "probes.yaml"
    probes.write_text(
        yaml.safe_dump(
            {
                "trainer": {
                    "callbacks": [
                        {"class_path": "tests.probes.GradientProbe", "init_args": {"path": str(grads)}},
                        {
                            "class_path": "tests.probes.PredictionProbe",
                            "init_args": {"path": str(logits_path)},
                        },
                    ]
                }
            }
        )
    )
    run_cli(
        *fit_args(cifar, tmp_path / "fsdp2", "--data.global_batch_size", TRAIN_SIZE, "--trainer.max_epochs", "2"),
        "--config", CONFIGS / "trainer" / "fsdp2_cpu.yaml", "--config", CONFIGS / "trainer" / "clip_norm.yaml",
        "--config", probes, "--trainer.logger", "false",
        cwd=tmp_path,
    )  # fmt: skip

    # Norm clipping over sharded (DTensor) gradients: the optimizer never saw a total norm above the limit,
    # and the limit was binding (the gradients before clipping were larger).
    recorded = json.loads(grads.read_text())
    assert len(recorded["seen"]) == len(recorded["before"]) == 2
    assert max(step["norm"] for step in recorded["seen"]) <= 1.0 + 1e-4  # float32 sums
    assert max(step["norm"] for step in recorded["before"]) > 1.0

    # The checkpoint is one file with the full (gathered) weights: it loads in one plain process and
    # predicts exactly what the sharded model predicted.
    ckpt = newest_run(tmp_path / "fsdp2") / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert {k: v.shape for k, v in state["state_dict"].items()} == {
        f"net.{k}": v.shape for k, v in SimpleCNN().state_dict().items()
    }
    assert state["global_step"] == 2 and len(state["optimizer_states"][0]["state"]) == 8
    model = ImageClassifier(SimpleCNN(), input_shape=None)
    model.load_state_dict(state["state_dict"])
    with torch.no_grad():
        single = model.eval()(PredictionProbe.batch())
    sharded = torch.load(logits_path, weights_only=True)
    torch.testing.assert_close(single, sharded, rtol=1e-5, atol=1e-6)
    assert torch.equal(single.argmax(1), sharded.argmax(1))


def test_sharding_units_are_the_residual_blocks():
    resnet = CIFARResNet(depth=18)
    units = sharding_units(resnet)
    assert len(units) == 8 and all(isinstance(u, BasicBlock) for u in units)
    simple = SimpleCNN()
    assert sharding_units(simple) == [simple.features, simple.classifier]

    class Custom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)

        def sharding_units(self) -> list[nn.Module]:
            return [self.b]

    custom = Custom()
    assert sharding_units(custom) == [custom.b]
    assert all(isinstance(u, Bottleneck) for u in sharding_units(__import__("torchvision").models.resnet50()))


def test_shard_network_shards_every_block_once(tmp_path):
    """fully_shard on a 1-process gloo group: every block and the root become FSDP2 modules, once."""
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1
    )
    try:
        mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (1,))
        net = CIFARResNet(depth=18)
        shard_network(net, mesh)
        assert isinstance(net, FSDPModule)
        assert all(isinstance(block, FSDPModule) for block in sharding_units(net))
        assert all(isinstance(p, DTensor) for p in net.parameters())
        shard_network(net, mesh)  # Lightning calls configure_model again for validate/test: a no-op
        out = net(torch.randn(2, 3, 32, 32))
        assert out.shape == (2, 10)
    finally:
        torch.distributed.destroy_process_group()


def test_weight_decay_groups_survive_fsdp_flattened_parameters():
    """FSDP (v1) shows the optimizer every parameter as a flat 1-D shard: groups must not go by shape."""
    model = ImageClassifier(
        CIFARResNet(depth=18), optimizer=lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=5e-4)
    )
    for p in model.parameters():  # what FSDP's sharded views look like
        p.data = p.data.flatten()
    decay, no_decay = model.configure_optimizers().param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert (
        "net.conv1.weight" in decayed
        and "net.layer1.0.conv1.weight" in decayed
        and "net.fc.weight" in decayed
    )
    assert not any(".bn" in n or n.endswith("bias") for n in decayed)
    assert {names[id(p)] for p in no_decay["params"]} >= {"net.bn1.weight", "net.bn1.bias", "net.fc.bias"}
    assert no_decay["weight_decay"] == 0.0


# -- GPU-only presets, parsed and built on the CPU ---------------------------------------------------------


def build_strategy(preset: str, **overrides: object) -> Strategy:
    config = yaml.safe_load((CONFIGS / "trainer" / preset).read_text())["trainer"]["strategy"]
    config["init_args"].update(overrides)
    parser = ArgumentParser()
    parser.add_argument("--strategy", type=Strategy)
    return parser.instantiate(parser.parse_object({"strategy": config})).strategy


def test_fsdp_preset_wraps_and_checkpoints_each_residual_block():
    strategy = build_strategy("fsdp.yaml")
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.kwargs["auto_wrap_policy"]._module_classes == {BasicBlock, Bottleneck}
    assert strategy._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {
        BasicBlock,
        Bottleneck,
    }
    assert strategy.sharding_strategy.name == "FULL_SHARD" and strategy._state_dict_type == "full"
    assert strategy.cpu_offload == CPUOffload(offload_params=False)
    assert build_strategy("fsdp.yaml", cpu_offload=True).cpu_offload == CPUOffload(offload_params=True)


def test_ddp_preset_passes_its_options_to_ddp():
    strategy = build_strategy("ddp.yaml")
    assert isinstance(strategy, DDPStrategy)
    kwargs = strategy._ddp_kwargs
    assert kwargs["find_unused_parameters"] is False and kwargs["gradient_as_bucket_view"] is True
    # Every other DDP argument stays at torch's own default.
    defaults = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    assert all(v == defaults[k].default for k, v in kwargs.items() if k != "gradient_as_bucket_view")


@pytest.mark.parametrize("preset", ["ddp.yaml", "fsdp.yaml", "fsdp2.yaml"])
def test_gpu_presets_parse_on_top_of_the_main_config(preset, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_command(
            [
                "fit",
                "--config",
                str(CONFIGS / "cifar10.yaml"),
                "--config",
                str(CONFIGS / "trainer" / preset),
                "--print_config",
            ]
        )
    assert exit_info.value.code in (0, None)
    trainer = yaml.safe_load(capsys.readouterr().out)["trainer"]
    assert trainer["accelerator"] == "gpu" and trainer["devices"] == -1
    assert trainer["strategy"]["class_path"].rsplit(".", 1)[1] in (
        "DDPStrategy",
        "FSDPStrategy",
        "FSDP2Strategy",
    )


# -- multi-node: torchrun and SLURM, the commands of docs/scaling.md ------------------------------------------


def readme_commands(prefix: str) -> list[str]:
    """The lines of the README and the docs pages that start with `prefix` (a trailing `&` taken off)."""
    return [line for line in docs_pages.lines() if line.startswith(prefix)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def project_args(command: str) -> list[str]:
    """The arguments after `-m project` in a torchrun or srun command line."""
    args = shlex.split(command)
    return args[args.index(PACKAGE) + 1 :]


def test_readme_torchrun_commands_parse(capsys, monkeypatch):
    commands = readme_commands("torchrun ")
    assert len(commands) >= 4, "docs/scaling.md lists the torchrun recipes"
    monkeypatch.chdir(ROOT)
    for command in commands:
        args = shlex.split(command)
        nnodes, nproc = args[args.index("--nnodes") + 1], args[args.index("--nproc_per_node") + 1]
        with pytest.raises(SystemExit) as exit_info:
            run_command([*project_args(command), "--print_config"])
        assert exit_info.value.code in (0, None), command
        trainer = yaml.safe_load(capsys.readouterr().out)["trainer"]
        # torchrun's world and Lightning's must agree, or Lightning stops at start.
        assert (str(trainer["num_nodes"]), str(trainer["devices"])) == (nnodes, nproc), command


@pytest.mark.slow
def test_torchrun_two_node_ranks_on_one_machine(cifar, tmp_path):
    """The docs' CPU torchrun pair, run for real: 2 node ranks rendezvous on 127.0.0.1 and train with gloo."""
    pair = [c for c in readme_commands("torchrun ") if "127.0.0.1" in c]
    assert len(pair) == 2
    port, torchrun = free_port(), Path(sys.executable).parent / "torchrun"
    env = subprocess_env()
    procs = []
    for i, command in enumerate(pair):
        args = shlex.split(command)
        args[0] = str(torchrun)
        args[args.index("--master_port") + 1] = str(port)
        # tests/patched_main.py is `python -m project` plus the checksum patch the fake CIFAR needs.
        m = args.index("-m")
        args[m : m + 2] = [str(ROOT / "tests" / "patched_main.py")]
        args += ["--data.data_dir", str(cifar), "--data.download", "false", "--data.val_size", str(VAL_SIZE)]
        args += ["--data.global_batch_size", "16", "--trainer.default_root_dir", str(tmp_path / "logs")]
        args += ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
        out = open(tmp_path / f"node{i}.log", "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT), out))
    for proc, out in procs:
        try:
            proc.wait(timeout=600)
        finally:
            if proc.returncode is None:
                proc.kill()
            out.close()
    logs = [(tmp_path / f"node{i}.log").read_text() for i in range(2)]
    assert [p.returncode for p, _ in procs] == [0, 0], "\n\n".join(log[-3000:] for log in logs)
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in logs[1]
    # Rank 0 alone reports, and its report shows a world of 2 nodes.
    assert (
        "Effective batch size: 16 samples per optimizer step = 8 per device x 1 device(s) x 2 node(s)"
        in logs[0]
    )
    assert "Effective batch size" not in logs[1]
    assert (newest_run(tmp_path / "logs") / "checkpoints" / "last.ckpt").is_file()


# -- on a GPU ------------------------------------------------------------------------------------------------


def probe_config(path: Path, grads: Path) -> Path:
    callback = {"class_path": "tests.probes.GradientProbe", "init_args": {"path": str(grads)}}
    path.write_text(yaml.safe_dump({"trainer": {"callbacks": [callback]}}))
    return path


@pytest.mark.slow
@pytest.mark.gpu
@cuda
def test_fsdp_on_one_gpu_with_cpu_offload_trains_clips_by_norm_and_saves_a_full_checkpoint(cifar, tmp_path):
    grads = tmp_path / "grads.json"
    run_cli(
        *fit_args(cifar, tmp_path / "fsdp", "--data.global_batch_size", TRAIN_SIZE, "--trainer.max_epochs", "3",
                  net="CIFARResNet"),
        "--config", CONFIGS / "trainer" / "fsdp.yaml", "--config", CONFIGS / "trainer" / "clip_norm.yaml",
        "--trainer.devices", "1", "--trainer.strategy.init_args.cpu_offload", "true",
        "--config", probe_config(tmp_path / "probe.yaml", grads), "--trainer.logger", "false",
        cwd=tmp_path,
    )  # fmt: skip
    recorded = json.loads(grads.read_text())
    assert recorded["seen"], "no optimizer step ran (every fp16 step overflowed?)"
    assert max(step["norm"] for step in recorded["seen"]) <= 1.0 + 1e-4
    state = torch.load(
        newest_run(tmp_path / "fsdp") / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True
    )
    assert {k: v.shape for k, v in state["state_dict"].items()} == {
        f"net.{k}": v.shape for k, v in CIFARResNet().state_dict().items()
    }
    assert "MixedPrecision" in state or "FSDPPrecision" in state  # 16-mixed: the scaler's state


@pytest.mark.slow
@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("preset", ["ddp.yaml", "fsdp2.yaml"])
def test_gpu_presets_train_on_one_gpu(preset, cifar, tmp_path):
    run_cli(
        *fit_args(cifar, tmp_path / "run", "--trainer.max_epochs", "2", net="CIFARResNet"),
        "--config", CONFIGS / "trainer" / preset, "--trainer.devices", "1", "--trainer.logger", "false",
        cwd=tmp_path,
    )  # fmt: skip
    state = torch.load(
        newest_run(tmp_path / "run") / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True
    )
    assert state["global_step"] == 2 and "net.fc.weight" in state["state_dict"]


def test_norm_clipping_under_fsdp_goes_through_fsdps_own_clip_grad_norm(monkeypatch):
    """Lightning's FSDP precision plugin raises on norm clipping; ImageClassifier asks FSDP's root module,
    which reduces the norm over all shards. Value clipping and other strategies keep Lightning's path."""
    calls: list[tuple] = []

    class RootFSDP(FullyShardedDataParallel):  # stands in for the wrapped root module (no process group)
        def __init__(self) -> None:
            pass

        def clip_grad_norm_(self, max_norm: float) -> None:
            calls.append(("fsdp", max_norm))

    model = ImageClassifier(SimpleCNN(), input_shape=None)
    monkeypatch.setattr(
        model, "clip_gradients", lambda opt, val, algo: calls.append(("lightning", val, algo))
    )
    model._trainer = SimpleNamespace(model=RootFSDP())
    model.configure_gradient_clipping(None, 1.0, GradClipAlgorithmType.NORM)
    model.configure_gradient_clipping(None, 0.5, GradClipAlgorithmType.VALUE)
    model._trainer = SimpleNamespace(model=model)  # DDP, FSDP2, one device: Lightning's own clipping
    model.configure_gradient_clipping(None, 1.0, GradClipAlgorithmType.NORM)
    assert calls == [("fsdp", 1.0), ("lightning", 0.5, "value"), ("lightning", 1.0, "norm")]
