"""Status at two sizes of the same vLLM-shaped history (tests/helpers/vllmshape.py, the benchmark's generator, from the
real v0.29.0 tree): the verdicts, first commits and first releases must not depend on the history's size."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from conftest import REAL_CACHE, git, vpatch_json
from helpers import vllmshape

from vpatch.base.paths import cache_dir
from vpatch.upstream import mirror

TARGETS = ("v0.35.0", "v0.41.0")


def summary(tmp_path: Path, release_history: Path, commits: int) -> dict[str, object]:
    """Per patch: its verdict on each target and where it landed (first commit by subject, release, proof)."""
    built = vllmshape.build(vllmshape.Shape(commits=commits), release_history, REAL_CACHE / "bench-histories")
    root = tmp_path / f"project-{commits}"
    shutil.copytree(built.project, root)
    # the cached project names the history where it was built; the cache may be reached another way now (a
    # symlinked or moved cache folder): name it as this run reaches it
    config = root / "vpatch.yaml"
    config.write_text(re.sub(r"(?m)^(  git: ).*$", lambda m: m[1] + built.upstream.as_uri(), config.read_text()))
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "project")
    repo = mirror.fetch(cache_dir(), built.upstream.as_uri())
    code, doc = vpatch_json(root, "status", "--json", "--no-probes", *(a for t in TARGETS for a in ("--against", t)))
    assert code in (0, 3), doc
    assert doc["targets"] == ["v0.30.0", *TARGETS]
    found: dict[str, object] = {}
    for p in doc["patches"]:
        states = {ref: (v["state"], sorted(e["kind"] for e in v["evidence"] if e["says"] == "landed"))
                  for ref, v in p["results"].items()}
        where = p["landed_in"]
        if where is not None:
            proof = where["release_proof"]
            where = (where["ref"], git(repo, "log", "-1", "--format=%s", where["commit"]).strip(), where["release"],
                     where["since"], where["bisected"], proof["branch"], proof["cherry_pick"])
        found[p["file"]] = (states, where)
    return found


def test_status_says_the_same_on_a_history_ten_times_longer(tmp_path: Path, release_history: Path) -> None:
    small = summary(tmp_path, release_history, 300)
    large = summary(tmp_path, release_history, 3000)
    assert large == small
    landed = {name: where for name, (_, where) in large.items() if where is not None}
    assert len(landed) == 8
    # what the generator put there: a pick for a patch release, a re-land, a pick after the next minor
    assert landed["0002-vendor-fix-2.patch"][2] == "v0.31.1" and landed["0002-vendor-fix-2.patch"][6]
    assert landed["0003-vendor-fix-3.patch"][1].startswith('Reapply "') and landed["0003-vendor-fix-3.patch"][2] == "v0.34.0"
    assert landed["0006-vendor-fix-6.patch"][2] == "v0.36.3"
    assert landed["0001-vendor-fix-1.patch"][:3] == ("v0.35.0", "[Bugfix] Vendor fix 1 (#90001)", "v0.31.0")
    # reverted for good: needed on both targets
    states, where = large["0009-vendor-fix-9.patch"]  # type: ignore[misc]
    assert where is None and {s for s, _ in states.values()} == {"needed"}
