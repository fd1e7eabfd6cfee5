"""Checks of the class (or tag) names a data source reads, run at every start: names and counts only, no image
is opened, so they cost milliseconds on tens of thousands of labels.

Labels that split one class in two are easy to write and hard to see: `Cat` beside `cat`, a typo (`dgo` beside
`dog`), `café` typed on a Mac (decomposed) beside `café` typed elsewhere (composed), which print alike. Names
are read in Unicode's composed form (NFC, `nfc`), so the last pair is one class; the others are told in one
warning line per kind, and the run goes on: they may be meant.
"""

import contextlib
import os
import unicodedata
from collections.abc import Iterator, Sequence

from project.errors import warn

#: Set (to anything) in the environment of runs whose data a parent process has checked and warned about
#: already (the folds of `cv`): their own data warnings would only repeat its.
DATA_WARNED_ENV = "PROJECT_DATA_WARNED"

#: What a shown name is cut to: a label may be a whole paragraph pasted into a cell.
SHOWN_CHARS = 60


def data_warning(message: str) -> None:
    """`warn` about the data, unless a parent process has already (DATA_WARNED_ENV)."""
    if not os.environ.get(DATA_WARNED_ENV):
        warn(message)


@contextlib.contextmanager
def data_warnings_given() -> Iterator[None]:
    """Within it, `data_warning` says nothing, here and in the processes started here: for a command that has
    built the data (and so warned about it) before it runs fits or evaluations of that data."""
    before = os.environ.get(DATA_WARNED_ENV)
    os.environ[DATA_WARNED_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[DATA_WARNED_ENV]
        else:
            os.environ[DATA_WARNED_ENV] = before


def nfc(name: str) -> str:
    """`name` in Unicode's composed form (NFC): `e` + combining accent becomes `é`, as most keyboards type it."""
    return name if name.isascii() else unicodedata.normalize("NFC", name)


def shown(value: str, limit: int = SHOWN_CHARS) -> str:
    """`repr(value)`, cut to about `limit` characters with its length said when longer."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value):,} characters)"


def check_class_names(
    classes: Sequence[str], counts: Sequence[int], source: str, kind: str = "class"
) -> None:
    """One warning line for each kind of suspicious name among `classes` (with `counts` images each) of
    `source`: names that differ only in case, a small class one character away from a bigger one (a typo),
    and classes of a single image."""
    plural = "classes" if kind == "class" else f"{kind}s"
    count = dict(zip(classes, counts, strict=True))

    def named(name: str) -> str:
        return f"{shown(name)} ({count[name]} image{'s' if count[name] != 1 else ''})"

    by_case: dict[str, list[str]] = {}
    for name in classes:
        by_case.setdefault(name.casefold(), []).append(name)
    if clashes := [names for names in by_case.values() if len(names) > 1]:
        more = f" (and {len(clashes) - 1} more such group(s))" if len(clashes) > 1 else ""
        data_warning(
            f"{plural} {' and '.join(map(named, clashes[0]))} of {source} differ only in case{more}: they are "
            f"different {plural}; write them alike if they are one"
        )
    if typos := _typos(classes, count):
        small, big = typos[0]
        more = f" (and {len(typos) - 1} more such pair(s))" if len(typos) > 1 else ""
        data_warning(
            f"{kind} {named(small)} of {source} is one character away from {named(big)}{more}: a typo? They are "
            f"different {plural}; correct the label if they are one"
        )
    if single := [name for name in classes if count[name] == 1]:
        listed = ", ".join(shown(n) for n in single[:10]) + (" ..." if len(single) > 10 else "")
        data_warning(
            f"{len(single)} {kind if len(single) == 1 else plural} of {source} ha{'s' if len(single) == 1 else 've'}"
            f" a single image ({listed}): it trains, and nothing of it is validated; add images or check the label"
        )


def _typos(classes: Sequence[str], count: dict[str, int]) -> list[tuple[str, str]]:
    """(small, big) pairs of names one edit apart (a letter changed, added, dropped or two swapped) where `small`
    has at most a fifth of `big`'s images (one image at least): a typo of the big class's name, likely. Names
    shorter than 3 characters and edits of a digit (`batch1`, `batch2`) are left out: those differ on purpose.

    Candidates are the names that share a form with one letter deleted with a small class's name, so the cost
    grows with the number of names, not its square (and is nil when no class is that small)."""
    top = max(count.values(), default=0)
    small_forms: dict[str, list[str]] = {}
    for small in classes:
        if len(small) >= 3 and count[small] * 5 <= top:
            for form in _forms(small):
                small_forms.setdefault(form, []).append(small)
    pairs: set[tuple[str, str]] = set()
    for big in classes if small_forms else ():
        for form in _forms(big) if len(big) >= 3 else ():
            for small in small_forms.get(form, ()):
                if (
                    count[small] * 5 <= count[big]
                    and small.casefold() != big.casefold()
                    and _one_edit(small, big)
                ):
                    pairs.add((small, big))
    return sorted(pairs, key=lambda pair: (count[pair[0]], pair))


def _forms(name: str) -> set[str]:
    """`name`, and `name` with each of its letters deleted in turn."""
    return {name, *(name[:i] + name[i + 1 :] for i in range(len(name)))}


def _one_edit(a: str, b: str) -> bool:
    """`a` and `b` differ by one letter changed, added or dropped, or two neighbours swapped; not in a digit."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    start = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    end_a, end_b = len(a), len(b)
    while end_a > start and end_b > start and a[end_a - 1] == b[end_b - 1]:
        end_a, end_b = end_a - 1, end_b - 1
    left, right = a[start:end_a], b[start:end_b]
    if any(c.isdigit() for c in left + right):
        return False
    swapped = len(left) == len(right) == 2 and left == right[::-1]
    return (len(left) <= 1 and len(right) <= 1) or swapped
