"""A probe that passes on the pin is no evidence (issue 9, 3b): status flags it INVALID and counts it neither
way; update never drops on it; a patch landed on its own pin is a contradiction, not a drop."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import KV_V1, PARSER_V1, Project, git
from conftest import vpatch_cli as run
from conftest import vpatch_json as run_json
from helpers.project import commit_all

KV_FIX = KV_V1.replace("break", "continue")
PARSER_FIX = PARSER_V1.replace("line 20\n", "line 20 fixed\n")
VACUOUS = "kind: files\nfiles:\n  vllm/parser.py:\n    not_contains: [\"NEVER\"]\n"


def with_probe(project: Project, number: int, slug: str, files: dict[str, str | None], probe_yaml: str) -> None:
    (project.patches / "probes").mkdir(exist_ok=True)
    (project.patches / "probes" / f"{slug}.yaml").write_text(probe_yaml)
    project.make_patch(number, slug, files, f"Fix {slug}",
                       trailers=f"Origin: vendor\nProbe: probes/{slug}.yaml\nLast-Update: 2026-09-01")


def test_a_vacuous_probe_is_flagged_and_counted_neither_way(project: Project) -> None:
    with_probe(project, 1, "parser-fix", {"vllm/parser.py": PARSER_FIX}, VACUOUS)
    commit_all(project)
    project.upstream.commit({"README": "v1.1\n"}, "v1.1", tag="v1.1")
    assert run(project, "fetch")[0] == 0
    code, doc = run_json(project, "status", "--json", "--exit-code", "--against", "v1.1")
    (patch,) = doc["patches"]
    # without the rule it was "landed" on the pin itself and on v1.1; now the text decides: needed
    assert [patch["results"][t]["state"] for t in ("v1.0", "v1.1")] == ["needed", "needed"]
    probe = next(e for e in patch["results"]["v1.0"]["evidence"] if e["kind"] == "probe")
    assert probe["says"] == "unavailable" and "INVALID" in probe["detail"] and "it passes on v1.0 without the patch" in probe["detail"]
    assert patch["landed_in"] is None
    assert code == 4  # the probe needs a person
    code, out = run(project, "status", "--against", "v1.1")
    assert "its probe is INVALID" in out and "probe INVALID" in out


def test_update_never_drops_on_a_vacuous_probe(project: Project) -> None:
    """0001's fix lands verbatim in v1.1; 0002's vacuous probe 'passes' everywhere: 0001 could go, 0002 must stay."""
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_FIX}, "Skip null blocks")
    with_probe(project, 2, "parser-fix", {"vllm/parser.py": PARSER_FIX}, VACUOUS)
    head = commit_all(project)
    project.upstream.commit({"vllm/kv.py": KV_FIX}, "v1.1", tag="v1.1")
    assert run(project, "fetch")[0] == 0
    code, out = run(project, "update", "--to", "v1.1")
    assert code == 1
    assert "0002-parser-fix.patch" in out and "passes" in out
    assert git(project.root, "rev-parse", "HEAD").strip() == head
    assert (project.patches / "0002-parser-fix.patch").exists()
    # the dry run refuses it the same way (issue 22: it used to say "would re-apply" and exit 0), after the
    # table that shows the probe INVALID
    dry_code, dry = run(project, "update", "--to", "v1.1", "--dry-run")
    assert dry_code == 1 and "probe INVALID (passes on the pin)" in dry and "would re-apply" not in dry
    assert dry.split("error: ")[1] == out.split("error: ")[1]


def test_a_drop_whose_probe_does_not_validate_on_the_pin_is_refused(project: Project) -> None:
    """The text says landed (the diff reverse-applies on v1.1), but the patch's probe passes on the pin too:
    the re-validation of a dropped patch's probe on the old pin refuses the drop."""
    with_probe(project, 1, "kv-skip-null", {"vllm/kv.py": KV_FIX}, VACUOUS)
    head = commit_all(project)
    project.upstream.commit({"vllm/kv.py": KV_FIX}, "v1.1", tag="v1.1")
    assert run(project, "fetch")[0] == 0
    # one meaning of "validated on the pin" (the Witness's, as status says it): the probe is INVALID, the move refused
    refusal = "not moving the pin to v1.1: 0001-kv-skip-null.patch: its probe is INVALID: "
    # the dry run says what the real run does: it refuses the same drop, never "would drop"
    code, out = run(project, "update", "--to", "v1.1", "--dry-run")
    # no plan row says it (the probe's hint may: "... would drop a needed patch"): the row says it would refuse
    assert code == 1 and refusal in out and not any(line.strip().startswith("would drop") for line in out.splitlines())
    assert "would refuse   0001-kv-skip-null.patch" in out, out
    code, out = run(project, "update", "--to", "v1.1")
    assert code == 1
    assert refusal in out
    assert git(project.root, "rev-parse", "HEAD").strip() == head
    assert (project.patches / "0001-kv-skip-null.patch").exists()


def test_landed_on_its_own_pin_is_a_contradiction_not_a_drop(project: Project) -> None:
    # the patch is made on v1.0, but the project pins v1.0.1, which already has its content: it reverse-applies
    # on its own pin, so the series or the evidence is wrong
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_FIX}, "Skip null blocks")
    project.upstream.commit({"vllm/kv.py": KV_FIX}, "kv fixed", tag="v1.0.1")
    project.upstream.commit({"README": "v1.1\n"}, "v1.1", tag="v1.1")
    (project.root / "vpatch.yaml").write_text((project.root / "vpatch.yaml").read_text().replace("ref: v1.0", "ref: v1.0.1"))
    head = commit_all(project)
    assert run(project, "fetch")[0] == 0
    code, out = run(project, "update", "--to", "v1.1")
    assert code == 5, out
    assert "[contradiction]" in out and "landed on its own pin v1.0.1" in out
    assert git(project.root, "rev-parse", "HEAD").strip() == head
    assert (project.patches / "0001-kv-skip-null.patch").exists()
    assert run(project, "update", "--abort")[0] == 0


@pytest.mark.releases
def test_vacuous_0003_probe_on_the_real_history_is_flagged_and_keeps_0003(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                           release_history: Path) -> None:
    """The reproduction from issue 9: 0003's probe replaced by `not_contains: ["NEVER"]` and committed. It used to
    read as landed on the pin itself, and `update --to v0.31.0` dropped all three with Applied-Upstream v0.29.0."""
    from conftest import REAL_CACHE
    from helpers.shipped import committed_copy, shipped_files, vpatch

    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    files = shipped_files()
    files["patches/probes/0003-qwen3-tool-call-unclosed-function.yaml"] = VACUOUS.replace(
        "vllm/parser.py", "vllm/parser/qwen3.py").encode()
    root = committed_copy(tmp_path / "project", files)
    head = git(root, "rev-parse", "HEAD")
    code, out = vpatch(root, "status", "--against", "v0.31.0", "--exit-code")
    assert code == 4, out
    assert ("0003-qwen3-tool-call-unclosed-function.patch: its probe is INVALID: probe "
            "0003-qwen3-tool-call-unclosed-function.yaml does not discriminate for "
            "0003-qwen3-tool-call-unclosed-function.patch: it passes on v0.29.0 without the patch") in " ".join(out.split())
    assert "0003-qwen3-tool-call-unclosed-function.patch: not landed in any target" in out
    code, out = vpatch(root, "update", "--to", "v0.31.0")
    assert code == 1, out
    assert "0003-qwen3-tool-call-unclosed-function.patch" in out and "passes" in out and "without the patch" in out
    assert git(root, "rev-parse", "HEAD") == head  # nothing dropped, nothing retired
    assert sorted(p.name[:4] for p in (root / "patches").glob("*.patch")) == ["0001", "0002", "0003"]
