"""A toy upstream for the evidence of upstream's own tests and per-hunk coverage: a real git repository with
vllm/calc.py, its pytest tests under tests/calc/ (one failing upstream) and a root conftest that, like vLLM's,
cannot load here; series files made from changes to it by git."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from conftest import git

from vpatch.series.files import Patch

SHIPPED = Path(__file__).resolve().parents[2] / "patches"
LOCK = SHIPPED / "probes" / "requirements.lock"

CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
TESTS = (
    "from vllm.calc import add, sub\n\n\n"
    "def test_add():\n    assert add(2, 2) == 4\n\n\n"
    "def test_sub():\n    assert sub(3, 1) == 2\n\n\n"
    "def test_known_broken_upstream():\n    assert add(1, 1) == 3\n\n\n"
    "class TestMore:\n    def test_add_zero(self):\n        assert add(5, 0) == 5\n"
)
# vLLM's root conftest needs the whole engine and an accelerator: here it fails at import, so a run that loaded it
# would report no test at all.
ROOT_CONFTEST = "raise RuntimeError('the root conftest needs an accelerator')\n"


def toy_upstream(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "upstream"
    # Results are cached by tree in the user's cache (where the probe venv is): a tree of its own for each run.
    files = {"README": uuid.uuid4().hex, "vllm/__init__.py": "", "vllm/calc.py": CALC, "tests/__init__.py": "",
             "tests/conftest.py": ROOT_CONFTEST, "tests/calc/__init__.py": "", "tests/calc/test_calc.py": TESTS}
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "v1.0")
    return repo, git(repo, "rev-parse", "HEAD").strip()


def patch_of(repo: Path, base: str, patches: Path, number: int, slug: str, calc: str) -> Patch:
    """A series file made by git from a change to vllm/calc.py on `base`."""
    git(repo, "checkout", "-q", "--detach", base)
    (repo / "vllm" / "calc.py").write_text(calc)
    git(repo, "commit", "-q", "-am", f"calc: {slug}")
    text = git(repo, "format-patch", "-1", "--stdout", "--full-index")
    git(repo, "checkout", "-q", "--detach", base)
    path = patches / f"{number:04d}-{slug}.patch"
    path.write_text(text)
    return Patch.load(path)


def series_dir(tmp_path: Path) -> Path:
    patches = tmp_path / "patches"
    (patches / "probes").mkdir(parents=True)
    shutil.copy(LOCK, patches / "probes" / "requirements.lock")  # the shipped probe venv, with pytest
    return patches
