"""Did-you-mean suggestions for unknown names (schedules, models, accelerators, keys).

>>> did_you_mean("1fb1", ["gpipe", "1f1b", "zbv"])
" (did you mean '1f1b'?)"
>>> did_you_mean("xyz", ["gpipe", "1f1b"])
''
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean"]


def did_you_mean(name: str, choices: Iterable[str], /) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``choices``, or ``""`` when none is
    close (difflib's ratio >= 0.6, compared case-insensitively)."""
    options = list(choices)
    folded = {choice.lower(): choice for choice in options}
    close = difflib.get_close_matches(name.lower(), list(folded), n=1, cutoff=0.6)
    return f" (did you mean {folded[close[0]]!r}?)" if close else ""
