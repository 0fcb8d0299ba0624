"""Static images of figures: PNG, SVG or PDF through Plotly's image export.

Plotly renders static images with kaleido (``pip install 'pipesim[image]'``),
which drives a Chrome or Chromium already on the machine (Debian's
``chromium`` package will do; kaleido looks on the ``PATH``, or where the
``BROWSER_PATH`` environment variable points). Images are 1100 pixels wide and
as tall as the figure's layout says, the size the HTML page is laid out for.
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from pipesim.errors import PipesimError
from pipesim.files import write_bytes

__all__ = ["IMAGE_FORMATS", "IMAGE_WIDTH_PX", "to_image", "write_image"]

#: Image formats by file suffix.
IMAGE_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}

#: The width of an exported image, in pixels.
IMAGE_WIDTH_PX = 1100

_INSTALL = "pip install 'pipesim[image]'"


def to_image(fig: go.Figure, /, *, fmt: str) -> bytes:
    """``fig`` as ``png``, ``svg`` or ``pdf`` bytes; a PipesimError that says what to
    install when kaleido or a browser is missing."""
    import plotly.io as pio

    try:
        import kaleido  # noqa: F401  (plotly imports it itself; this gives the clear error)
    except ImportError:
        raise PipesimError(
            f"writing a {fmt.upper()} image needs kaleido, which is not installed: {_INSTALL} "
            "(or write .html)"
        ) from None
    height = int(fig.layout.height or 600)
    try:
        data: bytes = pio.to_image(fig, format=fmt, width=IMAGE_WIDTH_PX, height=height)
    except Exception as exc:  # kaleido reports a missing browser with its own exception types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PipesimError(
            f"kaleido could not render the {fmt.upper()} image ({first}); it needs Chrome or "
            "Chromium: `apt-get install chromium`, or set BROWSER_PATH to a Chrome binary"
        ) from None
    return data


def write_image(fig: go.Figure, path: str | Path, /) -> Path:
    """Write ``fig`` as the image format of ``path``'s suffix (.png, .svg, .pdf)."""
    suffix = Path(path).suffix.lower()
    if suffix not in IMAGE_FORMATS:
        raise PipesimError(
            f"cannot tell the image format of {str(path)!r}; give a name ending in "
            f"{', '.join(IMAGE_FORMATS)}"
        )
    return write_bytes(path, to_image(fig, fmt=IMAGE_FORMATS[suffix]))
