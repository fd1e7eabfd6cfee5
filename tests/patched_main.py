"""`python tests/patched_main.py <args>`: the CLI with torchvision's CIFAR checksum check patched.

End-to-end tests run the real `python -m project` in a subprocess on fake CIFAR files; this is that
command (its entry point, exit included) plus the one patch fake files need.
"""

import sys
from pathlib import Path

# The repository root in place of this script's folder, whose test packages (tests/csv) would shadow the
# standard library's modules of the same name.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from project.__main__ import run  # noqa: E402
from tests.fakes import patch_cifar_integrity  # noqa: E402

if __name__ == "__main__":
    patch_cifar_integrity()
    run()
