"""The Dockerfile as the tests read it: its stages, what each copies, its user, port and health
check, and Docker's rules for COPY destinations and .dockerignore patterns."""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Stage:
    base: str
    name: str | None
    workdir: str = "/"
    copies: list[tuple[str | None, list[str], str]] = field(default_factory=list)  # (from, sources, dest)
    runs: list[str] = field(default_factory=list)
    user: str | None = None
    expose: list[str] = field(default_factory=list)
    healthcheck: str | None = None
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None


def dockerfile_stages() -> list[Stage]:
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"), env_replace=False)
    stages: list[Stage] = []
    for item in parser.structure:
        instruction, value = item["instruction"], item["value"]
        if instruction == "FROM":
            words = value.split()
            stages.append(Stage(base=words[0], name=words[2] if len(words) == 3 and words[1].upper() == "AS" else None))
            continue
        if instruction in ("COMMENT", "ARG") and not stages:
            continue
        stage = stages[-1]
        if instruction == "WORKDIR":
            stage.workdir = posixpath.join(stage.workdir, value)
        elif instruction in ("COPY", "ADD"):
            assert instruction == "COPY", "ADD fetches and unpacks: COPY says what it does"
            words = shlex.split(value)
            source_stage = None
            while words[0].startswith("--"):
                if words[0].startswith("--from="):
                    source_stage = words[0].split("=", 1)[1]
                words = words[1:]
            stage.copies.append((source_stage, words[:-1], posixpath.join(stage.workdir, words[-1])))
        elif instruction == "RUN":
            stage.runs.append(value)
        elif instruction == "USER":
            stage.user = value
        elif instruction == "EXPOSE":
            stage.expose += value.split()
        elif instruction == "HEALTHCHECK":
            stage.healthcheck = value
        elif instruction == "ENTRYPOINT":
            stage.entrypoint = json.loads(value)  # the exec form: a JSON array, no shell between
        elif instruction == "CMD":
            stage.cmd = json.loads(value)
    return stages


def image() -> Stage:
    return dockerfile_stages()[-1]


def copied(stage: Stage, from_stage: str | None = None) -> dict[str, str]:
    """Where each file or folder a stage copies lands in the image: container path -> source
    (a repository path, or a path in the stage `from_stage`). Docker's rule: a destination that
    ends in `/`, or takes several sources, is a folder they go into; otherwise the copy's name."""
    landed = {}
    for source_stage, sources, dest in stage.copies:
        if source_stage != from_stage:
            continue
        into = dest.endswith("/") or len(sources) > 1
        for source in sources:
            name = posixpath.basename(source.rstrip("/"))
            landed[posixpath.normpath(posixpath.join(dest, name) if into else dest)] = source
    return landed


def image_uid() -> int:
    user = image().user
    assert user is not None
    return int(user.split(":")[0])


def image_port() -> int:
    (port,) = image().expose
    return int(port.split("/")[0])


def healthcheck_command() -> list[str]:
    healthcheck = image().healthcheck
    assert healthcheck is not None
    options, _, command = healthcheck.partition("CMD")
    assert all(word.startswith("--") for word in options.split())
    return json.loads(command)


def readme_run_it() -> list[list[str]]:
    """The commands of the README's install line, under "## Run it"."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Run it\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "README's 'Run it' has no sh block"
    return [shlex.split(part) for part in block.group(1).strip().split("&&")]


def venv_and_pip(commands: list[list[str]]) -> tuple[str, list[str]]:
    """The venv a command line creates and the arguments its pip install is given."""
    venv = next(words[words.index("venv") + 1] for words in commands if words[1:3] == ["-m", "venv"])
    pip = next(words for words in commands if words[:2] == [posixpath.join(venv, "bin/pip"), "install"])
    return venv, pip[2:]


def install_target(requirement: str) -> tuple[str, list[str]]:
    """A pip requirement that is a path, split into the path and its extras: `.[s3]` -> `.`, [s3]."""
    match = re.fullmatch(r"(?P<path>[^\[]+)(?:\[(?P<extras>[^\]]*)\])?", requirement)
    assert match, f"not a path requirement: {requirement}"
    extras = [extra.strip() for extra in (match["extras"] or "").split(",") if extra.strip()]
    return match["path"], extras


def ignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: of the patterns that match the path or a folder above it, the last decides;
    a plain pattern leaves the path out, an exception (`!`) keeps it in."""
    parts = Path(path).parts
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    verdict = False
    for pattern in patterns:
        exception = pattern.startswith("!")
        body = pattern.lstrip("!").strip("/").removeprefix("./")
        regex = re.escape(body).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        regex = re.sub(r"\\\[(.*?)\\\]", lambda m: "[" + m.group(1).replace("\\", "") + "]", regex)
        if any(re.fullmatch(regex, candidate) for candidate in candidates):
            verdict = not exception
    return verdict
