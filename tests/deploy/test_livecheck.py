"""Live checks without a server: the format (every bad file named with its key), judging recorded answers,
the Live-Check: trailer, RETIRED.md keeping it, and the shipped check of 0003."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import Project

from vpatch.base.errors import SeriesError
from vpatch.deploy.live import CaseOutcome, PatchOutcome, Planned, Role, observed_stream, observed_whole
from vpatch.deploy.livecheck import Api, LiveCheck, LiveCheckError, regex_for
from vpatch.deploy.livejudge import Observed, forced_token_problems, judge
from vpatch.series.files import Series
from vpatch.series.retired import RetiredPatch, retired_entries, with_entries

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "checks" / "live" / "0003-qwen3-tool-call-unclosed-function.yaml"
GOOD = {
    "serve": {"tool_call_parser": "qwen3_coder", "enable_auto_tool_choice": True},
    "defaults": {"stream": True, "max_tokens": 64, "messages": [{"role": "user", "content": "weather?"}],
                 "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]},
    "cases": [{"name": "one", "request": {"force_output": "<tool_call>\n<function=get_weather\n</tool_call>\nIt is sunny."},
               "expect": {"tool_calls": [{"name": "get_weather", "arguments": {}}], "content": "It is sunny."}}],
}


def parse(data: object) -> LiveCheck:
    return LiveCheck.parse(data, path=Path("checks/live/0009-x.yaml"), source="checks/live/0009-x.yaml")


def with_change(path: list[object], value: object) -> dict[str, object]:
    data = json.loads(json.dumps(GOOD))
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


def test_a_good_file_gives_typed_requests_with_the_defaults_merged() -> None:
    check = parse(GOOD)
    (case,) = check.cases
    assert case.request.stream and case.request.api is Api.CHAT and case.request.temperature == 0.0
    body = case.request.body("tiny")
    assert body["structured_outputs"] == {"regex": "<tool_call>\\n<function=get_weather\\n</tool_call>\\nIt is sunny\\."}
    assert body["model"] == "tiny" and body["tools"][0]["function"]["name"] == "get_weather"
    assert case.expect.content == "It is sunny."


@pytest.mark.parametrize(("path", "value", "says"), [
    (["cases"], [], "checks/live/0009-x.yaml: cases: must be a non-empty list"),
    (["cases", 0, "expect"], {}, "cases[0].expect: says nothing the answer must show"),
    (["cases", 0, "expect", "tool_calls", 0, "arguments"], "{}", "cases[0].expect.tool_calls[0].arguments: must be a mapping"),
    (["cases", 0, "expect", "colour"], "red", "cases[0].expect.colour: is not a known key"),
    (["cases", 0, "request", "temperature"], "hot", "cases[0].request.temperature: must be a number"),
    (["defaults", "max_tokens"], 0, "cases[0].request.max_tokens: must be a positive whole number"),
    (["defaults", "stream"], "yes", "cases[0].request.stream: must be true or false"),
    (["defaults", "messages"], [], "cases[0].request.messages: must be a non-empty list"),
    (["defaults", "messages", 0, "role"], "robot", "cases[0].request.messages[0].role: must be system, user"),
    (["defaults", "tools", 0, "type"], "code", "cases[0].request.tools[0].type: must be function"),
    (["cases", 0, "request", "structured_outputs"], {"regex": "a"}, "force_output: and structured_outputs both"),
    (["serve", "tool_call_parser"], 3, "serve.tool_call_parser: must be str"),
    (["serve", "gpus"], "all", "serve.gpus: is not a known key"),
    (["cases", 0, "name"], KeyError, "cases[0].name: is missing"),
    (["cases", 0, "request", "force_tokens"], ["<think>"], "cases[0].request.force_tokens: '<think>' does not"),
    (["cases", 0, "request", "force_tokens"], "<tool_call>", "cases[0].request.force_tokens: must be a list"),
])
def test_bad_files_name_the_file_and_the_key(path: list[object], value: object, says: str) -> None:
    with pytest.raises(LiveCheckError) as failed:
        parse(with_change(path, value))
    assert says in failed.value.message and failed.value.message.startswith("checks/live/0009-x.yaml: ")
    assert failed.value.hint and "live-checks" in failed.value.hint


def test_a_repeated_case_name_and_a_missing_or_broken_file_are_refused(tmp_path: Path) -> None:
    data = json.loads(json.dumps(GOOD))
    data["cases"].append(data["cases"][0])
    with pytest.raises(LiveCheckError, match=r"cases\[1\]\.name: repeats the case name 'one'"):
        parse(data)
    with pytest.raises(LiveCheckError, match="cannot read the live check"):
        LiveCheck.load(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("cases: [\n")
    with pytest.raises(LiveCheckError, match=r"broken\.yaml: not valid YAML"):
        LiveCheck.load(broken)


def test_regex_for_matches_exactly_the_text() -> None:
    import re

    text = "<tool_call>\n<function=f(x)>\n{a: [1.5]} | $ ^ * + ? \\ done."
    assert re.fullmatch(regex_for(text), text)
    assert not re.fullmatch(regex_for("a.b"), "axb")
    assert "\\\n" not in regex_for(text)  # no backslash before a literal line break (backends refuse it)


# Recorded from the real vLLM 0.32.0 CPU server, qwen3_coder parser, case 1 forced, unpatched image.
UNPATCHED_CASE_1 = [
    'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
    'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function",'
    '"function":{"name":"get_weather\\n</tool_call>\\nIt is sunny."}}]}}]}',
    'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}',
    'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}',
    "data: [DONE]",
]


def test_judge_names_every_difference_on_the_unpatched_answer() -> None:
    (case,) = parse(GOOD).cases
    seen = observed_stream(Api.CHAT, UNPATCHED_CASE_1)
    assert seen == Observed("", (("get_weather\n</tool_call>\nIt is sunny.", "{}"),), "tool_calls")
    assert judge(case.expect, seen) == [
        "tool call 1: name 'get_weather\\n</tool_call>\\nIt is sunny.', expected 'get_weather'",
        "content '', expected 'It is sunny.'"]
    fixed = Observed("\nIt is sunny.", (("get_weather", "{}"),), "tool_calls")
    assert judge(case.expect, fixed) == []


def test_judge_wants_strict_json_arguments_and_the_right_count() -> None:
    (case,) = parse(GOOD).cases
    assert "not strict JSON" in judge(case.expect, Observed("It is sunny.", (("get_weather", '{"t": NaN}'),), None))[0]
    assert "not JSON" in judge(case.expect, Observed("It is sunny.", (("get_weather", ""),), None))[0]
    two = Observed("It is sunny.", (("get_weather", "{}"), ("get_time", "{}")), None)
    assert judge(case.expect, two) == ["2 tool call(s) ('get_weather', 'get_time'), expected 1 ('get_weather')"]


def test_a_whole_answer_is_read_like_a_streamed_one() -> None:
    answer = {"choices": [{"message": {"content": "It is sunny.", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}, "finish_reason": "tool_calls"}]}
    assert observed_whole(Api.CHAT, answer) == Observed("It is sunny.", (("get_weather", '{"city": "Paris"}'),),
                                                        "tool_calls")
    with pytest.raises(ValueError, match="no choices"):
        observed_whole(Api.CHAT, {"error": "x"})


def test_a_dropped_patch_failing_its_check_is_a_false_drop() -> None:
    check = parse(GOOD)
    planned = Planned("0003-x", Role.DROPPED, "checks/live/0009-x.yaml", check, "Applied-Upstream: v0.33.0")
    outcome = PatchOutcome(planned, (CaseOutcome("one", ("content '', expected 'It is sunny.'",), None, 0.1),))
    result = outcome.as_check()
    assert outcome.false_drop and result.failed and result.name == "live 0003-x (dropped)"
    assert result.figure.startswith("FALSE DROP") and "was dropped as upstream (Applied-Upstream: v0.33.0)" in result.detail
    kept = PatchOutcome(Planned("0003-x", Role.KEPT, "f", check), outcome.cases)
    assert not kept.false_drop and kept.as_check().failed and "FALSE" not in kept.as_check().figure


def test_the_trailer_is_read_and_checked(tmp_path: Path) -> None:
    series = Series.load(REPO / "patches")
    patch = series.get("3")
    assert patch.live_check_path(REPO) == SHIPPED and SHIPPED.is_file()
    bad = patch.raw.replace(b"Live-Check: checks/live/", b"Live-Check: ../outside/")
    (tmp_path / patch.filename).write_bytes(bad)
    with pytest.raises(SeriesError, match=r"Live-Check: '\.\./outside/.*' is not a \.yaml file inside the project"):
        Series.load(tmp_path).get("3").live_check_path(tmp_path)


def test_retired_md_keeps_the_live_check(tmp_path: Path) -> None:
    entry = RetiredPatch(3, "qwen3-tool", "subject", "v0.33.0", ("probe: passes",), "update v0.32.0 -> v0.33.0",
                         "abc:patches/0003-qwen3-tool.patch", live_check="checks/live/0003-qwen3-tool.yaml")
    plain = RetiredPatch(2, "mamba", "subject", "v0.30.0", (), "update v0.29.0 -> v0.30.0", "abc:p")
    (tmp_path / "RETIRED.md").write_bytes(with_entries(None, [plain, entry]))
    found = retired_entries(tmp_path)
    assert found[3].live_check == "checks/live/0003-qwen3-tool.yaml" and found[3].applied_upstream == "v0.33.0"
    assert found[3].retired_by == "update v0.32.0 -> v0.33.0"
    assert found[2].live_check is None


def test_the_shipped_check_of_0003_holds_the_probe_cases_and_the_issue_s_two() -> None:
    check = LiveCheck.load(SHIPPED)
    assert check.serve == {"tool_call_parser": "qwen3_coder", "enable_auto_tool_choice": True}
    by_output = {c.request.structured_outputs["regex"]: c for c in check.cases
                 if c.request.structured_outputs and c.request.stream}
    case1 = by_output[regex_for("<tool_call>\n<function=get_weather\n</tool_call>\nIt is sunny.")]
    assert [(c.name, dict(c.arguments)) for c in case1.expect.tool_calls or ()] == [("get_weather", {})]
    assert case1.expect.content == "It is sunny." and case1.request.stream
    control = by_output[regex_for("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                                  "</function>\n</tool_call>\nIt is sunny.")]
    assert [(c.name, dict(c.arguments)) for c in control.expect.tool_calls or ()] == [("get_weather", {"city": "Paris"})]
    # the control, the probe's five malformed outputs, case 1 not streamed, and the well-formed call with a
    # literal <tool_call> in its parameter value, streamed and not
    assert len(check.cases) == 9
    literal = by_output[regex_for("<tool_call>\n<function=write_file>\n<parameter=content>\nDocument <tool_call> "
                                  "usage\n</parameter>\n</function>\n</tool_call>\nWritten.")]
    assert [(c.name, dict(c.arguments)) for c in literal.expect.tool_calls or ()] == [
        ("write_file", {"content": "Document <tool_call> usage"})]
    assert yaml.safe_load(SHIPPED.read_text())["defaults"]["temperature"] == 0


def test_update_dropping_a_patch_keeps_its_live_check_in_retired_md_and_the_file(project: Project) -> None:
    from conftest import KV_V1, git
    from conftest import vpatch_cli as run

    fixed = KV_V1.replace("break", "continue")
    trailers = "Origin: vendor\nLive-Check: checks/live/0001-kv-skip-null.yaml\nLast-Update: 2026-09-01"
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": fixed}, "Skip null blocks", trailers=trailers)
    check = project.root / "checks" / "live" / "0001-kv-skip-null.yaml"
    check.parent.mkdir(parents=True)
    check.write_text(yaml.safe_dump(GOOD))
    git(project.root, "init", "-q", "-b", "main")
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "project")
    project.upstream.commit({"vllm/kv.py": fixed}, "v1.1", tag="v1.1")
    assert run(project, "fetch")[0] == 0
    code, out = run(project, "update", "--to", "v1.1")
    assert code == 0 and "drop" in out, out
    assert not (project.patches / "0001-kv-skip-null.patch").exists()
    assert retired_entries(project.patches)[1].live_check == "checks/live/0001-kv-skip-null.yaml"
    assert "- Live-Check: checks/live/0001-kv-skip-null.yaml" in (project.patches / "RETIRED.md").read_text()
    assert check.is_file() and "checks/live/0001-kv-skip-null.yaml" in git(project.root, "ls-files")


def test_update_refuses_a_drop_whose_live_check_names_no_file(project: Project) -> None:
    """Caught when the pin moves, not at the next deploy: the dry run and the real run refuse, nothing changes."""
    from conftest import KV_V1, git
    from conftest import vpatch_cli as run

    fixed = KV_V1.replace("break", "continue")
    trailers = "Origin: vendor\nLive-Check: checks/live/0001-kv-skip-null.yaml\nLast-Update: 2026-09-01"
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": fixed}, "Skip null blocks", trailers=trailers)
    git(project.root, "init", "-q", "-b", "main")
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "project")
    project.upstream.commit({"vllm/kv.py": fixed}, "v1.1", tag="v1.1")
    assert run(project, "fetch")[0] == 0
    before = {p.name: p.read_bytes() for p in project.root.rglob("*") if p.is_file() and ".git" not in p.parts}
    for args in (("--dry-run",), ()):
        code, out = run(project, "update", "--to", "v1.1", *args)
        assert code != 0, out
        assert "not moving the pin to v1.1: 0001-kv-skip-null.patch: its Live-Check: checks/live/0001-kv-skip-null.yaml " \
               "names no file in the project" in out and "hint: a deploy runs that check" in out and "add the file" in out, out
        assert "Traceback" not in out
    after = {p.name: p.read_bytes() for p in project.root.rglob("*") if p.is_file() and ".git" not in p.parts}
    assert after == before  # the patch, vpatch.yaml's pin and RETIRED.md (none) as they were
    assert git(project.root, "status", "--porcelain") == ""


def test_the_deploy_report_shows_each_case_beside_the_baseline_and_the_alarm() -> None:
    from vpatch.deploy.judge import Figures
    from vpatch.deploy.live import LivePlan, LiveReport
    from vpatch.deploy.switch import DeployDecision, Outcome, Report
    from vpatch.report import deploy as deploy_report

    check = parse(GOOD)
    planned = Planned("0003-x", Role.DROPPED, "checks/live/0009-x.yaml", check, "Applied-Upstream: v0.33.0")
    seen = observed_stream(Api.CHAT, UNPATCHED_CASE_1)
    bad = PatchOutcome(planned, (CaseOutcome("one", tuple(judge(check.cases[0].expect, seen)), seen, 0.2),))
    good = PatchOutcome(planned, (CaseOutcome("one", (), Observed("It is sunny.", (("get_weather", "{}"),), "tool_calls"),
                                              0.1),))
    live = LiveReport(LivePlan((planned,), ("the baseline x carries no vpatch labels",), None), (bad,), (good,))
    report = Report(definition="d", container="c", image="i", decision=DeployDecision.ROLLED_BACK,
                    candidate=Outcome((bad.as_check(),), Figures()), baseline=Outcome((good.as_check(),), Figures()),
                    steps=(), parked_as=None, candidate_kept_as="c-candidate", rollback="restored", live=live)
    (row,) = deploy_report.live_rows(report.live)
    assert row[:4] == ("0003-x (dropped)", "one", "pass", "fail") and "expected 'get_weather'" in row[4]
    (check_row,) = deploy_report.check_rows(report)
    assert check_row[:3] == ("live 0003-x (dropped)", "pass", "fail") and "FALSE DROP" in check_row[3]
    data = deploy_report.to_json(report)
    assert data["failed_check"] == "live 0003-x (dropped)" and data["alarms"][0].startswith("false-drop alarm: 0003-x")
    case = data["live"]["candidate"][0]["cases"][0]
    assert case["seen"]["tool_calls"] == [{"name": "get_weather\n</tool_call>\nIt is sunny.", "arguments": "{}"}]
    assert data["live"]["baseline"][0]["ok"] and data["live"]["notes"] == ["the baseline x carries no vpatch labels"]


# LiveCase 5 of the shipped check (a function body left open before the next <tool_call>) through the real vLLM 0.32.0
# CPU server with 0003, streamed, one token id per chunk. Under the regex alone the test model spelled the last
# </tool_call> as six text tokens (30, 17, 432, 65, 567, 32: '<', '/', 'tool', '_', 'call', '>'), and the content
# 'Done.' was lost; with force_tokens' logit bias it wrote the tag as its token 4088, and the content came.
CASE_5 = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<tool_call>\n"
          "<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>\nDone.")
_CASE_5_HEAD = [4087, 201, 30, 2204, 364, 31, 317, 86, 65, 1069, 756, 71, 84, 32, 201, 30, 82, 278, 447, 667, 31, 69,
                770, 32, 201, 504, 445, 201, 30, 17, 82, 278, 447, 667, 32, 201, 4087, 201, 30, 2204, 364, 31, 317, 86,
                65, 791, 32, 201, 30, 82, 278, 447, 667, 31, 92, 297, 32, 201, 55, 54, 37, 201, 30, 17, 3166, 269, 32,
                201, 30, 17, 72, 87, 503, 364, 32, 201]
CASE_5_TEXT_TAG = [*_CASE_5_HEAD, 30, 17, 432, 65, 567, 32, 201, 2035, 16, 2]
CASE_5_TOKEN_TAG = [*_CASE_5_HEAD, 4088, 201, 38, 263, 71, 16, 2]
TAG_IDS = {"<tool_call>": 4087, "</tool_call>": 4088}


def case_5(**request: object) -> LiveCheck:
    data = json.loads(json.dumps(GOOD))
    data["cases"][0]["request"] = {"force_output": CASE_5, **request}
    data["cases"][0]["expect"] = {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}},
                                                 {"name": "get_time", "arguments": {"zone": "UTC"}}], "content": "Done."}
    return parse(data)


def sse(ids: list[int], content: dict[int, str]) -> list[str]:
    """A streamed answer of one token id per chunk, with return_token_ids; `content` by chunk index."""
    lines = []
    for n, token in enumerate(ids):
        delta = {"content": content[n]} if n in content else {}
        finish = ', "finish_reason": "tool_calls"' if n == len(ids) - 1 else ""
        lines.append(f'data: {{"choices": [{{"index": 0, "delta": {json.dumps(delta)}, "token_ids": [{token}]{finish}}}]}}')
    return [*lines, "data: [DONE]"]


def test_force_tokens_bias_the_model_to_the_tags_and_ask_for_the_token_ids() -> None:
    (case,) = case_5(force_tokens=["<tool_call>", "</tool_call>"]).cases
    body = case.request.body("tiny", TAG_IDS)
    assert body["logit_bias"] == {"4087": 100, "4088": 100} and body["return_token_ids"] is True
    assert body["structured_outputs"] == {"regex": regex_for(CASE_5)}  # the text stays forced exactly
    (plain,) = case_5().cases
    assert "logit_bias" not in plain.request.body("tiny") and "return_token_ids" not in plain.request.body("tiny")
    with pytest.raises(LiveCheckError, match=r"force_tokens: needs force_output"):
        data = json.loads(json.dumps(GOOD))
        data["cases"][0]["request"] = {"structured_outputs": {"regex": "a"}, "force_tokens": ["a"]}
        parse(data)
    with pytest.raises(LiveCheckError, match=r"extra.logit_bias: has a key of its own"):
        case_5(force_tokens=["<tool_call>"], extra={"logit_bias": {"1": 5}})


def test_a_case_whose_model_spelled_a_tag_in_text_pieces_did_not_test_its_path() -> None:
    (case,) = case_5(force_tokens=["<tool_call>", "</tool_call>"]).cases
    text_tag = observed_stream(Api.CHAT, sse(CASE_5_TEXT_TAG, {}))
    assert text_tag.token_ids == tuple(CASE_5_TEXT_TAG)
    assert forced_token_problems(case.request, TAG_IDS, text_tag) == [
        "the model spelled '</tool_call>' as its token 4088 0 time(s), not 1: the output did not take the path "
        "the case tests"]
    token_tag = observed_stream(Api.CHAT, sse(CASE_5_TOKEN_TAG, {len(CASE_5_TOKEN_TAG) - 3: "Done."}))
    assert forced_token_problems(case.request, TAG_IDS, token_tag) == []
    assert token_tag.content == "Done." and judge(case.expect, token_tag) == ["0 tool call(s) (none), expected 2 "
                                                                             "('get_weather', 'get_time')"]
    no_ids = Observed("Done.", (), "tool_calls")
    assert "carries no token ids" in forced_token_problems(case.request, TAG_IDS, no_ids)[0]
    whole = observed_whole(Api.CHAT, {"choices": [{"message": {"content": ""}, "token_ids": CASE_5_TOKEN_TAG}]})
    assert forced_token_problems(case.request, TAG_IDS, whole) == []


def test_the_shipped_check_forces_both_tags_as_tokens_in_every_case() -> None:
    check = LiveCheck.load(SHIPPED)
    assert {c.request.force_tokens for c in check.cases} == {("<tool_call>", "</tool_call>")}
