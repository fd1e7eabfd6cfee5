"""A command line's config files, checked before it is parsed, and jsonargparse's parse errors as one line."""

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from project import models
from project.callbacks import import_named
from project.cli.tool_args import config_files
from project.errors import UserError
from project.registry import import_named as import_registered

#: PyYAML's safe loader, in C where PyYAML was built with libyaml (the same safe subset of YAML, read without a
#: Python-level parser): every command reads its config files once before jsonargparse does.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str) -> Any:
    """`yaml.safe_load(text)`, read by libyaml where PyYAML has it."""
    return yaml.load(text, Loader=_SAFE_LOADER)  # (a safe loader)


def check_config_file(path: str) -> str:
    """The text of the config file `path`; a UserError naming it when it cannot be read or is not valid YAML
    (jsonargparse names neither)."""
    file = Path(path)
    if not file.exists():
        return ""  # the parser's own message names the missing file
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read config file {file}: {getattr(e, 'strerror', None) or e}") from None
    try:
        content = load_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise UserError(
            f"config file {file} is not valid YAML{where}: {getattr(e, 'problem', None) or e}"
        ) from None
    if not isinstance(content, dict):
        what = "is empty" if content is None else f"holds a {type(content).__name__}"
        raise UserError(
            f"config file {file} {what}: a config is a mapping of settings (`trainer:`, `model:`, `data:`, ...)"
        )
    return text


def before_parsing(args: Sequence[str]) -> None:
    """What a command line needs before it is parsed: its config files checked, and the optional callbacks it
    names imported (the core imports none of them)."""
    args = [str(a) for a in args]
    texts = [check_config_file(path) for path in config_files(args)]
    import_named([*args, *texts])
    import_registered([*args, *texts])  # the tasks, DataModules and sources the packages present register


# Lines of jsonargparse's message for a class chosen by class_path (the task, the data, the network) that only
# say how it searched: the line that names the key and the one that says what is wrong are what remain.
_SEARCH_LINES = ("Does not validate against any", "Subtypes:", "Errors:", "- Expected a <class 'NoneType'>")
_SEARCH_LINES += ("Given value type:", "Given value:", "Expected a <class 'NoneType'>")
_NESTED_KEY = re.compile(
    r'Parser key "([\w.]+)": Problem with given class_path \'[^\']+\': Parser key "([\w.]+)":'
)


_UNKNOWN_NET = re.compile(r'Parser key "([\w.]*\bnet)": .*Expected a dot import path string: (\S+)')


def parse_error_line(message: str) -> str:
    """jsonargparse's (often many-line) parse error as one line naming the key and what is wrong with it."""
    lines = [line.strip().removeprefix("- ") for line in str(message).strip().splitlines()]
    text = " ".join(line for line in lines if line and not line.startswith(_SEARCH_LINES))
    # `Parser key "model": Problem with given class_path '...': Parser key "net": ...` -> `Parser key "model.net": ...`
    while (joined := _NESTED_KEY.sub(r'Parser key "\1.\2":', text)) != text:
        text = joined
    if unknown := _UNKNOWN_NET.search(text):
        nets = [name for name in models.__all__ if isinstance(getattr(models, name), type)]
        return (
            f'Parser key "{unknown[1]}": {unknown[2]} is not a network: one of {", ".join(nets)} '
            "(project.models), or the import path of any nn.Module (e.g. torchvision.models.resnet18)"
        )
    return text or str(message).strip()
