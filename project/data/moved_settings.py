"""Settings of the data that live under another key now: a config or flag that uses the old key is refused in
one line naming the new one, before anything is parsed (jsonargparse's own message would only say the key is
unknown)."""

from collections.abc import Iterable, Sequence
from typing import Any

#: The augmentation's settings, grouped in one object (`data.augment`, a `BatchAugmentation`).
AUGMENTATION = (
    "crop_padding",
    "crop_padding_mode",
    "flip",
    "cutout",
    "mixup_alpha",
    "cutmix_alpha",
    "mix_prob",
    "random_erasing",
    "crop_scale",
    "crop_ratio",
    "eval_crop",
    "trivial_augment",
)

#: `data.<old>` -> `data.<new>`.
MOVED: dict[str, str] = {name: f"augment.{name}" for name in AUGMENTATION}

#: Why each group moved, said with the first key of it a config uses.
WHY = {"augment": "the augmentation's settings are one object, data.augment"}


def keys_in(args: Sequence[str], configs: Iterable[Any]) -> set[str]:
    """The dotted keys under `data` that a command line's flags and its config files (parsed YAML) set, without
    `init_args`: `data.crop_padding` for `--data.init_args.crop_padding` or `data: {crop_padding: ...}`."""
    keys = {arg[2:].split("=", 1)[0].replace(".init_args", "") for arg in args if arg.startswith("--data.")}
    for config in configs:
        if isinstance(config, dict) and isinstance(config.get("data"), dict):
            keys |= _dotted(config["data"], "data")
    return keys


def _dotted(tree: dict[str, Any], prefix: str) -> set[str]:
    keys = set()
    for name, value in tree.items():
        inner = prefix if name == "init_args" else f"{prefix}.{name}"
        keys.add(inner)
        if isinstance(value, dict) and name in ("init_args",):
            keys |= _dotted(value, inner)
    return keys


def moved_setting(keys: Iterable[str]) -> str | None:
    """The one line for the first key of `keys` that moved, naming its new key; None when none did."""
    for key in sorted(keys):
        old = key.removeprefix("data.")
        if key.startswith("data.") and old in MOVED:
            group, _, name = MOVED[old].rpartition(".")
            return (
                f"data.{old} is now data.{group}.{name} ({WHY[group]}): --data.{group}.{name} on the command line, "
                f"or `{group}: {{{name}: ...}}` under `data:` in a config"
            )
    return None
