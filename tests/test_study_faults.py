"""Studies fail in one line and keep secrets out of their logs: storage URLs, Ctrl-C, unwritable folders,
searches that could never work, and the staging folders of outputs written whole.

Each case is what a user would type; the checks are that the message is one `error:` line naming what is at
fault (the database by its host, never its password), and that nothing is left behind.
"""

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from project.atomic_files import Terminated, staged_outputs
from project.callbacks import interrupts
from project.callbacks.run_info import collect_run_info
from project.cli import main
from project.errors import UserError
from project.redaction import redact_command
from project.studies.runner import claim_folder
from project.studies.storage import check_url, lost, open_storage
from project.studies.tune import _optuna_says_one_line
from tests.conftest import PACKAGE, ROOT, subprocess_env
from tests.folder_fits import tiny_fit_args, tiny_folder
from tests.study_runs import fit_with_checkpoint, held, holding_env

PASSWORD = "hunter2-s3cret"
LR = "model.optimizer.init_args.lr: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}\n"


def _one_error_line(command: str, args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([command, *args])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
    assert exit_info.value.code == 1 and len(err) == 1, err
    assert PASSWORD not in err[0]
    return err[0]


@pytest.mark.parametrize(
    ("storage", "expected"),
    [
        (
            "sqlite:///{tmp}/no/such/folder/study.db",
            r"the SQLite file's folder .*no/such/folder does not exist",
        ),
        (
            f"postgresql+psycopg2://tuner:{PASSWORD}@db.example.org/studies",
            r"postgresql\+psycopg2://tuner:\*\*\*@db.example.org/studies: the database driver is not installed "
            r"\(No module named 'psycopg2'\): pip install psycopg2-binary",
        ),
        ("this is not a url", r"--storage this is not a url is not a database URL .*dialect\[\+driver\]://"),
        (f"postgresql://tuner:{PASSWORD}@db:port/x", r"--storage postgresql://\*\*\* is not a database URL"),
        ("nosuchdb://x/y", r"SQLAlchemy knows no database kind 'nosuchdb'"),
        (
            f"postgresql://tuner:{PASSWORD}@127.0.0.1:1/studies",
            r"cannot open the postgresql database studies on 127.0.0.1:1 \(.*refused.*\): check that the server",
        ),
    ],
)
def test_a_storage_that_cannot_be_opened_is_one_line_naming_the_host_and_leaves_no_study(
    storage, expected, tmp_path, capsys
):
    import re

    data = tiny_folder(tmp_path / "images")
    search = tmp_path / "lr.yaml"
    search.write_text(LR)
    args = [
        *tiny_fit_args(data, tmp_path),
        "--search",
        str(search),
        "--storage",
        storage.format(tmp=tmp_path),
    ]
    line = _one_error_line("tune", args, capsys)
    assert re.search(expected, line), line
    assert not (tmp_path / "logs" / "tune").exists()  # no claimed study folder


def test_a_database_lost_mid_study_is_one_line_naming_the_host_not_the_password():
    from sqlalchemy.exc import OperationalError

    url = f"postgresql://tuner:{PASSWORD}@db.example.org:5432/studies"
    driver_error = ConnectionError(f"server closed the connection unexpectedly (password {PASSWORD})")
    with pytest.raises(UserError) as info, lost(url, "the study lr"):
        try:  # Optuna's own error while cleaning up after the database's, as it raises them
            raise OperationalError("SELECT 1", {}, driver_error)
        except OperationalError:
            raise UnboundLocalError("cannot access local variable 'updated_state'") from None
    message = str(info.value)
    assert "the study lr lost its database, the postgresql database studies on db.example.org:5432" in message
    assert "server closed the connection unexpectedly" in message and "rerun the same command" in message
    assert PASSWORD not in message


def test_the_documented_storage_url_finds_its_driver():
    check_url("postgresql://user:password@db-host/optuna")  # the postgres extra: psycopg 3


def test_a_command_line_is_recorded_without_passwords_or_secret_settings(monkeypatch):
    args = ["tune", "--storage", f"postgresql://tuner:{PASSWORD}@db/x", "--trainer.logger.init_args.api_key"]
    args += [PASSWORD, f"--db.password={PASSWORD}", "--data.root", "/data", f"--x.token={PASSWORD}"]
    redacted = redact_command(args)
    assert PASSWORD not in " ".join(redacted)
    assert redacted[:3] == ["tune", "--storage", "postgresql://tuner:***@db/x"]
    assert "--data.root" in redacted and "/data" in redacted  # the rest as it was
    monkeypatch.setattr(sys, "argv", [PACKAGE, *args])
    assert PASSWORD not in json.dumps(collect_run_info()["command"])


def test_the_studys_own_wandb_run_does_not_record_the_database_password(tmp_path, monkeypatch):
    from project.studies.tables import log_table

    monkeypatch.setattr(sys, "argv", ["-m", "tune", "--storage", f"postgresql://tuner:{PASSWORD}@db/x"])
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run_dir = log_table(
        "tune/trials", ["trial"], [[0]], {"best/trial": 0}, tmp_path, "p", "g", "tune-summary"
    )
    assert Path(run_dir).exists()
    assert sys.argv[2] == "--storage"  # the real command line is back
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written and not [p for p in written if PASSWORD.encode() in p.read_bytes()]


def test_a_fits_wandb_run_starts_with_the_command_line_redacted(tmp_path, monkeypatch):
    from lightning.pytorch import loggers

    from project.loggers.wandb import WandbLogger

    seen: list[list[str]] = []
    monkeypatch.setattr(loggers.WandbLogger, "experiment", property(lambda self: seen.append(list(sys.argv))))
    real = [PACKAGE, "fit", "--trainer.logger.init_args.init_kwargs.api_key", PASSWORD]
    monkeypatch.setattr(sys, "argv", real)
    logger = WandbLogger(save_dir=str(tmp_path), offline=True)
    logger._init_run()  # what the background start runs: wandb.init records sys.argv in the run's metadata
    assert seen == [[PACKAGE, "fit", "--trainer.logger.init_args.init_kwargs.api_key", "***"]]
    assert sys.argv is real


def test_a_cv_with_an_unwritable_root_is_one_line(tmp_path, capsys):
    data = tiny_folder(tmp_path / "images")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    args = [*tiny_fit_args(data, tmp_path, "--trainer.default_root_dir", blocker / "logs"), "--folds", "2"]
    line = _one_error_line("cv", args, capsys)
    assert line.startswith("error: trainer.default_root_dir ") and "is not a writable folder" in line


def test_a_refused_cv_rerun_names_the_one_logger_setting_that_differs(tmp_path):
    def settings(name: str) -> dict:
        logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"name": name}}
        logger["init_args"] |= {f"option_{i}": i for i in range(30)}
        return {"fit": {"trainer": {"logger": [logger]}}}

    claim_folder(tmp_path, settings("a"), "the cross-validation", "--name")
    with pytest.raises(UserError) as info:
        claim_folder(tmp_path, settings("b"), "the cross-validation", "--name")
    message = str(info.value)
    assert "trainer.logger.0.init_args.name='a', this command has 'b'" in message
    assert "option_29" not in message


def test_a_search_bound_outside_a_settings_range_is_refused_before_any_trial(tmp_path, capsys):
    data = tiny_folder(tmp_path / "images")
    search = tmp_path / "smooth.yaml"
    search.write_text("model.label_smoothing: {type: float, low: 0.0, high: 1.5}\n")
    line = _one_error_line("tune", [*tiny_fit_args(data, tmp_path), "--search", str(search)], capsys)
    assert "model.label_smoothing=1.5 is refused: " in line and "label_smoothing must be in [0, 1)" in line
    assert not (tmp_path / "logs" / "tune").exists()


def test_optunas_report_of_a_failed_trial_is_one_line():
    from project.studies.runner import FitFailed

    def record(error: BaseException) -> logging.LogRecord:
        try:
            raise error
        except BaseException:
            return logging.LogRecord("optuna", logging.WARNING, "", 0, "Trial 1 failed", None, sys.exc_info())

    failed = record(FitFailed("trial 1 did not finish"))
    assert _optuna_says_one_line(failed) and failed.exc_info is None  # the line stays, its traceback goes
    assert not _optuna_says_one_line(record(UserError("the study stops: printed once, as its error line")))


def test_a_trial_two_workers_asked_for_at_once_is_given_back_unrun(tmp_path):
    import optuna
    from optuna.trial import TrialState

    from project.studies.trial_states import Surplus, give_back_if_surplus

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}")
    first, second = study.ask(), study.ask()  # two workers, each with a trial of its own
    for _ in range(2):
        study.add_trial(optuna.create_trial(value=0.5))
    give_back_if_surplus(study, first, n_trials=3)  # two lower-numbered trials taken: it is needed
    third = study.ask()  # the other workers' view: trials 0-3 taken, so trial 4 is a fourth
    with pytest.raises(Surplus):
        give_back_if_surplus(study, third, n_trials=4)
    assert study.get_trials()[third.number].state == TrialState.WAITING
    assert {t.number for t in study.get_trials(states=(TrialState.RUNNING,))} == {first.number, second.number}


def test_no_received_sigterm_line_for_a_ctrl_c(monkeypatch):
    logger = logging.getLogger(interrupts._SIGNAL_LOGGER)
    monkeypatch.setattr(logger, "filters", [interrupts._not_the_ctrl_c_sigterm])
    record = logger.makeRecord(logger.name, logging.INFO, "", 0, "[rank: 0] Received SIGTERM: 15", None, None)
    monkeypatch.setattr(interrupts, "stopped_by", "Ctrl-C (SIGINT)")
    assert not logger.filter(record)
    monkeypatch.setattr(interrupts, "stopped_by", "SIGTERM")
    assert logger.filter(record)  # a real SIGTERM still says so


def test_inside_a_study_the_fit_leaves_the_resume_hint_to_the_study(monkeypatch):
    monkeypatch.delenv(interrupts.STUDY_RUN_ENV, raising=False)
    assert "--ckpt_path last" in (interrupts.resume_hint() or "")
    monkeypatch.setenv(interrupts.STUDY_RUN_ENV, "fold 1 of 2")
    assert interrupts.resume_hint() is None


STAGE_AND_WAIT = """
import sys, time
from project.atomic_files import staged_outputs
with staged_outputs(sys.argv[1]) as staging:
    (staging / "model.onnx").write_bytes(b"x" * 1000)
    print("staged", flush=True)
    time.sleep(60)
"""


def test_sigterm_while_outputs_are_staged_leaves_no_staging_folder_and_says_so(tmp_path):
    out = tmp_path / "export"
    proc = subprocess.Popen(
        [sys.executable, "-c", STAGE_AND_WAIT, str(out)],
        env=subprocess_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "staged"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert err.strip().splitlines() == [
        f"error: stopped by SIGTERM while writing {out}; nothing was written there"
    ]
    assert not out.exists()  # the folder it created is gone with its staging folder


def test_a_later_write_removes_the_staging_folders_of_dead_processes(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f".staging-{int(dead.stdout)}-abc123"
    stale.mkdir()
    (stale / "model.onnx").write_bytes(b"x" * 1000)
    alive = tmp_path / f".staging-{os.getppid()}-def456"  # a live process's: left alone
    alive.mkdir()
    with staged_outputs(tmp_path) as staging:
        (staging / "a.txt").write_text("a")
    assert not stale.exists() and alive.exists() and (tmp_path / "a.txt").read_text() == "a"


def test_staging_gives_sigterm_back_as_it_found_it(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    with staged_outputs(tmp_path / "o") as staging:
        (staging / "f").write_text("f")
        assert before is not signal.SIG_DFL or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    assert signal.getsignal(signal.SIGTERM) is before and (tmp_path / "o" / "f").exists()
    assert issubclass(Terminated, SystemExit)  # not an Exception: no `except Exception` swallows it


def wait_for(path_glob: Path, pattern: str, proc: subprocess.Popen, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while not list(path_glob.glob(pattern)):
        assert proc.poll() is None and time.monotonic() < deadline, f"no {pattern} under {path_glob}"
        time.sleep(0.2)


def _ctrl_c(args: list[str], cwd: Path) -> tuple[str, str, str]:
    """Run a study, press Ctrl-C (SIGINT to its whole process group, as a terminal does) once a fit has a
    checkpoint; (the interrupted fit's folder, stdout, stderr)."""
    study = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "patched_main.py"), *args],
        cwd=cwd,
        env=holding_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, folder = fit_with_checkpoint(study)
        os.killpg(study.pid, signal.SIGINT)
        out, err = study.communicate(timeout=300)
    finally:
        if study.poll() is None:
            study.kill()
    assert study.returncode == 128 + signal.SIGINT, err[-4000:]
    assert (cwd / "held").exists()  # the Ctrl-C reached the fit inside training, as a user's would
    for noise in ("Traceback", "KeyboardInterrupt", "Received SIGTERM", "none saved yet"):
        assert noise not in err, err[-4000:]
    return folder, out, err


@pytest.mark.slow
def test_ctrl_c_in_tune_is_one_line_and_the_rerun_continues_the_trial_from_its_checkpoint(tmp_path):
    from tests.conftest import run_cli

    data = tiny_folder(tmp_path / "images")
    search = tmp_path / "lr.yaml"
    search.write_text(LR)
    fit_args = tiny_fit_args(data, tmp_path, "--trainer.logger", "false", "--trainer.max_epochs", "4")
    args = [
        "tune",
        *fit_args,
        "--search",
        str(search),
        "--n_trials",
        "1",
        "--pruner",
        "none",
        "--wandb",
        "false",
    ]
    args = held(args, tmp_path / "held")
    folder, _, err = _ctrl_c(args, tmp_path)
    assert err.strip().splitlines()[-1] == (
        "error: stopped by Ctrl-C during trial 0; rerun the same tune command to continue: the trial resumes "
        f"from its last.ckpt in {folder}"
    )
    rerun = run_cli(*args, cwd=tmp_path)
    assert "trial 1 (continuing trial_0): python -m project fit" in rerun.stdout
    assert "--ckpt_path last" in rerun.stdout
    assert len(list((Path(folder) / "runs").glob("version_*"))) == 1  # the same run, continued in place
    table = json.loads((tmp_path / "logs" / "tune" / "lr" / "trials.json").read_text())["trials"]
    assert {r["trial"]: r["state"] for r in table} == {0: "INTERRUPTED, continued by trial 1", 1: "COMPLETE"}


@pytest.mark.slow
def test_ctrl_c_in_cv_is_one_line_and_the_rerun_resumes_the_fold(tmp_path):
    from tests.conftest import run_cli

    data = tiny_folder(tmp_path / "images")
    fit_args = tiny_fit_args(data, tmp_path, "--trainer.logger", "false", "--trainer.max_epochs", "4")
    args = held(["cv", *fit_args, "--folds", "2", "--name", "cv", "--wandb", "false"], tmp_path / "held")
    folder, out, err = _ctrl_c(args, tmp_path)
    assert folder.endswith("fold_0")
    assert err.strip().splitlines()[-1] == (
        "error: stopped by Ctrl-C during fold 0 of 2; rerun the same cv command to continue: fold 0 resumes from "
        "its last.ckpt"
    )
    rerun = run_cli(*args, cwd=tmp_path)
    assert len(list((Path(folder) / "runs").glob("version_*"))) == 1  # the same run, continued in place
    assert (tmp_path / "logs" / "cv" / "cv" / "cv_results.json").is_file()
    # The study passes --ckpt_path last only to a fold it can continue: no notice for every new fold.
    assert "no run of these settings" not in out + err + rerun.stdout + rerun.stderr


@pytest.mark.slow
def test_a_search_metric_the_fit_never_logs_stops_the_study_after_its_first_validation(tmp_path):
    from tests.conftest import run_cli

    data = tiny_folder(tmp_path / "images")
    search = tmp_path / "lr.yaml"
    search.write_text("metric: val/f1_best\n" + LR)
    fit_args = tiny_fit_args(data, tmp_path, "--trainer.logger", "false")
    args = ["tune", *fit_args, "--search", str(search), "--n_trials", "3", "--wandb", "false"]
    proc = run_cli(*args, cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-4000:]
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"error: search file {search}: the metric val/f1_best is never logged by the fit (it logs "
        )
    )
    assert "trial 1" not in proc.stdout  # the study stopped at its first trial
    # Said once: by the study, not again by the trial's fit that found it.
    assert (proc.stdout + proc.stderr).count("is never logged by the fit") == 1, proc.stderr[-4000:]


def test_a_storage_whose_tables_another_process_created_at_the_same_moment_opens(monkeypatch):
    """Two tune workers starting on a new PostgreSQL database both create Optuna's tables; the one that loses
    gets a duplicate-key error from the catalogue, and opens the tables the other made."""
    import optuna
    from sqlalchemy.exc import IntegrityError, OperationalError

    lost_race = IntegrityError(
        "CREATE TABLE studies ...", {}, Exception('duplicate key value violates unique constraint '
                                                  '"pg_type_typname_nsp_index"'),
    )  # fmt: skip
    calls = []

    def storage(url, **settings):
        calls.append(url)
        if len(calls) == 1:
            raise lost_race
        return "opened"

    monkeypatch.setattr(optuna.storages, "RDBStorage", storage)
    assert open_storage("postgresql://user@127.0.0.1:5432/studies") == "opened" and len(calls) == 2
    # Any other failure of the database is not retried: one line at once.
    calls.clear()
    refused = OperationalError("connect", {}, Exception('connection to server at "127.0.0.1" refused'))

    def refusing(url, **settings):
        calls.append(url)
        raise refused

    monkeypatch.setattr(optuna.storages, "RDBStorage", refusing)
    with pytest.raises(UserError, match=r"^--storage: cannot open the postgresql database studies .*refused"):
        open_storage("postgresql://user@127.0.0.1:5432/studies")
    assert len(calls) == 1
