"""The JavaScript clients tests/test_js_clients.py drives (and whose TypeScript declarations
tests/test_js_sdk_types.py reads), installed once into `.venv/js/` (beside the venv's Python, so a
fresh clone installs them and a second run finds them): the exact tree tests/js/package-lock.json
names, installed again only when that lock file changes.

`python -m tests.js_install` is how .ci/run installs them; the tests call `installed()` too, so a
run of pytest alone works on a machine .ci/run never prepared."""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
SOURCE = ROOT / "tests" / "js"
TARGET = ROOT / ".venv" / "js"
# A copy of the lock file the tree was installed from, written only after `npm ci` and `npm ls`
# both succeeded: a failed or interrupted install is never taken for a finished one.
STAMP = TARGET / "installed-from.lock.json"


def is_current() -> bool:
    lock = SOURCE / "package-lock.json"
    return STAMP.exists() and STAMP.read_bytes() == lock.read_bytes() and (TARGET / "node_modules").is_dir()


def installed() -> Path:
    """The folder holding node_modules/ with the locked clients, installing them when missing or stale."""
    if is_current():
        return TARGET
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is not on PATH: the JavaScript client tests need node and npm")
    TARGET.mkdir(parents=True, exist_ok=True)
    # Two test runs starting at once on a fresh machine install one after the other, not into each other.
    with (TARGET / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_current():
            _install()
    return TARGET


def _install() -> None:
    STAMP.unlink(missing_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(SOURCE / name, TARGET / name)
    # --ignore-scripts: nothing the clients need runs at install (protobufjs's postinstall only
    # prints a notice), and a registry package's script is code no test asked to run.
    npm = ["npm", "--prefix", str(TARGET), "--no-audit", "--no-fund", "--loglevel=error"]
    subprocess.run([*npm, "ci", "--ignore-scripts"], check=True, timeout=600)
    # npm ls exits non-zero when what is installed differs from what package.json asks for.
    listed = subprocess.run([*npm, "ls", "--json"], check=True, capture_output=True, timeout=120)
    versions = {name: dep["version"] for name, dep in json.loads(listed.stdout)["dependencies"].items()}
    print("JavaScript clients installed:", ", ".join(f"{n}@{v}" for n, v in sorted(versions.items())), file=sys.stderr)
    shutil.copyfile(SOURCE / "package-lock.json", STAMP)


if __name__ == "__main__":
    installed()
