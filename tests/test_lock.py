"""constraints.txt is one lock for every Python that pyproject.toml's requires-python admits, on the platforms
`make install` accepts: each environment finds exactly one pin per package, inside the declared range, and pip
picks, for each pin, a file whose sha256 the lock lists (so --require-hashes installs there)."""

import hashlib
import json
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import tomllib
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: The extras `make install` installs with the pins (the Makefile's EXTRAS): all but the unpinned ones.
UNPINNED_EXTRAS = (
    re.search(r"^UNPINNED_EXTRAS := (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
)
INSTALLED_EXTRAS = [e for e in PYPROJECT["optional-dependencies"] if e not in UNPINNED_EXTRAS]
#: (sys_platform, platform_machine) -> the wheel platform tags pip accepts there (glibc 2.28 and up on Linux, the
#: oldest the PyTorch wheels support; macOS 11 and up).
PLATFORMS = {
    ("linux", "x86_64"): [
        *(f"manylinux_2_{v}_x86_64" for v in range(5, 29)),
        "manylinux2014_x86_64",
        "manylinux2010_x86_64",
        "manylinux1_x86_64",
        "linux_x86_64",
    ],
    ("linux", "aarch64"): [*(f"manylinux_2_{v}_aarch64" for v in range(17, 29)), "manylinux2014_aarch64"],
    ("darwin", "arm64"): [
        *(f"macosx_{v}_0_{arch}" for v in range(11, 16) for arch in ("arm64", "universal2")),
        *(f"macosx_10_{v}_universal2" for v in range(9, 16)),
    ],
}


def supported_pythons() -> list[str]:
    """Every minor version requires-python admits, e.g. ['3.10', '3.11', '3.12', '3.13'] for '>=3.10,<3.14'."""
    low, high = re.fullmatch(r">=3\.(\d+),<3\.(\d+)", PYPROJECT["requires-python"]).groups()
    return [f"3.{minor}" for minor in range(int(low), int(high))]


def environment(python: str, platform: tuple[str, str]) -> dict[str, str]:
    system, machine = platform
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "sys_platform": system,
        "platform_system": {"linux": "Linux", "darwin": "Darwin"}[system],
        "platform_machine": machine,
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }


def lock() -> list[tuple[Requirement, list[str]]]:
    """constraints.txt's pins with their sha256s."""
    text = (ROOT / "constraints.txt").read_text().replace("\\\n", " ")
    pins = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):  # `# via` lines name what requires a pin
            requirement, *hashes = line.split(" --hash=sha256:")
            pins.append((Requirement(requirement.strip()), [h.strip() for h in hashes]))
    return pins


def pins_for(env: dict[str, str]) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256s) of the pins whose marker holds in `env`; two pins of one name is an error."""
    found: dict[str, tuple[str, list[str]]] = {}
    for requirement, hashes in lock():
        if requirement.marker is not None and not requirement.marker.evaluate(env):
            continue
        name = canonicalize_name(requirement.name)
        assert name not in found, f"{name} is pinned twice for {env['python_version']} {env['sys_platform']}"
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", requirement
        found[name] = (specifier.version, hashes)
    return found


def declared(env: dict[str, str]) -> list[Requirement]:
    """pyproject.toml's requirements that apply in `env`: the dependencies and the installed extras."""
    extras = PYPROJECT["optional-dependencies"]
    requirements = [
        Requirement(r)
        for r in [*PYPROJECT["dependencies"], *(r for e in INSTALLED_EXTRAS for r in extras[e])]
    ]
    return [r for r in requirements if r.marker is None or r.marker.evaluate(env)]


def test_requires_python_names_the_versions_ci_installs_on():
    assert supported_pythons()[0] == "3.10" and len(supported_pythons()) >= 4
    assert Marker(f"python_version >= '{supported_pythons()[0]}'").evaluate()  # this interpreter is covered


@pytest.mark.parametrize("platform", list(PLATFORMS), ids="-".join)
@pytest.mark.parametrize("python", supported_pythons())
def test_every_declared_requirement_has_one_pin_inside_its_range(python, platform):
    env = environment(python, platform)
    pins = pins_for(env)
    for requirement in declared(env):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not pinned for Python {python} on {platform}"
        assert requirement.specifier.contains(pins[name][0], prereleases=True), (requirement, pins[name][0])
    for name, (version, hashes) in pins.items():
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), f"{name}=={version}"


def sha256_of(item: dict) -> str:
    """The sha256 of the file pip chose (from the index's link, or hashed here for a local file without one)."""
    info = item["download_info"]
    digest = info.get("archive_info", {}).get("hashes", {}).get("sha256")
    if digest is None:
        path = urllib.request.url2pathname(urllib.parse.urlparse(info["url"]).path)
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return digest


# The lowest and highest Python on Linux x86-64 and the highest on the other platforms: pip reads the metadata
# of every file it picks from the index, so the matrix is trimmed to the ends, where pins fork by Python.
CHECKED = [
    (supported_pythons()[0], ("linux", "x86_64")),
    *((supported_pythons()[-1], platform) for platform in PLATFORMS),
]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("python", "platform"), CHECKED, ids=[f"{p}-{'-'.join(pl)}" for p, pl in CHECKED])
def test_pip_picks_a_hashed_file_for_every_pin(python, platform, tmp_path):
    """What pip would install there, resolved against the package index (metadata only, nothing installed):
    each file it picks must be one whose sha256 the lock lists, or --require-hashes refuses the install."""
    pins = pins_for(environment(python, platform))
    (tmp_path / "pins.txt").write_text("".join(f"{name}=={version}\n" for name, (version, _) in pins.items()))
    platform_flags = [flag for tag in PLATFORMS[platform] for flag in ("--platform", tag)]
    command = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "-q",
        "--only-binary=:all:", "--implementation", "cp", "--python-version", python, *platform_flags,
        "--target", str(tmp_path / "target"), "--report", str(tmp_path / "report.json"),
        "-r", str(tmp_path / "pins.txt"),
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=580)
    if run.returncode != 0 and re.search(
        r"NewConnectionError|Network is unreachable|Name or service", run.stderr
    ):
        pytest.skip(f"the package index cannot be reached from here: {run.stderr.strip().splitlines()[-1]}")
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())["install"]
    unhashed = [
        f"{item['metadata']['name']}=={item['metadata']['version']} ({item['download_info']['url'].rsplit('/', 1)[-1]})"
        for item in report
        if sha256_of(item) not in pins[canonicalize_name(item["metadata"]["name"])][1]
    ]
    assert unhashed == [], f"Python {python} on {platform}: files whose sha256 constraints.txt lacks"
    assert len(report) == len(pins)
