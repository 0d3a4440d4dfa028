"""Compile the pure, typed modules on the compaction's hot path to C extensions with mypyc.

    .venv/bin/python tools/native.py          # build them in place (what `make` does)
    .venv/bin/python tools/native.py --clean  # remove them: the package runs as plain Python

The sources stay the only code: mypyc compiles them as they are (mypy strict, the project's
own configuration), and Python imports an extension module before a ``.py`` of the same name.
Without a C compiler (or with ``COMPACTOR_NATIVE=0``) nothing is built and the same modules run
interpreted, with the same results. A manifest (``worker/_native.json``) records whether they
were compiled and each source's SHA-256 then, so that a test fails when an extension is older
than its source (``make`` rebuilds them whenever one changes).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "worker" / "_native.json"
# Pure functions over strings and plain data, where a compaction spends its Python time: the
# code names, facts, files and fidelity check of the range, its redaction, the digest, the
# tool-output compression, the projection and its exact token accounting, the range's planning
# and grouping, the OpenAI wire format's reading, provenance, the range digest and the caches.
# Not a package's ``__init__`` (compiled, it loses its submodules), nor a module that defines a
# pydantic model, nor one whose functions tests replace to watch the calls between them. (The
# pipeline's steps, compiled too, saved nothing measurable: 0.6 % of the instructions.)
MODULES = (
    "worker/core/identifiers.py",
    "worker/core/facts.py",
    "worker/core/files.py",
    "worker/core/fidelity.py",
    "worker/core/redaction.py",
    "worker/compress/tally.py",
    "worker/compress/text.py",
    "worker/compress/output.py",
    "worker/compress/grep_text.py",
    "worker/compress/long_text.py",
    "worker/compress/ls_text.py",
    "worker/compress/numbered_text.py",
    "worker/compress/paths_text.py",
    "worker/compress/rle_text.py",
    "worker/compress/tree_text.py",
    "worker/compress/textform.py",
    "worker/compress/envelope.py",
    "worker/compress/jsontext.py",
    "worker/compress/structured.py",
    "worker/tokens/bounds.py",
    "worker/summarize/digest.py",
    "worker/core/planning.py",
    "worker/core/groups.py",
    "worker/wire/formats/openai.py",
    "worker/core/provenance.py",
    "worker/wire/history.py",
    "worker/cache.py",
    "worker/core/projection.py",
)
GROUP = "worker.native"


def _digest(module: str) -> str | None:
    path = ROOT / module
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def source_digests() -> dict[str, str | None]:
    return {m: _digest(m) for m in MODULES}


def stale() -> list[str]:
    """The compiled modules whose source changed since the build (none when nothing was)."""
    if not MANIFEST.exists():
        return []
    built: dict[str, str] = json.loads(MANIFEST.read_text()).get("sources", {})
    return [m for m, digest in built.items() if _digest(m) != digest]


def built_files() -> list[Path]:
    """Every extension under ``worker/`` (for --clean): those of the modules listed now, and
    any of a module listed before (its shim would load a group that no longer holds it)."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return sorted((ROOT / "worker").rglob(f"*{suffix}"))


def clean() -> None:
    for path in built_files():
        path.unlink()
    MANIFEST.unlink(missing_ok=True)
    shutil.rmtree(ROOT / "build" / "native", ignore_errors=True)


def build() -> None:
    """Build every module in place, or leave them interpreted when that cannot be."""
    os.chdir(ROOT)  # mypy reads the project's configuration ([tool.mypy] in pyproject.toml)
    try:
        _compile()
    # No mypyc (the dev extra), no compiler or headers, a type error (mypyc exits): interpreted.
    except (Exception, SystemExit) as exc:
        print(f"native: not compiled ({exc!r}); the modules run as plain Python", file=sys.stderr)
        clean()
        write_manifest(compiled=False)
        return
    write_manifest(compiled=True)


def _compile() -> None:
    from mypyc.build import mypycify
    from setuptools import Distribution

    extensions = mypycify(list(MODULES), group_name=GROUP, target_dir="build/native")
    # A Distribution of its own, so that setuptools does not read the project's metadata.
    dist = Distribution({"ext_modules": extensions, "script_name": "tools/native.py"})
    command = dist.get_command_obj("build_ext")
    command.inplace = True
    command.build_temp = "build/native/temp"
    command.parallel = os.cpu_count() or 1
    dist.run_command("build_ext")


def write_manifest(*, compiled: bool) -> None:
    """What was built, from which sources (``make`` rebuilds when a source is newer)."""
    manifest = {"compiled": compiled, "sources": source_digests() if compiled else {}}
    MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def main(argv: list[str]) -> int:
    clean()  # nothing stale survives a failed build
    if "--clean" in argv:
        return 0
    if os.environ.get("COMPACTOR_NATIVE") == "0":
        write_manifest(compiled=False)
    else:
        build()
    return 0  # interpreted is a valid outcome: never fail the set-up for it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
