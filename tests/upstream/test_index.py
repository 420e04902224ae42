"""The index client and the sdist cache: pip's own index settings, PEP 691/503 pages, hash checks,
bounded parallel downloads, one releases run per cache, and no leftovers from killed runs."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.sdists import FakePyPI, fake_sdist, tag_table
from helpers.simpleindex import SimpleIndex, point_pip_at

from vpatch.base.errors import UpstreamError
from vpatch.base.lock import LockedError
from vpatch.base.progress import Event, Reporter
from vpatch.upstream import index as index_mod
from vpatch.upstream import releases, sdists
from vpatch.upstream.index import Index, IndexSettings


@pytest.fixture
def simple(tmp_path: Path) -> SimpleIndex:
    index = SimpleIndex(tmp_path / "index")
    for version in ("1.0.0", "1.1.0", "1.2.0"):
        index.add(f"vllm-{version}.tar.gz", fake_sdist(version))
    return index


def test_pip_settings_come_from_its_config_file_and_its_environment_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nindex-url = https://mirror.invalid/simple/\n"
                      "extra-index-url = https://extra.invalid/simple\n  https://more.invalid/simple\n"
                      "cert = /some/ca.pem\ntrusted-host = extra.invalid\n"
                      "[download]\ntimeout = 7\n[install]\nfind-links = /some/wheels\n  /more/wheels\n")
    point_pip_at(monkeypatch, "", config=config)

    from_file = IndexSettings.from_pip()
    for_install = IndexSettings.from_pip(command="install")
    monkeypatch.setenv("PIP_INDEX_URL", "https://env.invalid/simple")
    from_env = IndexSettings.from_pip()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    no_index = IndexSettings.from_pip()

    assert from_file.index_urls[:3] == (
        "https://mirror.invalid/simple", "https://extra.invalid/simple", "https://more.invalid/simple")
    assert (from_file.cert, from_file.trusted_hosts, from_file.timeout) == ("/some/ca.pem", ("extra.invalid",), 7.0)
    assert "/some/wheels" not in from_file.find_links  # [install] is not `pip download`'s section
    assert for_install.find_links[-2:] == ("/some/wheels", "/more/wheels")
    assert for_install.index_urls == from_file.index_urls and for_install.timeout == 15.0
    assert from_env.index_urls[0] == "https://env.invalid/simple"
    assert no_index.index_urls == ()
    with pytest.raises(UpstreamError, match="no-index"):
        Index(no_index).sdists("vllm")


def test_json_api_over_http_gives_urls_and_hashes_and_the_download_checks_them(
    simple: SimpleIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with simple.served() as url:
        point_pip_at(monkeypatch, url)
        client = Index()
        found = client.sdists("VLLM")  # project names are compared normalised, as pip does
        path = sdists.fetch_sdist("1.1", cache=tmp_path / "cache", downloader=sdists.index_downloader(client, "vllm"))

    assert sorted(str(v) for v in found) == ["1.0.0", "1.1.0", "1.2.0"]
    assert found[max(found)].url == f"{url.rsplit('/', 1)[0]}/files/vllm-1.2.0.tar.gz"
    assert path.read_bytes() == fake_sdist("1.1.0")


def test_a_hash_mismatch_is_an_error_and_nothing_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = SimpleIndex(tmp_path / "index")
    index.add("vllm-1.0.0.tar.gz", fake_sdist("1.0.0"), claimed_sha256="ab" * 32)
    point_pip_at(monkeypatch, index.file_url)
    cache = tmp_path / "cache"

    with pytest.raises(UpstreamError, match="sha256 mismatch: the index says abab") as raised:
        releases.build_history(["1.0.0"], cache=cache)

    assert "unchanged" in raised.value.message
    assert list(sdists.sdist_dir(cache).iterdir()) == []
    assert not releases.history_path(cache).exists()


def test_the_first_index_holding_the_file_wins_and_a_missing_index_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "nothing" / "simple"
    good = SimpleIndex(tmp_path / "good")
    good.add("vllm-1.0.0.tar.gz", fake_sdist("1.0.0"))
    point_pip_at(monkeypatch, empty.as_uri())
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", good.file_url)

    releases.build_history(["1.0.0"], cache=tmp_path / "cache")

    assert list(tag_table(tmp_path / "cache")) == ["v1.0.0"]


def test_a_short_version_names_the_release_already_held(tmp_path: Path) -> None:
    releases.build_history(["1.0.0", "1.1.0"], cache=tmp_path, downloader=FakePyPI())
    (sdists.sdist_dir(tmp_path) / "vllm-1.1.0.tar.gz").unlink()  # only the history holds it now
    before = tag_table(tmp_path)
    pypi = FakePyPI()

    again = releases.update(["1.1", "v1.0"], cache=tmp_path, downloader=pypi)

    assert pypi.asked == []
    assert [r.tag for r in again] == ["v1.0.0", "v1.1.0"] and tag_table(tmp_path) == before


def test_a_short_version_takes_the_index_s_name_for_a_new_release(
    simple: SimpleIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_pip_at(monkeypatch, simple.file_url)

    added = releases.update(["1.2"], cache=tmp_path / "a")
    releases.update(["1.2.0"], cache=tmp_path / "b")

    assert [r.tag for r in added] == ["v1.2.0"]
    assert tag_table(tmp_path / "a") == tag_table(tmp_path / "b")


def test_downloads_run_in_parallel_but_bounded(tmp_path: Path) -> None:
    running, peak = 0, 0
    guard = threading.Lock()
    pypi = FakePyPI()

    def slow(version: str, dest: Path, report: Reporter) -> Path:
        nonlocal running, peak
        with guard:
            running += 1
            peak = max(peak, running)
        time.sleep(0.2)
        with guard:
            running -= 1
        return pypi(version, dest, report)

    sdists.fetch_all([f"1.{n}.0" for n in range(6)], cache=tmp_path, downloader=slow, parallel=3)

    assert peak == 3
    assert len(list(sdists.sdist_dir(tmp_path).glob("*.tar.gz"))) == 6


def test_a_second_releases_run_on_the_same_cache_refuses_and_names_the_first(tmp_path: Path) -> None:
    lock = releases.lock_path(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", ("import sys, time; from pathlib import Path; from vpatch.base.lock import exclusive\n"
                                f"with exclusive(Path({str(lock)!r}), what='x'):\n"
                                "  print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(LockedError, match=f"another vpatch releases is running \\(pid {holder.pid}\\)"):
            releases.build_history(["1.0.0"], cache=tmp_path, downloader=FakePyPI())
    finally:
        holder.kill()
        holder.wait()
    # The holder died without cleaning up: its lock file stays, its lock does not.
    assert lock.read_text().strip() == str(holder.pid)
    releases.build_history(["1.0.0"], cache=tmp_path, downloader=FakePyPI())
    assert lock.read_text().strip() == str(os.getpid())


def test_downloads_a_killed_run_left_are_removed_by_the_next_run(tmp_path: Path) -> None:
    leftover = sdists.sdist_dir(tmp_path) / ".download-1.0.0-abcd1234"
    leftover.mkdir(parents=True)
    (leftover / "vllm-1.0.0.tar.gz").write_bytes(b"half a file")

    releases.build_history(["1.1.0"], cache=tmp_path, downloader=FakePyPI())

    assert sorted(p.name for p in sdists.sdist_dir(tmp_path).iterdir()) == ["vllm-1.1.0.tar.gz"]


def test_progress_counts_the_bytes_of_each_download(simple: SimpleIndex, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    point_pip_at(monkeypatch, simple.file_url)
    seen: list[Event] = []

    sdists.fetch_all(["1.0.0", "1.1.0"], cache=tmp_path, report=seen.append)

    done = {e.subject: e for e in seen if e.final}
    assert set(done) == {"vllm 1.0.0", "vllm 1.1.0"}
    assert done["vllm 1.0.0"].done == len(fake_sdist("1.0.0")) and done["vllm 1.0.0"].step == "downloaded"
    assert any(e.step == "downloading" and e.done == len(fake_sdist("1.1.0")) for e in seen)


def test_html_pages_with_relative_links_and_yanked_files(tmp_path: Path) -> None:
    body = (b'<a href="../../f/vllm-2.0.0.tar.gz#sha256=AA">x</a>'
            b'<a href="https://h.invalid/vllm-2.1.0.tar.gz#md5=00" data-yanked="">y</a>'
            b'<a href="vllm-2.2.0-py3-none-any.whl#sha256=bb">w</a>')

    files = index_mod.parse_page(body, "text/html", "https://i.invalid/simple/vllm/")

    assert [(f.filename, f.url, f.hash_name, f.hash_value, f.yanked) for f in files] == [
        ("vllm-2.0.0.tar.gz", "https://i.invalid/f/vllm-2.0.0.tar.gz", "sha256", "aa", False),
        ("vllm-2.1.0.tar.gz", "https://h.invalid/vllm-2.1.0.tar.gz", None, None, True),
        ("vllm-2.2.0-py3-none-any.whl", "https://i.invalid/simple/vllm/vllm-2.2.0-py3-none-any.whl", "sha256", "bb",
         False),
    ]


def test_without_pip_the_pip_variables_still_name_the_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    point_pip_at(monkeypatch, "https://env.invalid/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://extra.invalid/simple")

    settings = IndexSettings.from_pip(str(bare / "bin" / "python"))

    assert settings.index_urls == ("https://env.invalid/simple", "https://extra.invalid/simple")


def test_a_dropped_connection_is_tried_again_and_a_missing_file_is_not(
    simple: SimpleIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transfers: list[str] = []
    real = Index._transfer

    def flaky(self: Index, dist: index_mod.Distribution, out: io.BufferedWriter, progress: object) -> str:
        transfers.append(dist.filename)
        if len(transfers) == 1:
            out.write(b"the first half")
            raise ConnectionResetError("connection reset by peer")
        return real(self, dist, out, None)

    monkeypatch.setattr(index_mod.time, "sleep", lambda _s: None)
    monkeypatch.setattr(Index, "_transfer", flaky)
    point_pip_at(monkeypatch, simple.file_url)
    path = sdists.fetch_sdist("1.0.0", cache=tmp_path / "cache")

    (simple.root / "files" / "vllm-1.1.0.tar.gz").unlink()  # the index names a file that is gone
    with pytest.raises(UpstreamError, match=r"cannot download vllm-1\.1\.0\.tar\.gz"):
        sdists.fetch_sdist("1.1.0", cache=tmp_path / "cache")

    assert path.read_bytes() == fake_sdist("1.0.0")  # the retry started over: no leftover bytes
    assert transfers == ["vllm-1.0.0.tar.gz", "vllm-1.0.0.tar.gz", "vllm-1.1.0.tar.gz"]
