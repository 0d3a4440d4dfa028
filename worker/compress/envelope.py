"""The wrappers shell tools put around command output, kept byte for byte around the bodies.

mini-swe-agent style results (the corpus) look like ``<returncode>0</returncode>\\n<output>\\n...
</output>``, or, when the output was cut, carry a warning and a head and a tail section. Only the
bodies are compressed; the wrapper is split off and put back exactly.
"""

from __future__ import annotations

import re

_WRAPPERS = (
    re.compile(r"(<returncode>-?[0-9]+</returncode>\n<output>\n)(.*)(</output>)", re.DOTALL),
    re.compile(
        r"(<returncode>-?[0-9]+</returncode>\n<warning>\n.*?</warning><output_head>\n)(.*?)"
        r"(</output_head>\n<elided_chars>\n[0-9]+ characters elided\n</elided_chars>\n"
        r"<output_tail>\n)(.*)(</output_tail>)",
        re.DOTALL,
    ),
)


def split(text: str) -> list[str] | None:
    """``[wrapper, body, wrapper, ..., wrapper]`` (bodies at odd indexes), or None if unwrapped."""
    if not text.startswith("<returncode>"):
        return None
    for wrapper in _WRAPPERS:
        match = wrapper.fullmatch(text)
        if match is not None:
            return list(match.groups())
    return None


def join(parts: list[str]) -> str:
    return "".join(parts)
