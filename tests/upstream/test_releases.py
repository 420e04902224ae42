"""The release history built from sdists: deterministic, incremental, and all-or-nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from conftest import REAL_CACHE, RELEASE_VERSIONS, git
from helpers.sdists import BASE_TIME, DAY, FakePyPI, fake_sdist, tag_table

from vpatch.base.errors import UpstreamError
from vpatch.base.progress import Event
from vpatch.upstream import releases, sdists
from vpatch.upstream.releases import ReleaseState


def build(cache: Path, versions: list[str], pypi: FakePyPI | None = None) -> list[releases.Release]:
    return releases.build_history(versions, cache=cache, downloader=pypi or FakePyPI())


def refs(cache: Path) -> str:
    return git(releases.history_path(cache), "for-each-ref")


def test_two_builds_in_separate_caches_give_identical_commits(tmp_path: Path) -> None:
    first = build(tmp_path / "a", ["1.1.0", "1.0.0", "1.2.0"])
    # The other machine grows its history in a different order: the SHAs must still agree.
    build(tmp_path / "b", ["1.2.0"])
    build(tmp_path / "b", ["1.0.0", "1.1.0"])

    assert [r.tag for r in first] == ["v1.0.0", "v1.1.0", "v1.2.0"]
    assert tag_table(tmp_path / "a") == tag_table(tmp_path / "b")
    assert refs(tmp_path / "a") == refs(tmp_path / "b")


def test_history_is_one_chain_in_version_order(tmp_path: Path) -> None:
    build(tmp_path, ["1.10.0", "1.2.0", "1.9.0"])
    repo = releases.history_path(tmp_path)

    log = git(repo, "log", "--format=%s", "releases").splitlines()
    assert log == [f"vllm {v} (from PyPI sdist vllm-{v}.tar.gz)" for v in ("1.10.0", "1.9.0", "1.2.0")]
    assert git(repo, "rev-list", "--max-parents=0", "releases").strip() == tag_table(tmp_path)["v1.2.0"]


def test_adding_a_newer_release_keeps_the_old_commits_and_downloads_only_it(tmp_path: Path) -> None:
    before = {r.tag: r.commit for r in build(tmp_path, ["1.0.0", "1.1.0"])}
    pypi = FakePyPI()

    after = build(tmp_path, ["1.2.0"], pypi)

    assert pypi.asked == ["1.2.0"]
    assert [(r.tag, r.state) for r in after] == [
        ("v1.0.0", ReleaseState.PRESENT), ("v1.1.0", ReleaseState.PRESENT), ("v1.2.0", ReleaseState.ADDED),
    ]
    assert {r.tag: r.commit for r in after if r.state is ReleaseState.PRESENT} == before
    assert git(releases.history_path(tmp_path), "rev-parse", "v1.2.0^").strip() == before["v1.1.0"]


def test_a_second_run_downloads_nothing_and_changes_nothing(tmp_path: Path) -> None:
    build(tmp_path, ["1.0.0", "1.1.0"])
    before = refs(tmp_path)
    pypi = FakePyPI()

    again = build(tmp_path, ["1.0.0", "1.1.0"], pypi)

    assert pypi.asked == []
    assert all(r.state is ReleaseState.PRESENT for r in again)
    assert refs(tmp_path) == before


def test_inserting_an_older_release_rebuilds_the_chain_above_it(tmp_path: Path) -> None:
    old = {r.tag: r for r in build(tmp_path, ["1.1.0", "1.2.0"])}

    new = {r.tag: r for r in build(tmp_path, ["1.0.0"])}

    assert [new[t].state for t in ("v1.0.0", "v1.1.0", "v1.2.0")] == [ReleaseState.ADDED, ReleaseState.REWRITTEN, ReleaseState.REWRITTEN]
    assert all(new[t].tree == old[t].tree and new[t].date == old[t].date for t in old)
    build(tmp_path / "fresh", ["1.0.0", "1.1.0", "1.2.0"])
    assert tag_table(tmp_path) == tag_table(tmp_path / "fresh")


def test_sdists_are_cached_and_reused(tmp_path: Path) -> None:
    build(tmp_path, ["1.0.0"])
    cached = sdists.sdist_dir(tmp_path) / "vllm-1.0.0.tar.gz"
    assert cached.read_bytes() == fake_sdist("1.0.0")

    pypi = FakePyPI()
    releases.build_history(["1.0.0"], cache=tmp_path / "other", downloader=pypi)
    sdists.copy_sdists(tmp_path, tmp_path / "third", ["1.0.0"])
    releases.build_history(["1.0.0"], cache=tmp_path / "third", downloader=pypi)
    assert pypi.asked == ["1.0.0"]


def test_a_failed_download_leaves_the_history_as_it_was(tmp_path: Path) -> None:
    build(tmp_path, ["1.0.0"])
    before = refs(tmp_path)
    pypi = FakePyPI(fail={"1.2.0", "1.3.0"})

    with pytest.raises(UpstreamError) as raised:
        build(tmp_path, ["1.1.0", "1.2.0", "1.3.0"], pypi)

    assert "1.2.0" in raised.value.message and "1.3.0" in raised.value.message  # every failure, at once
    assert "unchanged" in raised.value.message
    assert refs(tmp_path) == before
    # What did download stays cached; no partial file is left behind.
    assert sorted(p.name for p in sdists.sdist_dir(tmp_path).iterdir()) == ["vllm-1.0.0.tar.gz", "vllm-1.1.0.tar.gz"]


def test_a_failed_first_download_creates_no_history(tmp_path: Path) -> None:
    with pytest.raises(UpstreamError):
        build(tmp_path, ["1.0.0"], FakePyPI(fail={"1.0.0"}))
    assert not releases.history_path(tmp_path).exists()
    assert releases.list_releases(tmp_path) == []


def test_an_unreadable_sdist_stops_the_build_before_any_ref_moves(tmp_path: Path) -> None:
    build(tmp_path, ["1.0.0"])
    before = refs(tmp_path)

    with pytest.raises(UpstreamError, match="cannot read"):
        build(tmp_path, ["1.1.0", "1.2.0"], FakePyPI(corrupt={"1.2.0"}))

    assert refs(tmp_path) == before


def test_generated_files_are_left_out_and_sources_kept(tmp_path: Path) -> None:
    build(tmp_path, ["1.0.0"])
    repo = releases.history_path(tmp_path)

    files = git(repo, "ls-tree", "-r", "--name-only", "v1.0.0").splitlines()

    assert files == sorted([
        "README.md", "docs/latest.md", "setup.py", "tools/run.sh", "vllm/__init__.py", "vllm/_version.py",
    ])


def test_file_modes_follow_the_sdist(tmp_path: Path) -> None:
    build(tmp_path, ["1.0.0"])
    repo = releases.history_path(tmp_path)

    modes = {line.split("\t")[1]: line.split()[0] for line in git(repo, "ls-tree", "-r", "v1.0.0").splitlines()}

    assert modes["tools/run.sh"] == "100755"
    assert modes["docs/latest.md"] == "120000"
    assert git(repo, "cat-file", "blob", "v1.0.0:docs/latest.md") == "../README.md"
    assert modes["README.md"] == modes["setup.py"] == "100644"


def test_commit_records_the_sdist_its_date_and_a_fixed_identity(tmp_path: Path) -> None:
    (release,) = build(tmp_path, ["1.3.0"])
    repo = releases.history_path(tmp_path)
    sha256 = hashlib.sha256(fake_sdist("1.3.0")).hexdigest()

    fields = git(repo, "log", "-1", "--format=%an <%ae>%n%cn <%ce>%n%at %ct", "v1.3.0").splitlines()
    message = git(repo, "log", "-1", "--format=%B", "v1.3.0")

    assert fields[:2] == [releases.IDENTITY] * 2
    newest = BASE_TIME + 3 * DAY - 600 + 8
    assert fields[2] == f"{newest} {newest}" and release.date == newest
    assert f"Sdist-SHA256: {sha256}" in message
    assert "Upstream-Commit: 0000003abc" in message


def test_progress_reports_each_download_and_build(tmp_path: Path) -> None:
    seen: list[tuple[str, str, bool]] = []

    def report(e: Event) -> None:
        seen.append((e.subject, e.step, e.final))

    releases.build_history(["1.0.0"], cache=tmp_path, downloader=FakePyPI(), report=report)
    releases.build_history(["1.1.0"], cache=tmp_path, downloader=FakePyPI(), report=report)

    assert [s for s in seen if s[0] == "vllm 1.0.0"] == [
        ("vllm 1.0.0", "downloading", False), ("vllm 1.0.0", "downloading", False),
        ("vllm 1.0.0", "downloaded", True), ("vllm 1.0.0", "building", False), ("vllm 1.0.0", "committed", True),
    ]
    assert ("vllm 1.1.0", "committed", True) in seen


def test_versions_are_normalised_and_ranges_skip_prereleases() -> None:
    offered = ["0.33.0", "0.33.0rc1", "0.32.0", "0.10.1.1", "0.9.2", "0.8.5.post1", "0.30.0", "junk"]

    assert releases.select_versions(offered, first="v0.30", last="0.33.0") == ["0.30.0", "0.32.0", "0.33.0"]
    assert releases.select_versions(offered, first="0.30.0", pre=True)[-2:] == ["0.33.0rc1", "0.33.0"]
    assert releases.select_versions(offered, last="0.10.1.1") == ["0.8.5.post1", "0.9.2", "0.10.1.1"]
    assert releases.normalize("v0.30.0") == "0.30.0"
    with pytest.raises(UpstreamError, match="not a release version"):
        releases.normalize("latest")


# --- the real vLLM releases -----------------------------------------------------------

# The history of v0.28.0 ... v0.33.0 as every machine must build it.
REAL_TAGS = {
    "v0.28.0": "b9f92daeb492497b8e53ce70be93815d493e737b",
    "v0.29.0": "ff9cd35769848aaabb41d2b2f0caada8b431f17e",
    "v0.30.0": "a604bdde9b0cf4e63a3b19da01b924db417eda3f",
    "v0.31.0": "b69e877f934ad9c317ed34cb0e0accb9b69289ed",
    "v0.32.0": "4820a36c23ea0c533968f26c8d81347a927c6b8a",
    "v0.33.0": "9bb7b9213904bbdc586e5dcc6b05cc49dea8d508",
}


@pytest.mark.releases
def test_real_history_is_the_same_in_two_separate_caches(tmp_path: Path) -> None:
    for version in RELEASE_VERSIONS:  # downloads only what this machine's cache lacks
        sdists.fetch_sdist(version, cache=REAL_CACHE)
    for name in ("a", "b"):
        sdists.copy_sdists(REAL_CACHE, tmp_path / name, RELEASE_VERSIONS)

    releases.build_history(RELEASE_VERSIONS, cache=tmp_path / "a")
    releases.build_history(RELEASE_VERSIONS[3:], cache=tmp_path / "b")
    releases.build_history(RELEASE_VERSIONS[:3], cache=tmp_path / "b")  # older ones inserted below

    assert tag_table(tmp_path / "a") == tag_table(tmp_path / "b") == REAL_TAGS


@pytest.mark.releases
def test_release_history_fixture_holds_the_real_releases(release_history: Path) -> None:
    tags = git(release_history, "tag", "--list", "v*").split()
    assert set(REAL_TAGS) <= set(tags)
    assert git(release_history, "cat-file", "-t", "v0.29.0:vllm/v1/core/single_type_kv_cache_manager.py").strip() == "blob"


# --- the command ----------------------------------------------------------------------


def _local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, lying: frozenset[str] = frozenset()) -> None:
    """A real simple index in tmp_path, named by pip's settings; `lying` versions have a wrong sha256."""
    from helpers.simpleindex import SimpleIndex, point_pip_at

    index = SimpleIndex(tmp_path / "index")
    for version in ("1.0.0", "1.1.0", "1.2.0rc1", "1.2.0", "1.3.0"):
        index.add(f"vllm-{version}.tar.gz", fake_sdist(version), claimed_sha256="0" * 64 if version in lying else None)
    index.add("vllm-1.3.0-py3-none-any.whl", b"a wheel is not an sdist")
    point_pip_at(monkeypatch, index.file_url)


def test_releases_command_builds_a_range_and_prints_one_line_per_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from vpatch.commands.cli import app

    _local_index(tmp_path, monkeypatch, lying={"1.3.0"})
    runner = CliRunner()

    built = runner.invoke(app, ["-C", str(tmp_path), "releases", "--from", "1.1.0", "--to", "1.2.0"])
    added = runner.invoke(app, ["-C", str(tmp_path), "releases", "1.0.0"])
    refreshed = runner.invoke(app, ["-C", str(tmp_path), "releases"])  # 1.3.0 is new on the index
    listed = runner.invoke(app, ["-C", str(tmp_path), "releases", "--list"])

    assert built.exit_code == 0, built.output
    assert [line.split()[0::3] for line in built.stdout.splitlines()] == [["v1.1.0", "added"], ["v1.2.0", "added"]]
    assert "vllm 1.1.0: downloaded vllm-1.1.0.tar.gz" in built.stderr
    assert [line.split()[-1] for line in added.stdout.splitlines()] == ["added", "rewritten", "rewritten"]
    assert refreshed.exit_code == 1 and "error: vllm-1.3.0.tar.gz: sha256 mismatch" in refreshed.stderr
    assert "unchanged" in refreshed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == ["v1.0.0", "v1.1.0", "v1.2.0"]


def test_releases_command_in_a_project_starts_from_the_pin_when_older_than_the_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import write_config
    from typer.testing import CliRunner

    from vpatch.commands.cli import app

    write_config(tmp_path, "https://example.invalid/vllm.git", ref="v1.1.0")
    _local_index(tmp_path, monkeypatch)
    monkeypatch.setattr(releases, "DEFAULT_FIRST", "1.2.0")

    result = CliRunner().invoke(app, ["-C", str(tmp_path), "releases"])

    assert result.exit_code == 0, result.output
    assert [line.split()[0] for line in result.stdout.splitlines()] == ["v1.1.0", "v1.2.0", "v1.3.0"]


def test_plain_releases_command_starts_from_the_fixed_floor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from vpatch.commands.cli import app

    _local_index(tmp_path, monkeypatch)
    monkeypatch.setattr(releases, "DEFAULT_FIRST", "1.2.0")

    result = CliRunner().invoke(app, ["-C", str(tmp_path), "releases"])

    assert result.exit_code == 0, result.output
    assert [line.split()[0] for line in result.stdout.splitlines()] == ["v1.2.0", "v1.3.0"]
