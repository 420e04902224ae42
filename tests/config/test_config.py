"""vpatch.yaml: valid files load, every bad one is named with its key and file."""

from __future__ import annotations

from pathlib import Path

import pytest

from vpatch.base.errors import ConfigError
from vpatch.config.project import Config


def load(tmp_path: Path, text: str | bytes) -> Config:
    path = tmp_path / "vpatch.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return Config.load(tmp_path)


def test_minimal_config_has_defaults(tmp_path: Path) -> None:
    config = load(tmp_path, "pin:\n  ref: v0.29.0\n")
    assert config.pin.ref == "v0.29.0" and config.pin.commit is None
    assert config.upstream.git == "https://github.com/vllm-project/vllm.git"
    assert config.upstream.source == "git"
    assert config.patches_dir == tmp_path / "patches"


def test_release_source_and_round_trip(tmp_path: Path) -> None:
    sha = "a" * 40
    config = load(tmp_path, f"upstream:\n  releases: vllm\npin:\n  ref: v0.29.0\n  commit: {sha}\n")
    assert config.upstream.source == "releases" and config.upstream.releases == "vllm"
    config.with_pin("v0.30.0", "b" * 40).save()
    again = Config.load(tmp_path)
    assert again.pin.ref == "v0.30.0" and again.pin.commit == "b" * 40
    assert again.upstream == config.upstream


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pin:\n  ref: v1\ncolour: blue\n", "key 'colour' is not a known key"),
        ("pin:\n  ref: v1\nupstream:\n  gti: x\n", "key 'upstream.gti' is not a known key"),
        ("pin:\n  ref: [1, 2]\n", "key 'pin.ref' must be a non-empty string"),
        ("pin: v0.29.0\n", "key 'pin' must be a mapping"),
        ("upstream:\n  git: x\n", "key 'pin' is missing"),
        ("pin:\n  commit: " + "a" * 40 + "\n", "key 'pin.ref' is missing"),
        ("pin:\n  ref: v1\n  commit: abc\n", "key 'pin.commit' must be a full 40-hex commit SHA"),
        ("pin:\n  ref: v1\nupstream:\n  source: svn\n", "key 'upstream.source' must be one of git, releases"),
        ("pin:\n  ref: v1\npatches: ../elsewhere\n", "key 'patches' must be a folder inside the project"),
        ("pin: [unclosed\n", "not valid YAML"),
        ("- just\n- a list\n", "top level must be a mapping"),
        (b"pin:\n  ref: \xff\xfe\n", "cannot read"),
    ],
)
def test_bad_config_names_file_and_key(tmp_path: Path, text: str | bytes, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    assert message in info.value.message
    assert "vpatch.yaml" in info.value.message
    assert info.value.hint


def test_missing_config_says_where_to_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        Config.load(tmp_path)
    assert "no vpatch.yaml" in info.value.message
