"""Search files: which config keys `tune` searches, over which distributions, for which metric.

A search file is a small YAML of dotted `fit` config keys, each with an Optuna distribution, plus an optional
`metric` and `direction` (`maximize`, or `minimize` for a loss); by default the best value of the metric the
task monitors (`ImageTask.monitor`: `val/acc_best` for `ImageClassifier`), in the task's direction:

    metric: val/acc_best
    direction: maximize
    model.optimizer.init_args.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
    model.label_smoothing: {type: float, low: 0.0, high: 0.2, step: 0.05}
    data.batch_size: {type: int, low: 32, high: 256, log: true}
    model.net: {type: categorical, choices: [SimpleCNN, CIFARResNet]}

The distributions are Optuna's own (`FloatDistribution`, `IntDistribution`, `CategoricalDistribution`), so
their rules (low <= high, log needs low > 0 and no step, ...) are Optuna's. A bad file names the key at fault,
and so does a value `fit` would refuse (`check_search`, before any trial trains). `suggest` draws a trial's values.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import optuna
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from project.errors import UserError
from project.studies.runner import parse_fit_args

Direction = Literal["maximize", "minimize"]
DIRECTIONS: tuple[Direction, ...] = ("maximize", "minimize")
#: The distributions a search file can name.
Distribution = FloatDistribution | IntDistribution | CategoricalDistribution
FIELDS = {
    "float": {"low", "high", "log", "step"},
    "int": {"low", "high", "log", "step"},
    "categorical": {"choices"},
}


@dataclass
class SearchSpace:
    """The parameters (dotted config key -> distribution), and the metric to optimise in which direction."""

    params: dict[str, Distribution]
    metric: str = "val/acc_best"
    direction: Direction = "maximize"
    source: str = ""
    spec: dict[str, Any] = field(default_factory=dict)


def _number(value: Any, kind: str, where: str) -> float | int:
    # YAML 1.1 reads `1e-4` (no dot) as text: accept what Python reads as a number.
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise UserError(f"{where}: {value!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserError(f"{where}: {value!r} is not a number")
    if kind == "int":
        if float(value) != int(value):
            raise UserError(f"{where}: {value!r} is not an integer (the distribution is int)")
        return int(value)
    return float(value)


def distribution(spec: Any, where: str) -> Distribution:
    """The Optuna distribution of one search-file entry (`{type: float, low: ..., high: ...}`)."""
    if not isinstance(spec, dict) or "type" not in spec:
        raise UserError(f"{where}: expected a mapping with a type (float, int or categorical), got {spec!r}")
    kind = spec["type"]
    if kind not in FIELDS:
        raise UserError(f"{where}: type must be float, int or categorical, got {kind!r}")
    unknown = set(spec) - FIELDS[kind] - {"type"}
    if unknown:
        raise UserError(f"{where}: unknown field(s) {', '.join(sorted(unknown))} for type {kind}")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise UserError(f"{where}: categorical needs a non-empty list of choices")
        bad = [c for c in choices if c is not None and not isinstance(c, bool | int | float | str)]
        if bad:
            raise UserError(f"{where}: choices must be strings, numbers, booleans or null, got {bad[0]!r}")
        return CategoricalDistribution(choices)
    missing = {"low", "high"} - set(spec)
    if missing:
        raise UserError(f"{where}: type {kind} needs {' and '.join(sorted(missing))}")
    low, high = (_number(spec[k], kind, f"{where}.{k}") for k in ("low", "high"))
    step = None if spec.get("step") is None else _number(spec["step"], kind, f"{where}.step")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise UserError(f"{where}.log: expected true or false, got {log!r}")
    try:
        if kind == "int":  # _number made each of them an int
            return IntDistribution(int(low), int(high), log=log, step=1 if step is None else int(step))
        return FloatDistribution(low, high, log=log, step=step)
    except ValueError as e:  # Optuna's own rules
        raise UserError(f"{where}: {e}") from None


def load_search(path: str | Path, task: type | None = None) -> SearchSpace:
    """Read and check a search file; every problem is a UserError naming the file and the key. `task`, the
    LightningModule class the runs train, gives the default metric and direction."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"search file {path} does not exist")
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise UserError(f"search file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(spec, dict):
        raise UserError(f"search file {path} must be a mapping of config keys to distributions")
    monitor, mode = (getattr(task, "monitor", None), getattr(task, "monitor_mode", None))
    metric = spec.pop("metric", f"{monitor}_best" if monitor else "val/acc_best")
    direction = spec.pop("direction", "minimize" if mode == "min" else "maximize")
    if not isinstance(metric, str) or "/" not in metric:
        raise UserError(
            f"search file {path}: metric must be a logged metric such as val/acc_best, got {metric!r}"
        )
    if direction not in DIRECTIONS:
        raise UserError(f"search file {path}: direction must be maximize or minimize, got {direction!r}")
    if not spec:
        raise UserError(f"search file {path} names no config key to search")
    params = {}
    for key, entry in spec.items():
        if not isinstance(key, str) or "." not in key or key.startswith("."):
            raise UserError(
                f"search file {path}: {key!r} is not a dotted config key (such as model.label_smoothing)"
            )
        params[key] = distribution(entry, f"search file {path}: {key}")
    return SearchSpace(params, metric, direction, str(path), spec)


def samples(space: SearchSpace) -> list[dict[str, Any]]:
    """Value sets that together try every parameter's bounds and every choice: what `fit` must accept."""
    values = {}
    for key, dist in space.params.items():
        values[key] = (
            list(dist.choices) if isinstance(dist, CategoricalDistribution) else [dist.low, dist.high]
        )
    return [{k: v[i % len(v)] for k, v in values.items()} for i in range(max(map(len, values.values())))]


def flag_value(value: Any) -> str:
    """A parameter's value as `fit` reads it on the command line (YAML: true, null, 0.001, SimpleCNN)."""
    return value if isinstance(value, str) else yaml.safe_dump(value).splitlines()[0]


def as_flags(params: dict[str, Any]) -> list[str]:
    return [a for key, value in params.items() for a in (f"--{key}", flag_value(value))]


def suggest(trial: optuna.Trial, space: SearchSpace) -> dict[str, Any]:
    params = {}
    for key, dist in space.params.items():
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            params[key] = trial.suggest_categorical(key, dist.choices)
        elif isinstance(dist, optuna.distributions.IntDistribution):
            params[key] = trial.suggest_int(key, dist.low, dist.high, step=dist.step, log=dist.log)
        else:
            params[key] = trial.suggest_float(key, dist.low, dist.high, step=dist.step, log=dist.log)
    return params


def _refused(fit_args: list[str], values: dict[str, Any]) -> str | None:
    """Why `fit` refuses these parameter values: its parser, then the `__init__` of the sections they set (a
    task's or DataModule's own range checks, such as label_smoothing in [0, 1)); None if it accepts them."""
    from project.cli.config import instantiate_section
    from project.data import ImageDataModule
    from project.tasks import ImageTask

    try:
        _, config = parse_fit_args([*fit_args, *as_flags(values)])
        sections = {key.split(".", 1)[0] for key in values}
        if "model" in sections:
            instantiate_section("model", ImageTask, config.model)
        if "data" in sections:
            instantiate_section("data", ImageDataModule, config.data)
    except UserError as e:
        return str(e)
    except Exception as e:  # a check in an __init__ that raises a plain error: its own words
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        listed = [line[2:] for line in lines if line.startswith("- ")]
        return (listed or lines or [type(e).__name__])[0]
    return None


def check_search(fit_args: list[str], space: SearchSpace) -> None:
    """Every parameter's bounds and choices through `fit`'s parser and the `__init__` of what they set: a bad
    key or value names the search file, before any trial trains."""
    for values in samples(space):
        why = _refused(fit_args, values)
        if why is None:
            continue
        for key, value in values.items():  # name the value: the first refusal may not
            alone = _refused(fit_args, {key: value})
            if alone is not None:
                raise UserError(f"search file {space.source}: {key}={value!r} is refused: {alone}")
        raise UserError(f"search file {space.source}: {why}")
