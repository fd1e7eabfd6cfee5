"""How a CSV's label cells become labels: a kind of target whose labels are not one name per image says it
(`CellReading`: tags, values); one name per image is read here (`OneName`), with the checks only a CSV needs."""

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from project.data.image_reading import Label
from project.data.label_checks import data_warning, shown
from project.errors import UserError
from project.registry import registered


class CellReading(Protocol):
    """How a CSV writes labels of one kind of target: a kind whose labels are not one name per image (tags,
    values) says it with these three methods, beside the rest of what it carries."""

    @classmethod
    def read_cells(
        cls,
        cells: list[str],
        columns: list[str],
        per_name: bool,
        separator: str | None,
        named: Callable[[str], str],
    ) -> Any:
        """An image's label as written, from the cells of the label `columns` (`per_name`: data.label_columns,
        one column per name); a ValueError saying what is wrong with them."""
        ...

    @classmethod
    def names_read(
        cls, labels: list[Any], rows: list[int], columns: list[str], per_name: bool, separator: str | None,
        where: str,
    ) -> list[str]:  # fmt: skip
        """The names the training CSV `where` gives, in the order of the outputs; a UserError when they cannot
        train a model."""
        ...

    @staticmethod
    def indexed(label: Any, index: dict[str, int]) -> Label:
        """A label as written, with its names as indices (`index`); a KeyError naming one it lacks."""
        ...


class OneName:
    """How a CSV writes one class per image (and any kind without cells of its own): its name, in one cell."""

    @classmethod
    def read_cells(
        cls,
        cells: list[str],
        columns: list[str],
        per_name: bool,
        separator: str | None,
        named: Callable[[str], str],
    ) -> str:
        return named(cells[0])  # empty: told after the whole CSV is read

    @classmethod
    def names_read(
        cls, labels: list[Any], rows: list[int], columns: list[str], per_name: bool, separator: str | None,
        where: str,
    ) -> list[str]:  # fmt: skip
        names = set(labels)
        if len(names) < 2:
            raise UserError(
                f"{where} has {len(names)} distinct label(s) ({', '.join(map(shown, names))}): a classifier needs "
                "at least two"
            )
        warn_if_values(
            sorted(names), where, other_kind("values", "if they are measurements, read them as values")
        )
        numeric = all(re.fullmatch(r"-?[0-9]+", n) for n in names)  # ASCII digits only: int() reads "²" too
        return sorted(names, key=lambda n: (int(n), n) if numeric else (0, n))

    @staticmethod
    def indexed(label: Any, index: dict[str, int]) -> Label:
        return index[label]


def other_kind(name: str, why: str) -> str:
    """`why` the labels may be of the registered kind `name`, and the setting that reads them so; nothing where
    no package present registers that kind."""
    return f"; {why}: data.kind {name}" if name in registered("target_kinds") else ""


#: More distinct labels than this, all numbers and some not whole, read as real values rather than classes.
VALUE_LIKE_CLASSES = 20


def warn_if_values(names: Sequence[str], source: str, hint: str = "") -> None:
    """One warning line when class labels look like real values (many distinct numbers, some with a fraction):
    trained as classes, each value would be a class of its own and nothing would relate 2.5 to 2.6. `hint`
    ends it (the setting that reads them as values, where there is one)."""
    if len(names) <= VALUE_LIKE_CLASSES:
        return
    try:
        numbers = [float(name) for name in names]
    except ValueError:
        return
    if all(n.is_integer() for n in numbers):
        return
    example = next(name for name, n in zip(names, numbers, strict=True) if not n.is_integer())
    data_warning(
        f"the {len(names)} labels of {source} are all numbers (such as {shown(example)}): they are trained as "
        f"{len(names)} classes{hint}"
    )


def check_label_shape(path: Path, rows: list[int], written: list[Any]) -> None:
    """A UserError when a single-label CSV holds several tags per cell (labels `blue round` beside `blue`
    and `round`, or `round blue`): trained as one class per combination, they would mean nothing."""
    first_row: dict[str, int] = {}
    for row, label in zip(rows, written, strict=True):
        first_row.setdefault(label, row)
    in_order: dict[tuple[str, ...], str] = {}
    for label, row in first_row.items():
        words = label.split()
        if len(words) < 2:
            continue
        other = in_order.setdefault(tuple(sorted(words)), label)
        if other != label:
            why = f"{shown(other)} on row {first_row[other]} has the same words in another order"
        elif all(word in first_row for word in words):
            why = f"{', '.join(map(shown, words))} are labels of their own on other rows"
        else:
            continue
        raise UserError(
            f"{path} row {row}: the label {shown(label)} looks like several tags ({why}): give each image one "
            f"label{other_kind('tags', 'or, for a multi-label CSV, read them as tags')}"
        )
