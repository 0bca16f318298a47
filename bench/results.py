"""bench/RESULTS.md is shared by the bench scripts: each owns one marked section and rewrites only it."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).parent / "RESULTS.md"


def update_section(name: str, text: str, path: Path = RESULTS) -> None:
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    block = f"{start}\n{text.strip()}\n{end}\n"
    current = path.read_text() if path.exists() else "# Benchmark results\n\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end) + r"\n?", re.S)
    path.write_text(
        pattern.sub(lambda _: block, current) if pattern.search(current) else current.rstrip() + "\n\n" + block
    )
