"""Regression evidence (probes/regression.py): upstream's own tests run without and with a patch, in the real probe
venv with pytest; a toy upstream in a real git repository for the counting, the real release history for 0003."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REAL_CACHE, git
from helpers.calcupstream import CALC, SHIPPED, patch_of, series_dir, toy_upstream

from vpatch import git as gitdoor
from vpatch.probes import Witness, regression, stacked_tree
from vpatch.probes.env import probe_venv
from vpatch.series.files import Patch, Series

pytestmark = pytest.mark.probe_venv


def evidence(repo: Path, patches: list[Patch], patch: Patch, *, base: str, ref: str, use_cache: bool = True,
             cache: Path = REAL_CACHE) -> regression.Regressions:
    """Upstream's tests of `patch` on `base` and on `base` + the series up to it, as `probe check` runs them."""
    patched = stacked_tree(repo, patches, base, patch, name=ref)
    return Witness(repo, cache=cache).regressions(patch, base=base, patched=patched, ref=ref, use_cache=use_cache)


def toy_with_tests(tmp_path: Path, more: str) -> tuple[Path, str, Path]:
    """The toy upstream with `more` appended to its test file and committed: the repository, that commit, and an
    empty series folder with the shipped probe lock."""
    repo, _ = toy_upstream(tmp_path)
    tests = repo / "tests" / "calc" / "test_calc.py"
    tests.write_text(tests.read_text() + more)
    git(repo, "commit", "-q", "-am", "more tests")
    return repo, git(repo, "rev-parse", "HEAD").strip(), series_dir(tmp_path)


def test_tests_for_finds_the_test_files_named_after_the_touched_files(tmp_path: Path) -> None:
    repo, base = toy_upstream(tmp_path)
    tree = gitdoor.tree_of(repo, base)
    assert regression.tests_for(repo, [tree], ["vllm/calc.py"]) == ("tests/calc/test_calc.py",)
    assert regression.tests_for(repo, [tree], ["vllm/other.py", "README.md"]) == ()


def test_runs_tests_says_whether_a_command_runs_upstream_s_tests_for_the_patch(tmp_path: Path) -> None:
    """`probe check` counts its runs ahead (whether a warm interpreter pays): upstream's tests on both sides only
    where the patch has test files to run and a venv to run them in."""
    repo, base = toy_upstream(tmp_path)
    patches = series_dir(tmp_path)
    calc = patch_of(repo, base, patches, 1, "add-comment", CALC.replace("def add", "# adds\ndef add"))
    patched = stacked_tree(repo, [calc], base, calc, name="v1.0")
    assert regression.runs_tests(repo, calc, base=base, patched=patched)
    (patches / "probes" / "requirements.lock").unlink()  # no venv to run them in
    assert not regression.runs_tests(repo, calc, base=base, patched=patched)
    assert regression.selection(repo, calc, base=base, patched=patched) == ("tests/calc/test_calc.py",)


def test_a_test_file_named_after_the_touched_file_runs_only_if_it_imports_it(tmp_path: Path) -> None:
    """Named after vllm/calc.py but testing something else (it imports vllm.calculus): not its evidence, and not
    run; one that imports the module by its package's import list is."""
    repo, _ = toy_upstream(tmp_path)
    for rel, text in (("tests/calc/other/test_calc.py", "from vllm.calculus import add\n\n\ndef test_add():\n"
                                                         "    assert add(1, 1) == 2\n"),
                      ("tests/calc/pkg/test_calc.py", "from vllm import (\n    os_helpers,\n    calc as c,\n)\n")):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "two more test files named after calc.py")
    tree = gitdoor.tree_of(repo, "HEAD")
    assert regression.tests_for(repo, [tree], ["vllm/calc.py"]) == ("tests/calc/pkg/test_calc.py",
                                                                    "tests/calc/test_calc.py")


def test_a_test_passing_without_and_failing_with_the_patch_is_a_regression(tmp_path: Path) -> None:
    repo, base = toy_upstream(tmp_path)
    patches = series_dir(tmp_path)
    broken = patch_of(repo, base, patches, 1, "sub-wrong", CALC.replace("return a - b", "return b - a"))
    found = evidence(repo, [broken], broken, base=base, ref="v1.0", use_cache=False)
    assert found.complete and found.tests == ("tests/calc/test_calc.py",)
    assert found.regressed == ("tests/calc/test_calc.py::test_sub",)
    # failing on both sides is upstream's, not the patch's
    assert found.upstreams == ("tests/calc/test_calc.py::test_known_broken_upstream",)
    assert found.passed == 2  # test_add and the class's test, whose node id keeps its class
    assert "tests/calc/test_calc.py::TestMore::test_add_zero" in found.base.outcomes()  # type: ignore[union-attr]
    assert "1 REGRESSION: tests/calc/test_calc.py::test_sub" in found.says()
    assert not found.base.cached and not found.patched.cached  # type: ignore[union-attr]

    # A harmless patch on the same base: no regression, and the unpatched tree's results come from the cache.
    harmless = patch_of(repo, base, patches, 2, "add-comment", CALC.replace("def add", "# adds\ndef add"))
    again = evidence(repo, [harmless], harmless, base=base, ref="v1.0")
    assert again.regressed == () and again.passed == 3 and "no regression" in again.says()
    assert again.base is not None and again.base.cached and again.patched is not None and not again.patched.cached


def test_a_cache_reached_through_a_symlink_still_leaves_out_the_root_conftest(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache folder linked to another disk: pytest compares --confcutdir with real paths, and the toy's root
    conftest (as vLLM's, it needs an accelerator) must still stay out."""
    link = tmp_path / "linked-cache"
    link.symlink_to(REAL_CACHE, target_is_directory=True)
    monkeypatch.setenv("VPATCH_CACHE", str(link))
    repo, base = toy_upstream(tmp_path)
    patches = series_dir(tmp_path)
    broken = patch_of(repo, base, patches, 1, "sub-wrong", CALC.replace("return a - b", "return b - a"))
    found = evidence(repo, [broken], broken, base=base, ref="v1.0", use_cache=False, cache=link)
    assert found.complete and found.regressed == ("tests/calc/test_calc.py::test_sub",), found.says()


def test_a_test_file_that_no_longer_imports_with_the_patch_is_a_regression_of_each_test(tmp_path: Path) -> None:
    repo, base = toy_upstream(tmp_path)
    patches = series_dir(tmp_path)
    renamed = patch_of(repo, base, patches, 1, "rename-sub", CALC.replace("def sub", "def subtract"))
    found = evidence(repo, [renamed], renamed, base=base, ref="v1.0", use_cache=False)
    # every test that passed is gone with the patch: absence is not a pass
    assert set(found.regressed) == {"tests/calc/test_calc.py::test_add", "tests/calc/test_calc.py::test_sub",
                                    "tests/calc/test_calc.py::TestMore::test_add_zero"}
    assert found.patched is not None and found.patched.outcomes() == {"tests/calc/test_calc.py": regression.ERROR}


def test_upstream_tests_declared_in_the_probe_replace_the_found_ones(tmp_path: Path) -> None:
    repo, base = toy_upstream(tmp_path)
    patches = series_dir(tmp_path)
    broken = patch_of(repo, base, patches, 1, "sub-wrong", CALC.replace("return a - b", "return b - a"))
    probe = patches / "probes" / "0001-sub-wrong.yaml"
    probe.write_text("kind: files\nfiles:\n  vllm/calc.py:\n    contains: ['b - a']\n"
                     "upstream_tests: ['tests/calc/test_calc.py::test_add']\n")
    path = broken.path
    path.write_text(path.read_text().replace("---\n", "\nProbe: probes/0001-sub-wrong.yaml\n---\n", 1))
    declared = Patch.load(path)
    found = evidence(repo, [declared], declared, base=base, ref="v1.0")
    assert found.tests == ("tests/calc/test_calc.py::test_add",)
    assert found.regressed == () and found.passed == 1
    probe.write_text("kind: files\nfiles:\n  vllm/calc.py:\n    contains: ['b - a']\nupstream_tests: []\n")
    assert evidence(repo, [declared], declared, base=base, ref="v1.0").says() == (
        "upstream tests: none found for the files it touches")


def declare_tests(patch: Patch, tests: list[str]) -> Patch:
    """`patch` with a files probe that declares `tests` as its upstream tests."""
    probe = patch.path.parent / "probes" / f"{patch.path.stem}.yaml"
    probe.parent.mkdir(exist_ok=True)
    touched = patch.paths[0]
    probe.write_text(f"kind: files\nfiles:\n  {touched}:\n    contains: ['vpatch']\nupstream_tests: {tests!r}\n")
    text = patch.path.read_text()
    if "\nProbe: " not in text:
        patch.path.write_text(text.replace("---\n", f"\nProbe: probes/{probe.name}\n---\n", 1))
    return Patch.load(patch.path)


def test_a_declared_node_id_that_names_no_test_is_an_error_of_the_probe(tmp_path: Path) -> None:
    repo, base = toy_upstream(tmp_path)
    patches = series_dir(tmp_path)
    broken = patch_of(repo, base, patches, 1, "sub-wrong", CALC.replace("return a - b", "return b - a"))
    typo = declare_tests(broken, ["tests/calc/test_calc.py::test_add", "tests/calc/test_calc.py::test_nope"])
    with pytest.raises(regression.RegressionError) as raised:
        evidence(repo, [typo], typo, base=base, ref="v1.0", use_cache=False)
    assert "upstream_tests: tests/calc/test_calc.py::test_nope: names no test on v1.0" in raised.value.message
    assert "--collect-only" in raised.value.hint
    gone = declare_tests(broken, ["tests/calc/test_gone.py"])
    with pytest.raises(regression.RegressionError, match=r"tests/calc/test_gone.py: no such file on v1.0"):
        evidence(repo, [gone], gone, base=base, ref="v1.0", use_cache=False)


OFFLINE_TESTS = ("\n\ndef test_downloads_a_model():\n"
                 "    import socket\n"
                 "    socket.getaddrinfo('huggingface.co', 443)\n"
                 "\n\ndef test_asks_the_hub_offline():\n"
                 "    import os\n"
                 "    assert os.environ['HF_HUB_OFFLINE'] == '1' and os.environ['TRANSFORMERS_OFFLINE'] == '1'\n"
                 "\n\ndef test_needs_a_gpu():\n"
                 "    raise AssertionError('Torch not compiled with CUDA enabled')\n"
                 "\n\ndef test_sleeps_past_the_deadline():\n"
                 "    import time\n"
                 "    time.sleep(600)\n"
                 "\n\ndef test_after_the_deadline():\n"
                 "    pass\n")


def test_tests_that_need_the_network_a_gpu_or_more_time_are_not_run_here_on_both_sides(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Upstream's tests run offline and bounded: a test that reaches for the network fails at once (no lookup, no
    retry), one that needs a GPU is named so, and a file past its deadline has its running test interrupted and its
    others not run; each is "not run here" on both sides, never a regression, and named in what the evidence says."""
    repo, base, patches = toy_with_tests(tmp_path, OFFLINE_TESTS)
    harmless = patch_of(repo, base, patches, 1, "add-comment", CALC.replace("def add", "# adds\ndef add"))
    monkeypatch.setattr(regression, "FILE_DEADLINE_S", 8.0)
    found = evidence(repo, [harmless], harmless, base=base, ref="v1.0", use_cache=False)
    assert found.complete and found.regressed == ()
    assert found.upstreams == ("tests/calc/test_calc.py::test_known_broken_upstream",)
    assert dict(found.not_run_here) == {
        "tests/calc/test_calc.py::test_downloads_a_model": "download",
        "tests/calc/test_calc.py::test_needs_a_gpu": "gpu",
        "tests/calc/test_calc.py::test_sleeps_past_the_deadline": "deadline",
        "tests/calc/test_calc.py::test_after_the_deadline": "deadline",
    }, found.says()
    assert found.base is not None and found.patched is not None
    assert found.base.outcomes()["tests/calc/test_calc.py::test_asks_the_hub_offline"] == regression.PASSED
    assert found.base.outcomes()["tests/calc/test_calc.py::test_needs_a_gpu"] == regression.NOT_RUN
    # each side ended at its file's deadline, not at the test's 600 s
    assert found.base.seconds < 60 and found.patched.seconds < 60, (found.base.seconds, found.patched.seconds)
    assert found.says().endswith(
        "; 4 not run here (need a download: tests/calc/test_calc.py::test_downloads_a_model; need a GPU: "
        "tests/calc/test_calc.py::test_needs_a_gpu; past their file's deadline: "
        "tests/calc/test_calc.py::test_after_the_deadline, tests/calc/test_calc.py::test_sleeps_past_the_deadline)"
    ), found.says()


def warm_tests_zygote(witness: Witness, patch: Patch) -> None:
    """Start the session's warm interpreter of the probe venv and wait for it, so that the runs after go through it
    (a command's first runs go fresh while it starts)."""
    requirements = regression.requirements_for(patch, None)
    assert requirements is not None and witness.session is not None
    python = probe_venv(requirements, cache=REAL_CACHE)
    assert witness.session.zygote_for(python, witness.report, wait=True) is not None


HOME_TEST = ("\n\ndef test_home_is_not_the_user_s():\n"
             "    import os\n"
             "    with open(os.environ['VPATCH_TEST_HOME_LOG'], 'a') as log:\n"
             "        log.write(os.environ['HOME'] + '\\n')\n")
# a probe of the same venv (the series' lock) that writes its HOME and whether the hub is offline, then fails
HOME_PROBE = ("import os\n"
              "with open(os.environ['VPATCH_TEST_HOME_LOG'], 'a') as log:\n"
              "    log.write(os.environ['HOME'] + ' ' + os.environ.get('HF_HUB_OFFLINE', '-') + '\\n')\n"
              "raise SystemExit(1)\n")


def test_probe_runs_and_upstream_tests_share_one_warm_interpreter_offline_with_a_home_of_the_command_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run in the probe venv, a probe's and upstream's tests', has one environment: HOME a folder of the
    command's workspace (no run writes into the user's home), the hub offline; so one warm interpreter serves both
    kinds (one learning, one list), and the folder is gone with the command. A fresh run is given the same
    environment (regression._pytest, runner._run_command)."""
    from vpatch.probes import runner
    from vpatch.probes.file import Probe

    repo, base, patches = toy_with_tests(tmp_path, HOME_TEST)
    broken = patch_of(repo, base, patches, 1, "sub-wrong", CALC.replace("return a - b", "return b - a"))
    (patches / "probes" / "home.py").write_text(HOME_PROBE)
    (patches / "probes" / "home.yaml").write_text(
        'kind: command\nrun: ["{python}", "{probe_dir}/home.py"]\nlock: requirements.lock\ntimeout: 60\n')
    probe = Probe.load(patches / "probes" / "home.yaml")
    log = tmp_path / "homes.log"
    monkeypatch.setenv("VPATCH_TEST_HOME_LOG", str(log))
    patched = stacked_tree(repo, [broken], base, broken, name="v1.0")
    with Witness(repo, cache=REAL_CACHE, zygote=True) as witness:
        warm_tests_zygote(witness, broken)
        found = witness.regressions(broken, base=base, patched=patched, ref="v1.0", use_cache=False)
        assert witness.session is not None
        # what the tests' runs taught it is imported before the probe comes (a run never waits for that: it would
        # go fresh, and this test counts the runs that went through it)
        assert all(z.settled(120) for z in witness.session.zygotes())
        ran = runner.run_probe(repo, probe, base, session=witness.session, use_cache=False)
        assert witness.session is not None
        zygotes = witness.session.zygotes()
    assert found.regressed == ("tests/calc/test_calc.py::test_sub",), found.says()
    assert ran.outcome is runner.ProbeOutcome.FAIL, ran
    lines = log.read_text().splitlines()
    assert len(lines) == 3, lines  # both sides of the tests, then the probe
    home = Path(lines[0])
    assert lines == [str(home), str(home), f"{home} 1"], lines  # one folder for all three; the probe offline
    assert home != Path.home() and home.name == "home" and home.parent.parent == REAL_CACHE / "probe-runs", home
    assert not home.exists()  # removed with the command's workspace
    # one interpreter for the venv, and all three runs went through it
    assert [(z.subject, z.runs) for z in zygotes] == [("probe zygote", 3)]


# --- the real release history: 0003 ------------------------------------------------------------------------------


def old_0003_on_v0_33_0(repo: Path, patches: Path) -> Patch:
    """Main's 0003 (with the transition (TOOL_ARGS, TOOL_START)) rebased by hand onto v0.33.0: upstream's four
    transitions kept, the fifth added, and the streamed name's strip, as a person resolving the conflict did."""
    qwen3 = gitdoor.read_blobs(repo, "v0.33.0", ["vllm/parser/qwen3.py"])["vllm/parser/qwen3.py"]
    engine = gitdoor.read_blobs(repo, "v0.33.0", ["vllm/parser/engine/parser_engine.py"])[
        "vllm/parser/engine/parser_engine.py"]
    assert qwen3 is not None and engine is not None
    anchor = (b'            (ParserState.TOOL_ARGS, "FUNC_PREFIX"): Transition(\n'
              b"                ParserState.TOOL_NAME,\n"
              b"                (EventType.TOOL_CALL_END, EventType.TOOL_CALL_START),\n"
              b"            ),\n")
    fifth = (b'            (ParserState.TOOL_ARGS, "TOOL_START"): Transition(\n'
             b"                ParserState.TOOL_PREAMBLE,\n"
             b"                (EventType.TOOL_CALL_END, EventType.TOOL_CALL_START),\n"
             b"            ),\n")
    assert qwen3.count(anchor) == 1
    strip = b'            name = slot.name or self._try_extract_name(idx) or ""\n'
    assert engine.count(strip) == 1
    work = patches.parent / "work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    for rel, text in (("vllm/parser/qwen3.py", qwen3), ("vllm/parser/engine/parser_engine.py", engine)):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_bytes(text)
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "v0.33.0's two files")
    (work / "vllm/parser/qwen3.py").write_bytes(qwen3.replace(anchor, anchor + fifth))
    (work / "vllm/parser/engine/parser_engine.py").write_bytes(engine.replace(strip, strip.replace(
        b"slot.name or", b"slot.name.strip() or")))
    git(work, "commit", "-q", "-am", "qwen3 parser: close a tool call whose <function= is left open")
    path = patches / "0003-qwen3-tool-call-unclosed-function.patch"
    path.write_text(git(work, "format-patch", "-1", "--stdout", "--full-index"))
    return Patch.load(path)


@pytest.mark.releases
def test_main_s_0003_rebased_onto_v0_33_0_breaks_the_two_upstream_tests_that_name_the_case(
        release_history: Path, tmp_path: Path) -> None:
    patches = series_dir(tmp_path)
    old = old_0003_on_v0_33_0(release_history, patches)
    base = gitdoor.resolve_commit(release_history, "v0.33.0")
    found = evidence(release_history, [old], old, base=base, ref="v0.33.0", cache=REAL_CACHE)
    assert found.tests == ("tests/parser/engine/test_parser_engine.py", "tests/parser/engine/test_qwen3.py")
    assert found.regressed == (
        "tests/parser/engine/test_qwen3.py::TestNonStreaming::test_tool_call_tag_is_ok_inside_parameter",
        "tests/parser/engine/test_qwen3.py::TestStreaming::test_streaming_tool_call_tag_is_ok_inside_parameter",
    ), found.says()
    assert found.passed > 150, found.says()


@pytest.mark.releases
def test_the_shipped_0003_breaks_no_upstream_test_on_the_pin(release_history: Path) -> None:
    series = Series.load(SHIPPED)
    patch = next(p for p in series.patches if p.number == 3)
    base = gitdoor.resolve_commit(release_history, "v0.29.0")
    found = evidence(release_history, list(series.patches), patch, base=base, ref="v0.29.0",
                                cache=REAL_CACHE)
    assert found.complete and found.regressed == () and found.passed > 150, found.says()


@pytest.mark.releases
def test_upstream_tests_in_the_warm_interpreter_give_each_test_the_outcome_a_fresh_process_gives(
        release_history: Path, tmp_path: Path) -> None:
    """Upstream's tests run as `python -m pytest` in a child of the session's warm interpreter (pytest, torch
    and transformers imported once; vllm and the tests from the tree in each run): every test's outcome on both
    sides is the one fresh processes give, on the case with two regressions (main's 0003 on v0.33.0)."""
    from vpatch.base import Event

    patches = series_dir(tmp_path)
    old = old_0003_on_v0_33_0(release_history, patches)
    base = gitdoor.resolve_commit(release_history, "v0.33.0")
    patched = stacked_tree(release_history, [old], base, old, name="v0.33.0")
    found: dict[bool, regression.Regressions] = {}
    runs: dict[bool, int] = {}
    events: list[Event] = []
    for warm in (False, True):
        with Witness(release_history, cache=REAL_CACHE, zygote=warm, report=events.append) as witness:
            if warm:
                warm_tests_zygote(witness, old)
            found[warm] = witness.regressions(old, base=base, patched=patched, ref="v0.33.0", use_cache=False)
            assert witness.session is not None
            runs[warm] = sum(z.runs for z in witness.session.zygotes() if z.subject == "probe zygote")
    fresh, warmed = found[False], found[True]
    assert fresh.base is not None and fresh.patched is not None and warmed.base is not None
    assert warmed.patched is not None
    assert warmed.base.results == fresh.base.results and warmed.patched.results == fresh.patched.results
    assert len(fresh.base.results) > 150 and len(warmed.regressed) == 2, warmed.says()
    # and pytest's last line as vpatch shows it says the same, its seconds aside: a fresh run counted 14 warnings
    # (torch.jit's, as transformers imports), which the warm interpreter gave before its runs began; it once said
    # "1 warning" of its own (pytest could not rewrite anyio's plugin, imported there for httpx): no count is shown
    said = {warm: [re.sub(r" in [0-9.]+s\b", "", run.detail) for run in (found[warm].base, found[warm].patched)
                   if run is not None] for warm in (False, True)}
    assert said[True] == said[False] and all("passed" in d for d in said[False]), said
    # both runs went through it (one pytest run per side: the two files share a folder), none fell back
    assert (runs[False], runs[True]) == (0, 2)
    # one interpreter for the session; "started again" where the recorded list did not hold and was learned anew
    # (a list learned from nothing does so once: docs/benchmarks.md, "Probe runs")
    started = [e.step for e in events if e.subject == "probe zygote" and e.step.startswith("started")]
    assert started in (["started"], ["started", "started again"]), started
    assert not [e for e in events if e.subject == "probe zygote" and "fresh" in e.step], events


CHAT_UTILS_TESTS = ["tests/entrypoints/unit_tests/test_chat_utils.py::test_parse_chat_messages_single_image",
                    "tests/entrypoints/unit_tests/test_chat_utils.py::test_parse_chat_messages_empty_system",
                    "tests/entrypoints/unit_tests/test_chat_utils.py::test_tool_call_arguments_dict_passthrough"]


@pytest.mark.releases
def test_upstream_tests_of_chat_utils_never_wait_on_the_network(release_history: Path, tmp_path: Path) -> None:
    """The case that took 32 minutes: a patch to vllm/entrypoints/chat_utils.py at the pin v0.29.0, whose upstream
    tests ask huggingface.co and S3 for models and images (`status --against v0.33.0` asked them on the pin: on
    v0.33.0 the file moved to vllm/renderers/chat_utils/). With the hub offline and the network blocked, the tests
    that need a download are not run here on both sides, named so, and no side waits: three of the file's node ids
    (`upstream_tests:`), so that the test stays short."""
    pin = gitdoor.resolve_commit(release_history, "v0.29.0")
    source = gitdoor.read_blobs(release_history, pin, ["vllm/entrypoints/chat_utils.py"])["vllm/entrypoints/chat_utils.py"]
    assert source is not None
    patches = series_dir(tmp_path)
    work = tmp_path / "work"
    (work / "vllm" / "entrypoints").mkdir(parents=True)
    git(work, "init", "-q", "-b", "main")
    (work / "vllm/entrypoints/chat_utils.py").write_bytes(source)
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "v0.29.0's chat_utils")
    (work / "vllm/entrypoints/chat_utils.py").write_bytes(b"# vpatch: a harmless line\n" + source)
    git(work, "commit", "-q", "-am", "chat_utils: a harmless line")
    path = patches / "0001-chat-utils-harmless.patch"
    path.write_text(git(work, "format-patch", "-1", "--stdout", "--full-index"))
    patch = declare_tests(Patch.load(path), CHAT_UTILS_TESTS)

    found = evidence(release_history, [patch], patch, base=pin, ref="v0.29.0", use_cache=False)

    assert found.complete and found.regressed == (), found.says()
    assert found.not_run_here == tuple((t, "download") for t in sorted(CHAT_UTILS_TESTS[:2])), found.says()
    assert found.passed == 1, found.says()
    assert found.base is not None and found.patched is not None
    # no side waited on the network: each ran its start, vllm's imports and three tests (minutes before)
    assert found.base.seconds < 90 and found.patched.seconds < 90, (found.base.seconds, found.patched.seconds)
    assert "not run here (need a download: " in found.says()
