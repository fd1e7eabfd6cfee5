"""The registries (project.registry): a package's `REGISTER` literal is read without importing it, an entry whose
module is absent is left out, and a class named in a command line is imported for jsonargparse to find."""

import subprocess
import sys

import pytest

from project import registry
from tests.conftest import PACKAGE, ROOT


def test_every_registered_entry_loads_and_every_seam_is_known():
    for seam in registry.SEAMS:
        for name in registry.registered(seam):
            loaded = registry.load(seam, name)
            assert loaded is not None and (seam != "commands" or callable(loaded)), (seam, name)


def test_an_unknown_name_is_refused_naming_the_registered_ones():
    with pytest.raises(KeyError, match="registered:"):
        registry.load("commands", "no-such-command")
    with pytest.raises(ValueError, match="the seams"):
        registry.registered("no-such-seam")


def test_a_table_is_read_as_text_and_an_absent_module_is_left_out(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    (package / "part").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "part" / "__init__.py").write_text(
        "raise RuntimeError('imported')\n"
        'REGISTER = {"tasks": {"Here": ".here", "Gone": ".gone"}, "commands": {"go": (".here:main", "goes")}}\n'
    )
    (package / "part" / "here.py").write_text("")
    monkeypatch.setattr(registry, "FOLDER", package)
    monkeypatch.setattr(registry, "PACKAGE", "pkg")
    for cached in (registry._tables, registry.registered, registry.command_summaries):
        cached.cache_clear()
    try:
        assert registry.registered("tasks") == {"Here": "pkg.part.here:Here"}
        assert registry.registered("commands") == {"go": "pkg.part.here:main"}
        assert registry.command_summaries() == {"go": "goes"}
    finally:
        for cached in (registry._tables, registry.registered, registry.command_summaries):
            cached.cache_clear()


def test_help_lists_the_commands_without_importing_torch():
    code = f"import sys, {PACKAGE}; {PACKAGE}.print_commands(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.rstrip().endswith("False"), out.stdout
