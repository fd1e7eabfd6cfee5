"""Execute every notebook, so none can rot."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = "".join(
        o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
    )
    assert "error" not in {o.get("output_type") for cell in nb.cells for o in cell.get("outputs", [])}
    if path.name == "01_quickstart.ipynb":
        accuracy = float(outputs.split("accuracy on this batch:")[1].split()[0])
        assert accuracy >= 0.6, outputs[-2000:]
