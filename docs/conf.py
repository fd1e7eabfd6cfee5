"""Sphinx settings for the docs site: Markdown pages (MyST), the furo theme, and an API reference generated from
the docstrings at every build (one page per module, Google-style `Args:` sections). Build it with `make docs`."""

import re
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # the package itself, also when the docs are built without an editable install

# The package is the folder that `python -m` runs (found, not named, so a renamed copy documents itself).
PACKAGE = next(
    p.parent.name for p in sorted(ROOT.glob("*/__main__.py")) if (p.parent / "__init__.py").is_file()
)

project = "Lightning image-classification template"
author = "the template's maintainers"
copyright = "the template's maintainers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_templates"]
templates_path = ["_templates"]

# Headings get anchors, so a page links to another's section as [text](data.md#labels-in-a-csv).
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_default_options = {"members": True, "show-inheritance": True, "ignore-module-all": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# A method that overrides Lightning's without a docstring of its own shows none, not Lightning's (whose
# cross-references point into Lightning's docs).
autodoc_inherit_docstrings = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Docstrings write code as Markdown does, `code`: in reStructuredText that is the default role, made literal.
default_role = "literal"

html_theme = "furo"
html_title = "Lightning image-classification template"


def write_api_pages() -> None:
    """One page per module of the package in docs/api/ (which git ignores), written afresh at every build: a
    module moved, added or removed is documented as it is now, and no page is left from one that is gone."""
    api = DOCS / "api"
    shutil.rmtree(api, ignore_errors=True)
    api.mkdir()
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__main__":
            continue  # running it is the command line, not an API
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        title = module.replace("_", r"\_")
        (api / f"{module}.rst").write_text(f"{title}\n{'=' * len(title)}\n\n.. automodule:: {module}\n")


#: A `code` span (Markdown's, which the default role reads as literal) and the text between spans.
CODE_SPAN = re.compile(r"(`[^`\n]+`)")
#: Outside code spans, what reStructuredText would read as markup where the docstrings mean plain text: a bar
#: (`|x|` is a substitution), a star inside a word or path (`*.yaml`: emphasis), a word ending in `_` (a link).
PLAIN = [
    (re.compile(r"\|"), r"\|"),
    (re.compile(r"(?<=[\w/.\-<>])\*"), r"\*"),
    (re.compile(r"(?<=\w)_(?=[\s.,;:)\\]|$)"), r"\_"),
]


def plain_markdown(app, what, name, obj, options, lines: list[str]) -> None:
    """Docstrings are written as plain text with Markdown's `code`: keep reStructuredText from reading their bars,
    stars and trailing underscores as markup, and let a code span touch a word (`torch.save`d)."""
    for i, line in enumerate(lines):
        pieces = CODE_SPAN.split(line)
        for j in range(0, len(pieces), 2):  # the text between code spans
            for pattern, escaped in PLAIN:
                pieces[j] = pattern.sub(escaped, pieces[j])
        for j in range(1, len(pieces), 2):  # a code span glued to a word needs an escaped space beside it
            if re.match(r"\w", pieces[j + 1]):
                pieces[j] += "\\ "
            if re.search(r"\w$", pieces[j - 1]):
                pieces[j] = "\\ " + pieces[j]
        lines[i] = "".join(pieces)


def setup(app) -> None:
    app.connect("builder-inited", lambda app: write_api_pages())
    app.connect(
        "autodoc-process-docstring", plain_markdown, priority=400
    )  # before napoleon reads the sections
    # Napoleon reads a constant's `#:` comment as "type: description", so "The credentials in a URL (`a:b`): ..."
    # would show "The credentials in a URL (`a" as a type: its sections are for functions and classes only.
    for listener in list(app.events.listeners["autodoc-process-docstring"]):
        if listener.handler.__module__ == "sphinx.ext.napoleon":
            app.disconnect(listener.id)
            app.connect(
                "autodoc-process-docstring", sections_of_code(listener.handler), priority=listener.priority
            )


def sections_of_code(napoleon):
    def process(app, what, name, obj, options, lines: list[str]) -> None:
        if what not in ("data", "attribute"):
            napoleon(app, what, name, obj, options, lines)

    return process
