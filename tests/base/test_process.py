"""The one process runner: inherited GIT_* variables change nothing, and one error type says what failed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import KV_V1, PARSER_V1, Project, git
from conftest import vpatch_cli as run

from vpatch.base import process
from vpatch.base.errors import GitError, ProcessError

FIX_20 = PARSER_V1.replace("line 20\n", "line 20 fixed\n")


def decoy_repo(tmp_path: Path) -> Path:
    """Another real repository, with an index and a v1.0 tag of its own: the worst place to be pointed at."""
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    git(decoy, "init", "-q", "-b", "main")
    (decoy / "vllm").mkdir()
    (decoy / "vllm" / "kv.py").write_text("nothing alike\n")
    git(decoy, "add", "-A")
    git(decoy, "commit", "-q", "-m", "decoy")
    git(decoy, "tag", "v1.0")
    return decoy


def hook_environment(monkeypatch: pytest.MonkeyPatch, decoy: Path) -> None:
    """What a git hook or a CI step run from one exports, aimed at the decoy."""
    monkeypatch.setenv("GIT_DIR", str(decoy / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(decoy))
    monkeypatch.setenv("GIT_INDEX_FILE", str(decoy / ".git" / "index"))
    monkeypatch.setenv("GIT_OBJECT_DIRECTORY", str(decoy / ".git" / "objects"))


def test_status_with_inherited_git_variables_is_unchanged(project: Project, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    project.make_patch(2, "kv-skip-null", {"vllm/kv.py": KV_V1.replace("break", "continue")}, "Skip null blocks")
    project.upstream.commit({"vllm/parser.py": FIX_20}, "Upstream parser fix", tag="v1.1")
    decoy = decoy_repo(tmp_path)
    decoy_index = (decoy / ".git" / "index").read_bytes()

    hook_environment(monkeypatch, decoy)
    code, out = run(project, "fetch")  # the mirror learns v1.1 under the hook's environment
    assert code == 0, out
    code, hooked = run(project, "status", "--against", "v1.1", "--json")
    assert code == 0, hooked
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY"):
        monkeypatch.delenv(var)
    code, clean = run(project, "status", "--against", "v1.1", "--json")
    assert code == 0, clean
    assert json.loads(hooked) == json.loads(clean)
    assert json.loads(hooked)["patches"][0]["results"]["v1.1"]["state"] == "landed"
    assert (decoy / ".git" / "index").read_bytes() == decoy_index


def test_apply_and_export_with_inherited_git_variables(project: Project, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    patch_bytes = (project.patches / "0001-parser-fix.patch").read_bytes()
    decoy = decoy_repo(tmp_path)
    decoy_head = git(decoy, "rev-parse", "HEAD")

    hook_environment(monkeypatch, decoy)
    code, out = run(project, "apply")
    assert code == 0, out
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY"):
        monkeypatch.delenv(var)
    tree = project.root / ".vpatch" / "tree"
    assert git(tree, "log", "--format=%s", "v1.0..HEAD").splitlines() == ["Fix the parser"]
    assert (tree / "vllm/parser.py").read_text() == FIX_20
    assert git(decoy, "rev-parse", "HEAD") == decoy_head
    assert git(decoy, "log", "--format=%s").splitlines() == ["decoy"]

    hook_environment(monkeypatch, decoy)
    code, out = run(project, "export")
    assert code == 0, out
    assert (project.patches / "0001-parser-fix.patch").read_bytes() == patch_bytes


def test_children_see_no_repository_locating_git_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_DIR", "/nonexistent/.git")
    monkeypatch.setenv("GIT_WORK_TREE", "/nonexistent")
    monkeypatch.setenv("GIT_INDEX_FILE", "/nonexistent/index")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "user.name")
    show = "import os, json; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('GIT_')}))"
    seen = json.loads(process.run([sys.executable, "-c", show], env={"GIT_INDEX_FILE": "/tmp/x"}).out)
    assert "GIT_DIR" not in seen and "GIT_WORK_TREE" not in seen
    assert seen["GIT_INDEX_FILE"] == "/tmp/x"  # an explicit addition still reaches the child
    assert seen["GIT_AUTHOR_NAME"] == "Test Person"  # identity and config location are kept
    assert seen["GIT_CONFIG_KEY_0"] == "user.name"
    assert seen["GIT_TERMINAL_PROMPT"] == "0"


def test_a_failed_command_names_command_exit_code_and_output(tmp_path: Path) -> None:
    with pytest.raises(ProcessError) as failed:
        process.run([sys.executable, "-c", "import sys; print('partial work'); sys.exit('went wrong')"])
    err = failed.value
    assert err.returncode == 1 and err.command[0] == sys.executable
    assert "failed with exit code 1" in err.message
    assert "partial work" in err.output and "went wrong" in err.output

    with pytest.raises(GitError) as git_failed:
        from vpatch import git as vgit

        vgit.run(tmp_path, ["rev-parse", "--verify", "no-such-ref"])
    assert git_failed.value.message.startswith("git rev-parse --verify no-such-ref failed with exit code 128")
    assert git_failed.value.returncode == 128


def test_a_missing_program_and_a_timeout_are_errors_with_hints(tmp_path: Path) -> None:
    with pytest.raises(ProcessError) as missing:
        process.run([str(tmp_path / "no-such-tool"), "--version"])
    assert missing.value.returncode is None and "cannot run" in missing.value.message
    assert missing.value.hint and "no-such-tool" in missing.value.hint

    with pytest.raises(ProcessError) as slow:
        process.run([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"],
                    timeout=1, check=False)
    assert slow.value.timed_out and "timed out after 1s" in slow.value.message


def test_stream_and_feed(tmp_path: Path) -> None:
    lines: list[str] = []
    result = process.stream([sys.executable, "-c", "import sys\nfor i in range(3): print(i)\nsys.exit(2)"],
                            lines.append, check=False)
    assert lines == ["0", "1", "2"] and result.returncode == 2
    fed = process.feed([sys.executable, "-c", "import sys; print(len(sys.stdin.buffer.read()))"],
                       (b"x" * 1000 for _ in range(100)))
    assert fed.out.strip() == "100000"
