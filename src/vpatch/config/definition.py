"""images/<name>.yaml, one model: the image to produce (image, base, strategy, source_build), how it is
served (serve:) and how it is switched into production (deploy:).

The image part is read by `load`; serve: and deploy: are parsed on first use by their own modules
(serve/config.py, deploy/suite.py), all through the one document reader (document.py). Those two modules
import nothing but the config layer, so this model points down only, and `vpatch build` or `status` never
pays for a deploy suite or its question file. `validate()` is the one pass over the whole definition,
cross-section rules included (consistency.py), that serve and deploy run before they touch anything.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vpatch.base import ConfigError
from vpatch.config.consistency import check
from vpatch.config.document import Document
from vpatch.config.hosts import Host, merged_serve, parse_hosts

if TYPE_CHECKING:
    from vpatch.config.deploy import Suite
    from vpatch.config.serve import ServeConfig

IMAGES_DIR = "images"
MAX_NAME = 100  # a file name (NAME.yaml, NAME.json, NAME-alive.json) must stay under the 255 bytes filesystems allow
OFFICIAL_REPOSITORY = "vllm/vllm-openai"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_REPOSITORY = re.compile(r"^[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_REGISTRY = re.compile(r"^(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*(?::\d+)?|\[[0-9a-fA-F:]+\](?::\d+)?)$")
_RELEASE = re.compile(r"^v\d+\.\d+\.\d+(?:[.-]?[a-z0-9.]+)?$")


def definition_name_ok(name: str) -> bool:
    """Whether `name` can name images/<name>.yaml (and the files named after it, such as its deploy journal)."""
    return bool(_NAME.match(name)) and len(name) <= MAX_NAME


def _not_a_file(path: Path) -> str:
    """What stands at `path` instead of a file ("" for a file or nothing): a folder, a broken link."""
    try:
        if path.is_dir():
            return "is a folder, not a file"
        if path.is_symlink() and not path.exists():
            return f"is a symbolic link to {os.readlink(path)!r}, which does not exist (or loops)"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    return ""


def image_reference_ok(ref: str) -> bool:
    """Docker's reference grammar: [registry[:port]/]path[:tag][@sha256:digest], the path in lower case."""
    rest, _, digest = ref.partition("@")
    if digest and not _DIGEST.match(digest):
        return False
    name, tag = rest, ""
    if ":" in rest.rsplit("/", 1)[-1]:
        name, tag = rest.rsplit(":", 1)
        if not _TAG.match(tag):
            return False
    first, slash, path = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        if not _REGISTRY.match(first):
            return False
        name = path
    return bool(_REPOSITORY.match(name))


class Strategy(str, Enum):
    """How an image is produced from the pin and the series (`strategy:`, `vpatch build --strategy`)."""

    AUTO = "auto"
    OVERLAY = "overlay"
    PRECOMPILED = "precompiled"
    SOURCE = "source"


@dataclass(frozen=True)
class Base:
    image: str | None = None  # e.g. vllm/vllm-openai:v0.29.0; None: derived from the pin
    digest: str | None = None  # sha256:...; preferred over the tag (nightly tags are pruned)

    def reference(self) -> str | None:
        """What to build FROM: repo@digest when the digest is recorded, else the tag."""
        if self.image and self.digest:
            return f"{self.image.split('@', 1)[0].rsplit(':', 1)[0]}@{self.digest}"
        return self.image


@dataclass(frozen=True)
class SourceBuild:
    torch_cuda_arch_list: str = "12.0"  # the GPU host's RTX 5090s (sm_120) only
    max_jobs: int | None = None
    nvcc_threads: int | None = None
    target: str = "vllm-openai"
    dockerfile: str = "docker/Dockerfile"
    # vLLM's own commit whose wheels precompiled builds use; default: the pin, when upstream is vLLM's git.
    wheel_commit: str | None = None


@dataclass(frozen=True)
class ImageDefinition:
    name: str
    path: Path
    repository: str  # without registry
    tag: str  # the moving tag, e.g. flash-next
    registry: str | None = None  # host[:port] that --push sends both tags to
    base: Base = field(default_factory=Base)
    strategy: Strategy = Strategy.AUTO
    package_dir: str | None = None  # the installed vllm/ folder in the base; None: discovered
    source_build: SourceBuild = field(default_factory=SourceBuild)
    # The serve: and deploy: sections as read, parsed on first use (the `serve` and `deploy` properties).
    sections: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    source: str = ""  # how errors name the file, e.g. images/flash-next.yaml

    @cached_property
    def serve(self) -> ServeConfig | None:
        """How the GPU host runs the image (vpatch serve); None when the yaml has no serve: section."""

        if "serve" not in self.sections:
            return None
        from vpatch.config.serve import ServeConfig  # lazy: parsed on first use, a command without serve: never loads it

        return ServeConfig.parse(self._document, self.sections["serve"], "serve", default_name=f"vllm-{self.name}")

    @cached_property
    def deploy(self) -> Suite:
        """The deploy: section (checks, hooks); the defaults when the yaml has none."""

        from vpatch.config.deploy import Suite  # lazy: parsed on first use, status and build never load the deploy model

        if "deploy" not in self.sections:
            return Suite()
        return Suite.parse(self.sections["deploy"], root=self.path.parent.parent, source=self._document.source)

    @cached_property
    def hosts(self) -> tuple[Host, ...]:
        """The machines the image runs on (`hosts:`); empty: the local docker daemon, as without the key."""

        if "hosts" not in self.sections:
            return ()
        return parse_hosts(self._document, self.sections["hosts"])

    def host(self, name: str) -> Host:
        """The host `name` of `hosts:` (`--host NAME`); a ConfigError naming the known ones otherwise."""
        for host in self.hosts:
            if host.name == name:
                return host
        known = ", ".join(h.name for h in self.hosts)
        raise ConfigError(f"--host {name}: images/{self.name}.yaml has " + (f"no host {name!r} (its hosts: {known})"
                          if known else "no hosts: list, so it runs on the local docker daemon only"),
                          hint=f"name one of images/{self.name}.yaml's hosts" if known else "leave --host out")

    def on_host(self, host: Host) -> ImageDefinition:
        """This definition as `host` runs it: the serve: section with the host's overrides; errors in it name the
        host."""
        serve = merged_serve(self.sections.get("serve"), host.serve)
        sections = {k: v for k, v in self.sections.items() if k not in ("serve", "hosts")}
        if serve is not None:
            sections["serve"] = serve
        return replace(self, sections=sections, source=f"{self._document.source} (host {host.name}: serve: with "
                       f"{host.key}.serve)" if host.serve else f"{self._document.source} (host {host.name})")

    @property
    def _document(self) -> Document:
        return Document(self.source or f"{IMAGES_DIR}/{self.path.name}")

    def validate(self) -> ImageDefinition:
        """Every section parsed and every rule between them checked (request sizes within max_model_len, a
        tool-call check with a tool parser, ...), on every host as it runs the serve section: the pass serve and
        deploy run before anything is touched. One ConfigError lists every cross-section problem."""

        check(self.serve, self.deploy, source=self._document.source)
        for host in self.hosts:
            view = self.on_host(host)
            check(view.serve, view.deploy, source=view._document.source)
        return self

    @property
    def full_repository(self) -> str:
        return f"{self.registry}/{self.repository}" if self.registry else self.repository

    @property
    def moving_ref(self) -> str:
        """The moving tag's full reference, e.g. localhost:5000/ml/vllm-flash:flash-next (what serve runs)."""
        return f"{self.full_repository}:{self.tag}"

    def base_for(self, pin_ref: str, pin_commit: str | None) -> Base:
        """The base image for the pin: the definition's, else the official image a release or a main
        commit gets (`vllm/vllm-openai:vX.Y.Z`, `vllm/vllm-openai:nightly-<sha>`)."""
        if self.base.image:
            return self.base
        if _RELEASE.match(pin_ref):
            return Base(image=f"{OFFICIAL_REPOSITORY}:{pin_ref}")
        if pin_commit:
            return Base(image=f"{OFFICIAL_REPOSITORY}:nightly-{pin_commit}")
        return Base()

    @classmethod
    def load(cls, root: Path, name: str) -> ImageDefinition:
        if not definition_name_ok(name):
            raise ConfigError(f"{name[:60]!r}{'...' if len(name) > 60 else ''} is not an image definition name "
                              f"(lower-case letters, digits, '.', '_', '-', at most {MAX_NAME} characters)",
                              hint=f"name one of {IMAGES_DIR}/*.yaml without the .yaml")
        path = root / IMAGES_DIR / f"{name}.yaml"
        what = _not_a_file(path)
        if what:
            raise ConfigError(f"{IMAGES_DIR}/{name}.yaml {what}",
                              hint=f"make {IMAGES_DIR}/{name}.yaml the definition's YAML file")
        if not path.is_file():
            known = sorted(p.stem for p in (root / IMAGES_DIR).glob("*.yaml") if p.is_file())
            raise ConfigError(
                f"no image definition {name!r} ({IMAGES_DIR}/{name}.yaml)",
                hint=f"known images: {', '.join(known)}" if known else f"create {IMAGES_DIR}/{name}.yaml",
            )
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{IMAGES_DIR}/{name}.yaml: cannot read: {exc}") from exc
        return cls.parse(text, name=name, path=path, source=f"{IMAGES_DIR}/{name}.yaml")

    @classmethod
    def parse(cls, text: str, *, name: str, path: Path, source: str) -> ImageDefinition:
        doc, data = Document.parse(text, source=source)
        if not _NAME.match(name):
            doc.fail("", f"has an invalid image name {name!r} (lower-case letters, digits, '.', '_', '-')")
        # serve: and deploy: have their own modules, which parse them on first use.
        top = doc.mapping(
            data, "", required={"image"}, optional={"base", "strategy", "package_dir", "source_build", "serve", "deploy", "hosts"},
        )
        img = doc.mapping(top["image"], "image", required={"repository", "tag"}, optional={"registry"})
        repository = doc.string(img, "image.repository")
        if not _REPOSITORY.match(repository):
            doc.fail("image.repository", f"is not a valid repository name: {repository!r} (e.g. ml/vllm-flash)")
        tag = doc.string(img, "image.tag")
        if not _TAG.match(tag):
            doc.fail("image.tag", f"is not a valid tag: {tag[:60]!r}{'...' if len(tag) > 60 else ''}"
                     + (f" ({len(tag)} characters; docker takes at most 128)" if len(tag) > 128 else
                        " (letters, digits, '_', '.', '-'; not beginning with '.' or '-')"))
        registry = doc.optional_string(img, "image.registry")
        if registry is not None and ("/" in registry or " " in registry or not _REGISTRY.match(registry)):
            # `local_host:port` was rendered into every tag: docker refuses it only at the push.
            doc.fail("image.registry", f"must be host[:port] (letters, digits, '-', '.', a numeric port), not {registry!r}")

        base_data = doc.section(top, "base", optional={"image", "digest"}) or {}
        base = Base(image=doc.optional_string(base_data, "base.image"), digest=doc.optional_string(base_data, "base.digest"))
        if base.digest is not None and not _DIGEST.match(base.digest):
            doc.fail("base.digest", f"must be sha256:<64 hex>, not {base.digest!r}")
        if base.digest is not None and base.image is None:
            doc.fail("base.image", "is required when base.digest is set (the digest's repository)")
        if base.image is not None and not image_reference_ok(base.image):
            doc.fail("base.image", f"must be an image reference ([registry/]name[:tag][@sha256:...], lower-case "
                     f"name), not {base.image!r}")

        strategy_text = doc.string(top, "strategy", Strategy.AUTO.value)
        try:
            strategy = Strategy(strategy_text)
        except ValueError:
            doc.fail("strategy", f"must be one of {', '.join(s.value for s in Strategy)}, not {strategy_text!r}")
        package_dir = doc.optional_string(top, "package_dir")
        if package_dir is not None and not package_dir.startswith("/"):
            doc.fail("package_dir", f"must be an absolute path inside the image, not {package_dir!r}")

        sb = doc.section(
            top, "source_build",
            optional={"torch_cuda_arch_list", "max_jobs", "nvcc_threads", "target", "dockerfile", "wheel_commit"},
        ) or {}
        # YAML reads an unquoted 12.0 as a float (and 9.10 as 9.1): the arch list is taken as written.
        arch = doc.text(sb, "torch_cuda_arch_list", "source_build.torch_cuda_arch_list") if "torch_cuda_arch_list" in sb else "12.0"
        if not isinstance(arch, str) or not re.fullmatch(r"\d+\.\d+a?(\+PTX)?(\s+\d+\.\d+a?(\+PTX)?)*", arch.strip()):
            doc.fail("source_build.torch_cuda_arch_list", f"must be compute capabilities like \"12.0\" or \"9.0 12.0\", not {arch!r}")
        wheel_commit = doc.optional_string(sb, "source_build.wheel_commit")
        if wheel_commit is not None and not re.fullmatch(r"[0-9a-f]{40}", wheel_commit):
            doc.fail("source_build.wheel_commit", f"must be a full 40-hex vLLM commit, not {wheel_commit!r}")
        source_build = SourceBuild(
            torch_cuda_arch_list=arch.strip(),
            max_jobs=_positive(doc, sb, "source_build.max_jobs"),
            nvcc_threads=_positive(doc, sb, "source_build.nvcc_threads"),
            target=doc.string(sb, "source_build.target", "vllm-openai"),
            dockerfile=doc.string(sb, "source_build.dockerfile", "docker/Dockerfile"),
            wheel_commit=wheel_commit,
        )
        return cls(
            name=name,
            path=path,
            repository=repository,
            tag=tag,
            registry=registry,
            base=base,
            strategy=strategy,
            package_dir=package_dir,
            source_build=source_build,
            sections={k: top[k] for k in ("serve", "deploy", "hosts") if k in top},
            source=source,
        )


def _positive(doc: Document, data: dict[str, Any], key: str) -> int | None:
    value = data.get(key.rsplit(".", 1)[-1])
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        doc.fail(key, f"must be a positive whole number, not {value!r}")
    return value
