"""A study on a real PostgreSQL server (tests/postgres/start_server.sh; CI starts it before the tests): two
`tune` workers on one study, one of them killed in its trial, and a server that stops while the study runs.

Without the server (and without root to start one) the tests skip, saying why.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from tests.conftest import ROOT, subprocess_env
from tests.folder_fits import tiny_fit_args, tiny_folder
from tests.study_runs import fit_with_checkpoint, held, holding_env

PORT = int(os.environ.get("PGTEST_PORT", "54329"))
PASSWORD = os.environ.get("PGTEST_PASSWORD", "tuner-test-password")
URL = f"postgresql://tuner:{PASSWORD}@127.0.0.1:{PORT}/studies"
SCRIPT = ROOT / "tests" / "postgres" / "start_server.sh"
LR = "model.optimizer.init_args.lr: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}\n"

pytestmark = pytest.mark.slow


def _reachable() -> str | None:
    """None when the test server answers, else why not."""
    try:
        import psycopg
    except ImportError as e:
        return f"no PostgreSQL driver ({e}): pip install -e '.[postgres]'"
    try:
        psycopg.connect(URL, connect_timeout=5).close()
    except psycopg.OperationalError as e:
        return str(e).strip().splitlines()[0]
    return None


def _server(action: str = "start") -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), action], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def postgres() -> str:
    why = _reachable()
    if why is not None and os.geteuid() == 0 and shutil.which("runuser"):
        started = _server()
        why = _reachable() if started.returncode == 0 else (started.stderr.strip() or "the script failed")
    if why is not None:
        pytest.skip(f"no PostgreSQL test server on 127.0.0.1:{PORT} ({why}); start one: sudo {SCRIPT}")
    return URL


def _tune_args(tmp_path: Path, study: str, *extra: str, url: str = URL) -> list[str]:
    data = tiny_folder(tmp_path / "images")
    search = tmp_path / "lr.yaml"
    search.write_text(LR)
    args = ["tune", *tiny_fit_args(data, tmp_path, "--trainer.logger", "false"), "--search", str(search)]
    args += ["--storage", url, "--study_name", study, "--pruner", "none", "--heartbeat_interval", "1"]
    return [*args, "--grace_period", "3", *extra]


def _start(args: list[str], tmp_path: Path, hold: bool = False) -> subprocess.Popen:
    """A tune worker; with `hold`, its fits wait in training for the stop the test sends (`HoldUntilStopped`)."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "patched_main.py"), *args],
        cwd=tmp_path,
        env=holding_env() if hold else subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _unique(name: str) -> str:
    return f"{name}-{os.getpid()}-{time.time_ns()}"


def test_two_workers_share_a_study_and_a_killed_workers_trial_is_continued(postgres, tmp_path):
    study_name = _unique("shared")
    args = held(_tune_args(tmp_path, study_name, "--n_trials", "3", "--wandb", "true"), tmp_path / "held")
    doomed, survivor = _start(args, tmp_path, hold=True), _start(args, tmp_path)
    try:
        fit, killed_folder = fit_with_checkpoint(doomed)
        fits = psutil.Process(doomed.pid).children(recursive=True)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        psutil.wait_procs(fits, timeout=120)  # its fit got SIGTERM when its worker died, saved and stopped
        assert (tmp_path / "held").exists()  # killed while its fit was still training
        out, err = survivor.communicate(timeout=600)
    finally:
        for worker in (doomed, survivor):
            if worker.poll() is None:
                worker.kill()
    assert survivor.returncode == 0, err[-4000:]
    assert "Traceback" not in err

    study = optuna.load_study(study_name=study_name, storage=URL)
    trials = [t for t in study.get_trials() if t.state != TrialState.WAITING or t.params]  # none given back
    killed = next(
        t for t in trials if t.user_attrs.get("folder") == killed_folder and t.state == TrialState.FAIL
    )
    (continued,) = [t for t in trials if t.system_attrs.get("retry_history") == [killed.number]]
    assert continued.state == TrialState.COMPLETE and continued.user_attrs["folder"] == killed_folder
    assert continued.params == killed.params
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 3  # n_trials over both workers

    study_dir = tmp_path / "logs" / "tune" / study_name
    table = json.loads((study_dir / "trials.json").read_text())
    states = {r["trial"]: r["state"] for r in table["trials"]}
    assert sorted(states) == sorted(t.number for t in trials)  # the last writer wrote every trial
    assert states[killed.number] == f"FAIL (its worker stopped), continued by trial {continued.number}"
    assert (study_dir / "best_config.yaml").is_file() and (study_dir / "trials.md").is_file()
    assert not list(study_dir.glob(".staging-*"))
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]
    assert not leaked and PASSWORD not in out + err  # neither the W&B run nor any log holds the password


@pytest.mark.skipif(os.geteuid() != 0, reason="a server of its own to stop mid-study needs root")
def test_a_server_that_stops_mid_study_is_one_line_naming_it(postgres, tmp_path):
    # A server of its own (another port and cluster), so stopping it leaves the shared one to other tests.
    port = PORT + 1
    # (Not under tmp_path: the server runs as the postgres user, who cannot enter root's pytest folders.)
    cluster = Path(f"/tmp/project-test-postgres-{os.getpid()}")
    env = {**os.environ, "PGTEST_PORT": str(port), "PGTEST_DIR": str(cluster)}
    own = subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600)
    assert own.returncode == 0, own.stderr
    url = URL.replace(f":{PORT}/", f":{port}/")
    study_name = _unique("lost")
    worker = _start(
        _tune_args(tmp_path, study_name, "--n_trials", "3", "--wandb", "false", url=url), tmp_path
    )
    try:
        fit_with_checkpoint(worker)
        stop = subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0, stop.stderr
        out, err = worker.communicate(timeout=300)
    finally:
        if worker.poll() is None:
            worker.kill()
        subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(cluster, ignore_errors=True)
    assert worker.returncode == 1, err[-4000:]
    assert "Traceback" not in err and PASSWORD not in out + err
    last = err.strip().splitlines()[-1]
    assert last.startswith(
        f"error: the study {study_name} lost its database, the postgresql database studies on 127.0.0.1:{port} ("
    ), last
    assert "check that it is running and reachable, then rerun the same command to continue it" in last
