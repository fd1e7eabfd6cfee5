"""Pins every behaviour of Lightning's private API the template relies on (`project.lightning_private`).

A Lightning upgrade that renames or changes one of them fails here, naming it, instead of somewhere deep in a
run. Each test uses the real Lightning objects on a tiny model, in-process.
"""

import csv
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from project import lightning_private as private


class Tiny(L.LightningModule):
    def __init__(self, batch_size: int = 4) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.batch_size = batch_size

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.layer(batch[0]).pow(2).mean())

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(16, 2)), batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(tmp_path: Path, callbacks: list, **kwargs) -> L.Trainer:
    options = {"max_epochs": 1, "logger": False, "enable_progress_bar": False, "enable_model_summary": False}
    return L.Trainer(default_root_dir=tmp_path, callbacks=callbacks, **{**options, **kwargs})


class Probe(Callback):
    """Records what the private checkpoint helpers answer at the end of each training batch."""

    def __init__(self, checkpoint: ModelCheckpoint) -> None:
        self.checkpoint, self.answers = checkpoint, []

    def on_train_batch_end(self, trainer, pl_module, *args):
        self.answers.append(
            (
                trainer.global_step,
                private.skips_saving(self.checkpoint, trainer),
                private.saves_on_train_epoch_end(self.checkpoint, trainer),
            )
        )
        if trainer.global_step == 2 and not trainer.fast_dev_run:
            private.save_last(self.checkpoint, trainer)  # writes last.ckpt at step 2, marks step 2 saved
            assert private.last_saved_step(self.checkpoint) == 2
            assert private.skips_saving(self.checkpoint, trainer)  # already saved at this step
            private.set_last_saved_step(self.checkpoint, 0)
            assert not private.skips_saving(self.checkpoint, trainer)


def test_model_checkpoint_helpers(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts", save_last=True, save_top_k=0)
    probe = Probe(checkpoint)
    trainer(tmp_path, [checkpoint, probe]).fit(Tiny())
    # While fitting, after a new step, a save is allowed; validation runs at the end of every epoch, before the
    # training epoch's end, so ModelCheckpoint saves at the training epoch's end.
    assert [a[1:] for a in probe.answers if a[0] != 2] == [(False, True)] * 3

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "mid", save_last=True, save_top_k=0)
    probe = Probe(checkpoint)
    trainer(tmp_path, [checkpoint, probe], val_check_interval=2).fit(Tiny())
    assert probe.answers[0][2] is False  # validation within the epoch: saved after each validation

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "fast", save_last=True)
    probe = Probe(checkpoint)
    trainer(tmp_path, [checkpoint, probe], fast_dev_run=2).fit(Tiny())
    assert probe.answers[0][1] is True  # fast_dev_run never saves


def test_save_last_names_last_ckpt_and_writes_the_current_state(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "c", save_last=True, save_top_k=0)

    class SaveAtStepOne(Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            if trainer.global_step == 1:
                private.save_last(checkpoint, trainer)
                raise KeyboardInterrupt

    with pytest.raises(SystemExit):  # Lightning turns KeyboardInterrupt into exit 1
        trainer(tmp_path, [checkpoint, SaveAtStepOne()]).fit(Tiny())
    assert checkpoint.last_model_path == str(tmp_path / "c" / "last.ckpt")
    assert torch.load(checkpoint.last_model_path, weights_only=True)["global_step"] == 1


def test_end_fit_cleanly_stops_before_training_without_on_train_end(tmp_path):
    events = []

    class TuneThenStop(Callback):
        def on_fit_start(self, trainer, pl_module):
            private.end_fit_cleanly()

        def on_train_end(self, trainer, pl_module):
            events.append("on_train_end")

    t = trainer(tmp_path, [TuneThenStop()])
    t.fit(Tiny())  # returns normally
    assert t.global_step == 0 and t.state.finished and events == []


def test_reload_dataloaders_picks_up_a_new_batch_size(tmp_path):
    sizes = []

    class Grow(Callback):
        def on_train_start(self, trainer, pl_module):
            pl_module.batch_size = 8
            private.reload_dataloaders(trainer)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            sizes.append(len(batch[0]))

    trainer(tmp_path, [Grow()]).fit(Tiny(batch_size=4))
    assert sizes == [8, 8]


def test_restore_csv_rows_writes_them_back_and_appends_after_them(tmp_path):
    logger = CSVLogger(tmp_path, name="run", version=0)
    private.restore_csv_rows(logger, ["step", "a"], [{"step": "0", "a": "1.0"}, {"step": "1", "a": "2.0"}])
    logger.log_metrics({"a": 3.0}, step=2)
    logger.save()
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["step"], r["a"]) for r in rows] == [("0", "1.0"), ("1", "2.0"), ("2", "3.0")]


def test_set_data_parallel_size_sizes_the_device_mesh(monkeypatch):
    import lightning.pytorch.strategies.model_parallel as model_parallel
    from lightning.pytorch.strategies import ParallelStrategy

    from project.distributed import FSDP2Strategy

    seen = {}
    monkeypatch.setattr(ParallelStrategy, "setup_environment", lambda self: None)
    monkeypatch.setattr(model_parallel.ModelParallelStrategy, "_setup_distributed", lambda self: None)
    monkeypatch.setattr(model_parallel.ModelParallelStrategy, "world_size", property(lambda self: 8))
    monkeypatch.setattr(model_parallel.ModelParallelStrategy, "root_device", property(lambda self: "cpu"))
    monkeypatch.setattr(
        model_parallel,
        "_setup_device_mesh",
        lambda dp, tp, world, device: seen.update(dp=dp, tp=tp) or "mesh",
    )
    strategy = FSDP2Strategy()
    strategy._lightning_module = Tiny()
    strategy.num_nodes, strategy.parallel_devices = 2, [torch.device("cpu")] * 4
    strategy.setup_environment()
    assert seen == {"dp": 8, "tp": 1}  # every process in one data-parallel group


class Saved(L.LightningModule):
    def __init__(self, width: int = 1) -> None:
        super().__init__()
        self.save_hyperparameters()


def test_lightningcli_instantiators_read_the_config_dump_given(monkeypatch):
    """`give_config_dump`: a class LightningCLI's instantiators build records the hyperparameters of the dump
    given (with its class path, for `load_from_checkpoint`), and LightningCLI dumps the config no more itself."""
    from lightning.pytorch.cli import LightningCLI

    dumps = []

    class GivenDump(LightningCLI):
        def before_instantiate_classes(self) -> None:
            given = {"model": {"class_path": f"{__name__}.Saved", "init_args": {"width": 7}}}
            private.give_config_dump(self, given)
            monkeypatch.setattr(type(self.parser), "dump", lambda *a, **k: dumps.append(a) or "")

    cli = GivenDump(
        Saved, args=["--model.width", "3"], run=False, save_config_callback=None, subclass_mode_model=True
    )
    assert cli.model.hparams["width"] == 7  # the dump's value, not the config's: the dump given was read
    assert cli.model.hparams["_class_path"] == f"{__name__}.Saved" and "_instantiator" in cli.model.hparams
    assert dumps == []


class EndsEpoch(Callback):
    def __init__(self) -> None:
        self.answers: list[bool] = []

    def on_train_batch_end(self, trainer, pl_module, *args):
        self.answers.append(private.ends_epoch(trainer))


class Stream(torch.utils.data.IterableDataset):
    """10 samples and no length: the loop learns which batch is the last only by fetching ahead."""

    def __iter__(self):
        return iter(torch.randn(10, 2).unbind())


class TinyStream(Tiny):
    def train_dataloader(self):
        return DataLoader(Stream(), batch_size=4)


def test_ends_epoch_is_true_after_the_last_batch_only(tmp_path):
    probe = EndsEpoch()
    trainer(tmp_path, [probe], max_epochs=2).fit(Tiny())  # 16 samples, batches of 4
    assert probe.answers == [False, False, False, True] * 2
    probe = EndsEpoch()
    trainer(tmp_path, [probe], limit_val_batches=0).fit(TinyStream())
    assert probe.answers == [False, False, True]


def test_stop_after_this_batch_stops_after_the_batchs_callbacks_through_the_sigterm_path(tmp_path):
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    seen = []

    class StopAtStep2(Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            seen.append(trainer.global_step)
            if trainer.global_step == 2:
                private.stop_after_this_batch(trainer)

    t = trainer(tmp_path, [StopAtStep2()], max_epochs=2)
    with pytest.raises(SIGTERMException):  # what the CLI turns into "stopped by ...; resume with ..."
        t.fit(Tiny())
    assert seen == [1, 2] and t.global_step == 2 and t.received_sigterm


def test_route_sigterm_has_lightnings_handler_call_the_given_one_in_place_of_its_notifier(tmp_path):
    import os
    import signal

    got, lightning_flag = [], []

    class SignalledInTheSanityCheck(Callback):
        def setup(self, trainer, pl_module, stage):
            private.route_sigterm(trainer, lambda signum, frame: got.append(signum))

        def on_sanity_check_start(self, trainer, pl_module):
            os.kill(
                os.getpid(), signal.SIGTERM
            )  # Lightning's handler is in place from before the sanity check
            lightning_flag.append(trainer.received_sigterm)

    before = signal.getsignal(signal.SIGTERM)
    t = trainer(tmp_path, [SignalledInTheSanityCheck()], max_epochs=1)
    t.fit(
        Tiny()
    )  # Lightning's notifier would have set its flag and stopped the sanity check: SIGTERMException
    assert got == [signal.SIGTERM] and lightning_flag == [False] and t.global_step == 4
    assert signal.getsignal(signal.SIGTERM) == before  # Lightning put back the handler it found


class PositionLoader:
    """Four batches with a resumable position: `state_dict` counts the batches handed out this epoch."""

    def __init__(self) -> None:
        self.batches = [(torch.full((4, 2), float(i)),) for i in range(4)]
        self.start = self.handed_out = 0

    def __iter__(self):
        self.handed_out, start, self.start = self.start, self.start, 0
        for batch in self.batches[start:]:
            self.handed_out += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"consumed": self.handed_out}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = state["consumed"]

    def __len__(self) -> int:
        return len(self.batches)


class OneCycleLike(Tiny):
    """Reads `estimated_stepping_batches` in configure_optimizers, as a OneCycle schedule's length does: Lightning
    creates the training loader there, before a checkpoint's loop state is read."""

    def __init__(self, loader: PositionLoader, reads_length: bool = True) -> None:
        super().__init__()
        self.loader, self.reads_length = loader, reads_length

    def train_dataloader(self):
        return self.loader

    def configure_optimizers(self):
        if self.reads_length:
            self.total_steps = self.trainer.estimated_stepping_batches
        return super().configure_optimizers()


class BatchesSeen(Callback):
    def __init__(self, hand_over: bool) -> None:
        self.hand_over, self.seen, self.handed = hand_over, [], None

    def on_train_start(self, trainer, pl_module):
        if self.hand_over:
            self.handed = private.load_pending_train_loader_state(trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append(int(batch[0][0, 0]))


def test_a_loader_created_before_the_checkpoint_is_read_gets_its_position_handed_over(tmp_path):
    every_2 = ModelCheckpoint(tmp_path, "mid", every_n_train_steps=2, save_top_k=1)
    trainer(tmp_path, [every_2], max_steps=3, limit_val_batches=0).fit(OneCycleLike(PositionLoader()))
    # mid.ckpt: saved after two of the epoch's four batches, as a periodic or a SIGTERM checkpoint is
    seen = {}
    for hand_over in (False, True):
        probe = BatchesSeen(hand_over)
        trainer(tmp_path, [probe], limit_val_batches=0).fit(
            OneCycleLike(PositionLoader()), ckpt_path=tmp_path / "mid.ckpt"
        )
        seen[hand_over] = probe.seen
        assert probe.handed in (None, True)
    assert seen[False] == [0, 1]  # Lightning alone: the epoch from its start again
    assert seen[True] == [2, 3]  # handed over: the batches after the checkpoint's
    # A loader created after the checkpoint is read has its state already: nothing is left to hand over.
    probe = BatchesSeen(hand_over=True)
    unread = OneCycleLike(PositionLoader(), reads_length=False)
    trainer(tmp_path, [probe], limit_val_batches=0).fit(unread, ckpt_path=tmp_path / "mid.ckpt")
    assert probe.handed is False and probe.seen == [2, 3]
