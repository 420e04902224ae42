"""The rules every behavioural probe follows (README, "Patch files and probes"), each shown firing on a real
release tree altered to trigger it: an API that does not take what the probe needs, and a scenario that
does not reach the bug's code path, are errors (exit 2), never a pass."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REAL_CACHE

from vpatch import git
from vpatch.probes import file as probe_file
from vpatch.probes import runner as probes
from vpatch.probes.runner import ProbeOutcome
from vpatch.series.files import Series

pytestmark = pytest.mark.releases

PATCHES = Path(__file__).resolve().parents[2] / "patches"


def probe(name: str) -> probe_file.Probe:
    found = probe_file.probe_for(next(p for p in Series.load(PATCHES) if p.name == name))
    assert found is not None
    return found


def altered(history: Path, tmp_path: Path, tag: str, path: str, *edits: tuple[str, str]) -> tuple[Path, str]:
    """A tree id: `tag` of the real release history with each (old, new) edit made once in `path`. Written to
    a scratch repository that borrows the history's objects."""
    repo = tmp_path / "altered.git"
    if not repo.exists():
        git.init_bare(repo)
        (repo / "objects" / "info" / "alternates").write_text(str(history / "objects") + "\n")
    blob = git.read_blobs(history, tag, [path])[path]
    assert blob is not None
    text = blob.decode()
    for old, new in edits:
        assert text.count(old) == 1, f"{tag}:{path} no longer holds the text to alter: {old!r}"
        text = text.replace(old, new)
    commit = git.resolve_commit(history, tag)
    assert commit is not None
    return repo, git.tree_with(repo, commit, {path: text.encode()}, [])


def run(repo: Path, name: str, tree: str) -> probes.ProbeResult:
    return probes.run_probe(repo, probe(name), tree, cache=REAL_CACHE)


def test_0002_errors_when_the_manager_rejects_an_argument(release_history: Path, tmp_path: Path) -> None:
    # v0.30.0 has the fix; here its prefix caching switch is renamed (default unchanged, the body still reads
    # the old name). The probe used to drop an argument the tree did not accept and run on: another scenario,
    # which passed. Now it cannot decide.
    repo, tree = altered(release_history, tmp_path, "v0.30.0", "vllm/v1/core/kv_cache_manager.py",
                         ("        enable_caching: bool = True,\n        use_eagle",
                          "        enable_prefix_caching: bool = True,\n        use_eagle"),
                         ("        enable_mamba_fine_grained_prefix_cache: bool = False,\n    ) -> None:\n",
                          ("        enable_mamba_fine_grained_prefix_cache: bool = False,\n    ) -> None:\n"
                           "        enable_caching = enable_prefix_caching\n")))
    result = run(repo, "0002-mamba-null-gap-free", tree)
    assert result.outcome is ProbeOutcome.ERROR, result.detail
    assert "KVCacheManager does not accept enable_caching" in result.detail


def test_0002_errors_when_too_few_prefill_steps_were_in_flight(release_history: Path, tmp_path: Path) -> None:
    # v0.29.0 has the bug; here its requests cut the prompt to 4,096 tokens, so prefill is over in 3 steps and
    # the group never grows past the bound. The probe used to PASS this buggy tree; now it cannot decide.
    call = ("        self.num_prompt_tokens = length_from_prompt_token_ids_or_embeds(\n"
            "            prompt_token_ids, prompt_embeds\n        )\n")
    repo, tree = altered(release_history, tmp_path, "v0.29.0", "vllm/v1/request.py",
                         (call, call + "        self.num_prompt_tokens = min(self.num_prompt_tokens, 4096)\n"))
    result = run(repo, "0002-mamba-null-gap-free", tree)
    assert result.outcome is ProbeOutcome.ERROR, result.detail
    assert "only 2 prefill steps were scheduled with one in flight (at least 8 needed)" in result.detail
    assert "max held" not in result.detail  # it never got as far as a verdict


def test_0003_errors_when_the_servers_parse_delta_rejects_an_argument(release_history: Path, tmp_path: Path) -> None:
    # The probe calls DelegatingParser.parse_delta as chat_completion/serving.py does; here its `finished`
    # keyword is renamed, so the probe could not say the stream ended: it cannot decide.
    call = ("        *,\n        finished: bool,\n    ) -> DeltaMessage | None:\n"
            "        self._initialize_history_tool_call_cnt(request)\n        state = self._stream_state\n")
    repo, tree = altered(release_history, tmp_path, "v0.33.0", "vllm/parser/abstract_parser.py",
                         (call, call.replace("finished: bool", "is_last: bool") + "        finished = is_last\n"))
    result = run(repo, "0003-qwen3-tool-call-unclosed-function", tree)
    assert result.outcome is ProbeOutcome.ERROR, result.detail
    assert "the server's parser (DelegatingParser).parse_delta does not accept finished" in result.detail


def test_0003_errors_when_qwen3_coder_is_another_parser(release_history: Path, tmp_path: Path) -> None:
    # The probe builds the Qwen3 engine's adapter because that is what --tool-call-parser qwen3_coder serves;
    # a tree that serves another class there is not the path the probe drives.
    repo, tree = altered(release_history, tmp_path, "v0.33.0", "vllm/tool_parsers/__init__.py",
                         ('    "qwen3_coder": (\n        "qwen3_engine_tool_parser",\n        "Qwen3EngineToolParser",\n',
                          '    "qwen3_coder": (\n        "hermes_tool_parser",\n        "Hermes2ProToolParser",\n'))
    result = run(repo, "0003-qwen3-tool-call-unclosed-function", tree)
    assert result.outcome is ProbeOutcome.ERROR, result.detail
    assert ("cannot decide: qwen3_coder is registered as [('hermes_tool_parser', 'Hermes2ProToolParser')]"
            in result.detail)


def test_0003_errors_when_the_tool_call_tag_is_not_one_token(release_history: Path, tmp_path: Path) -> None:
    # The server gets <tool_call> as one vocabulary token and the engine takes it by id, not from the text.
    # A tree whose tag the probe's Qwen-style tokenizer splits into pieces would send the probe down the
    # text path instead: it cannot decide.
    repo, tree = altered(release_history, tmp_path, "v0.33.0", "vllm/parser/qwen3.py",
                         ('TOOL_CALL_START = "<tool_call>"', 'TOOL_CALL_START = "<tool_call_begin>"'))
    result = run(repo, "0003-qwen3-tool-call-unclosed-function", tree)
    assert result.outcome is ProbeOutcome.ERROR, result.detail
    assert "the tokenizer does not give the tree's tag '<tool_call_begin>' as one token id" in result.detail


def test_0003_errors_when_the_control_tool_call_is_not_parsed(release_history: Path, tmp_path: Path) -> None:
    # v0.33.0 streams the well-formed call right; here its parameter tags are others (the way a parser for
    # another model format would read), so even the well-formed call loses its argument: the malformed cases
    # say nothing.
    repo, tree = altered(release_history, tmp_path, "v0.33.0", "vllm/parser/qwen3.py",
                         ('PARAM_START = "<parameter="', 'PARAM_START = "<arg="'),
                         ('    r"<\\s*parameter\\s*=\\s*([^>]*)>"', '    r"<\\s*arg\\s*=\\s*([^>]*)>"'))
    result = run(repo, "0003-qwen3-tool-call-unclosed-function", tree)
    assert result.outcome is ProbeOutcome.ERROR, result.detail
    assert "the well-formed control stream was mishandled" in result.detail
