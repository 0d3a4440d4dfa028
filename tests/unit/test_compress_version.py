"""``CODECS_VERSION`` names the codecs' outputs: workers cache compressed bodies under it and a
conversation's memo from workers of another version is not taken. So it must change whenever an
output changes. This test pins a digest of the outputs for a fixed set of inputs that exercises
every form; when it fails, bump ``CODECS_VERSION`` in worker/compress/__init__.py and put the
new digest here with it."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from worker.compress import CODECS_VERSION, compress_tool_result

PINNED = {1: "9a78be950f2aabcbfa3065091a7360368a7b5227fb94ab92b9b27fbb98a9f2d0"}


def _inputs() -> list[tuple[str, Any]]:
    grep = "\n".join(
        f"src/pkg/mod_{f}.py:{n}: value = compute_{n}(x, y)" for f in range(6) for n in range(12)
    )
    paths = "\n".join(f"./src/pkg{d}/sub/module_{i}.py" for d in range(4) for i in range(15))
    tree = "\n\n".join(
        f"./dir{d}:\n" + "\n".join(f"file_{i}.txt" for i in range(20)) for d in range(5)
    )
    long_listing = "\n".join(
        f"-rw-r--r-- 1 alice staff {1000 + i:>6} Nov 30 12:00 report_{i}.csv" for i in range(40)
    )
    numbered = "\n".join(f"{n:>6}\tline number {n} of the file" for n in range(1, 120))
    repeated = "\n".join(["INFO waiting for the server to start"] * 60 + ["INFO ready"])
    grep_json = {
        "matches": [
            {"file": f"src/m{i % 5}.py", "line": i, "text": f"match number {i} here"}
            for i in range(60)
        ]
    }
    glob_json = [f"src/components/widgets/widget_{i}.tsx" for i in range(80)]
    rows = [{"id": i, "name": f"user{i}", "email": f"user{i}@example.com"} for i in range(50)]
    read_file = {
        "path": "src/app.py",
        "content": "\n".join(f"print({i})" for i in range(200)),
        "total_lines": 200,
    }
    return [
        ("bash", grep),
        ("bash", paths),
        ("bash", tree),
        ("bash", long_listing),
        ("bash", numbered),
        ("bash", repeated),
        ("grep", grep_json),
        ("glob", glob_json),
        ("query", rows),
        ("read_file", read_file),
    ]


def outputs_digest() -> str:
    digest = hashlib.sha256()
    for tool, value in _inputs():
        out = compress_tool_result(tool, value)
        digest.update(json.dumps([tool, out], sort_keys=True, ensure_ascii=False).encode())
    return digest.hexdigest()


def test_codec_outputs_change_only_with_the_version() -> None:
    assert outputs_digest() == PINNED.get(CODECS_VERSION), (
        "the codecs' outputs changed: bump CODECS_VERSION and pin the new digest "
        f"({outputs_digest()}) under it"
    )


def test_the_pinned_inputs_exercise_the_codecs() -> None:
    changed = [tool for tool, value in _inputs() if compress_tool_result(tool, value) != value]
    assert len(changed) >= 8, changed
