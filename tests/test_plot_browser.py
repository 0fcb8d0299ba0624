"""`pipesim plot` HTML opened in a real headless browser (Debian's chromium).

What a user would see is checked three ways, each with a negative control so
that the check itself can fail:

- the page renders without script errors: a collector injected before plotly.js
  records ``window.onerror``, unhandled rejections and ``console.error``, and
  chromium's own console log must stay empty (control: a page that throws);
- plotly drew the figure: the DOM after load holds plotly's ``main-svg`` and one
  ``g.point`` per bar (actions + idle gaps + transfers), counted independently
  from the schedule's closed forms;
- it opens offline: every host name is unresolvable (``--host-resolver-rules``),
  yet the default file renders, while the ``--cdn`` variant cannot (control);
- a screenshot is non-blank and shows the F and B colours (decoded here with
  zlib, no image library).

These tests need chromium, or the Chrome that ``BROWSER_PATH`` names (CI: the runner's
Google Chrome). They fail (never skip) when it is missing: ``make browser-deps`` (run by
``make test``) installs chromium as root with apt.
"""

from __future__ import annotations

import re
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from helpers import browser_path

from pipesim.cli import main
from pipesim.plot.style import OP_COLORS

pytestmark = pytest.mark.browser

_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=8000",  # let plotly finish drawing before the DOM or PNG is taken
    "--host-resolver-rules=MAP * ~NOTFOUND",  # offline: no host name resolves
)

# Injected first in <head>: records every script error into the DOM for --dump-dom.
_COLLECTOR = """<script>
window.__errors = [];
window.addEventListener("error", e => window.__errors.push("error: " + e.message));
window.addEventListener("unhandledrejection", e => window.__errors.push("rejection: " + e.reason));
const __consoleError = console.error;
console.error = (...a) => { window.__errors.push("console.error: " + a.join(" ")); };
window.addEventListener("load", () => setTimeout(() => {
  const out = document.createElement("pre");
  out.id = "pipesim-js-errors";
  out.textContent = "[" + window.__errors.join(" | ") + "]";
  document.body.appendChild(out);
}, 0));
</script>"""


@pytest.fixture(scope="module")
def chromium() -> str:
    return browser_path()


def _run(chromium: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    return subprocess.run(
        [chromium, *_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _with_collector(html: Path, out: Path) -> Path:
    text = html.read_text(encoding="utf-8")
    assert "<head>" in text
    out.write_text(text.replace("<head>", "<head>" + _COLLECTOR, 1), encoding="utf-8")
    return out


def _dump(chromium: str, tmp: Path, page: Path) -> tuple[str, list[str]]:
    """The DOM after load, and chromium's console lines."""
    result = _run(chromium, tmp, "--dump-dom", page.resolve().as_uri())
    assert result.returncode == 0, result.stderr[-2000:]
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    return result.stdout, console


def _js_errors(dom: str) -> str:
    match = re.search(r'<pre id="pipesim-js-errors">(.*?)</pre>', dom, re.S)
    assert match is not None, "the error collector never ran: the page did not finish loading"
    return match.group(1)


# -- PNG decoding (RFC 2083), enough for chromium's 8-bit RGB / RGBA screenshots -------
def _decode_png(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, channels, raw pixel bytes) of an 8-bit, non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert header is not None
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and interlace == 0 and color in (2, 6), header
    channels = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    out = bytearray(height * stride)
    previous = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        if kind == 1:
            for i in range(channels, stride):
                line[i] = (line[i] + line[i - channels]) & 0xFF
        elif kind == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, previous, strict=True))
        elif kind == 3:
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                line[i] = (line[i] + ((left + previous[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                a = line[i - channels] if i >= channels else 0
                b = previous[i]
                c = previous[i - channels] if i >= channels else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        out[y * stride : (y + 1) * stride] = line
        previous = line
    return width, height, channels, bytes(out)


def _rgb(hex_color: str) -> tuple[int, int, int]:
    return tuple(int(hex_color[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def _pixel_counts(png: Path) -> tuple[int, int, dict[tuple[int, int, int], int]]:
    width, height, channels, pixels = _decode_png(png.read_bytes())
    counts: dict[tuple[int, int, int], int] = {}
    for i in range(0, len(pixels), channels):
        rgb = (pixels[i], pixels[i + 1], pixels[i + 2])
        counts[rgb] = counts.get(rgb, 0) + 1
    return width, height, counts


# -- tests -----------------------------------------------------------------------------
def test_detector_catches_script_errors(chromium: str, tmp_path: Path) -> None:
    """Negative control: a page that throws is caught by both error checks."""
    page = tmp_path / "broken.html"
    page.write_text(
        "<html><head></head><body><script>throw new Error('boom')</script></body></html>"
    )
    dom, console = _dump(chromium, tmp_path, _with_collector(page, tmp_path / "b2.html"))
    assert "boom" in _js_errors(dom)
    assert any("Uncaught Error: boom" in line for line in console)


def test_timeline_renders_offline_without_errors(chromium: str, tmp_path: Path) -> None:
    html = tmp_path / "timeline.html"
    # 1F1B, p=4, m=8 with a link latency: 2 p m = 64 actions, 2 (p-1) m = 48 transfers,
    # plus one bar per idle gap.
    status = main(
        [
            "plot",
            "1f1b",
            "-p",
            "4",
            "-m",
            "8",
            "--link-latency",
            "0.5",
            "--activation-bytes",
            "100",
            "--memory-capacity",
            "500",
            "-o",
            str(html),
        ]
    )
    assert status == 0
    dom, console = _dump(chromium, tmp_path, _with_collector(html, tmp_path / "page.html"))
    assert _js_errors(dom) == "[]"
    assert console == []
    assert dom.count('class="main-svg"') >= 2  # plotly's SVG layers exist
    from pipesim import CostModel, Link, generate, simulate
    from pipesim.metrics import idle_intervals

    sim = simulate(
        generate("1f1b", n_ranks=4, n_microbatches=8),
        costs=CostModel.uniform(link=Link(latency="0.5"), activation_bytes=100),
    )
    n_idle = sum(len(idle_intervals(sim.trace, r)) for r in range(4))
    assert dom.count('class="point"') == 64 + 48 + n_idle
    assert "rank 3" in dom and "link 3→2" in dom  # tick labels drawn
    assert "makespan" in dom  # the title line


def test_cdn_variant_needs_the_network(chromium: str, tmp_path: Path) -> None:
    """Control for the offline check: with no network the CDN file draws nothing."""
    html = tmp_path / "cdn.html"
    assert main(["plot", "gpipe", "-p", "2", "-m", "4", "--cdn", "-o", str(html)]) == 0
    dom, _ = _dump(chromium, tmp_path, _with_collector(html, tmp_path / "page.html"))
    assert 'class="main-svg"' not in dom
    assert "Plotly is not defined" in _js_errors(dom)


def test_compare_renders_without_errors(chromium: str, tmp_path: Path) -> None:
    html = tmp_path / "compare.html"
    status = main(
        [
            "plot",
            "gpipe",
            "1f1b",
            "interleaved-1f1b:virtual=2",
            "--compare",
            "-p",
            "4",
            "-m",
            "8",
            "-o",
            str(html),
        ]
    )
    assert status == 0
    dom, console = _dump(chromium, tmp_path, _with_collector(html, tmp_path / "page.html"))
    assert _js_errors(dom) == "[]" and console == []
    # 2 p m actions for GPipe and 1F1B, 2 p v m for interleaved, plus idle gaps.
    assert dom.count('class="point"') > 64 + 64 + 128
    assert "1f1b p=4 m=8" in dom and "interleaved-1f1b p=4 m=8 v=2" in dom


def test_screenshot_is_not_blank(chromium: str, tmp_path: Path) -> None:
    html = tmp_path / "timeline.html"
    assert main(["plot", "1f1b", "-p", "4", "-m", "8", "-o", str(html)]) == 0
    png = tmp_path / "shot.png"
    result = _run(
        chromium, tmp_path, f"--screenshot={png}", "--window-size=900,700", html.resolve().as_uri()
    )
    assert result.returncode == 0 and png.exists(), result.stderr[-2000:]
    width, height, counts = _pixel_counts(png)
    assert (width, height) == (900, 700)
    total = width * height
    white = counts.get((255, 255, 255), 0)
    assert total - white > 0.10 * total  # a blank page would be all white
    assert len(counts) > 50
    # The bars are solid fills in the op colours: thousands of exact pixels each.
    assert counts.get(_rgb(OP_COLORS["F"]), 0) > 2000
    assert counts.get(_rgb(OP_COLORS["B"]), 0) > 2000
    assert counts.get(_rgb(OP_COLORS["idle"]), 0) > 2000


def test_png_decoder_on_a_known_image() -> None:
    """The decoder itself, on a 2x2 image built here with every filter type."""
    pixels = [[(255, 0, 0), (0, 255, 0)], [(0, 0, 255), (10, 20, 30)]]
    rows = b""
    for y, row in enumerate(pixels):
        raw = bytes(c for px in row for c in px)
        if y == 0:
            rows += b"\x01" + raw[:3] + bytes((raw[i] - raw[i - 3]) & 0xFF for i in range(3, 6))
        else:
            up = bytes(c for px in pixels[0] for c in px)
            rows += b"\x02" + bytes((a - b) & 0xFF for a, b in zip(raw, up, strict=True))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
    width, height, channels, data = _decode_png(png)
    assert (width, height, channels) == (2, 2, 3)
    assert data == bytes(c for row in pixels for px in row for c in px)


@pytest.mark.slow
def test_large_schedule_renders(chromium: str, tmp_path: Path) -> None:
    """32 ranks x 256 micro-batches of 1F1B: 16,384 action bars, all drawn, no errors."""
    html = tmp_path / "big.html"
    assert (
        main(["plot", "1f1b", "-p", "32", "-m", "256", "--activation-bytes", "1", "-o", str(html)])
        == 0
    )
    dom, console = _dump(chromium, tmp_path, _with_collector(html, tmp_path / "page.html"))
    assert _js_errors(dom) == "[]" and console == []
    # Plus one bar per idle gap, counted from the trace.
    from pipesim import generate, simulate
    from pipesim.metrics import idle_intervals

    sim = simulate(generate("1f1b", n_ranks=32, n_microbatches=256))
    n_idle = sum(len(idle_intervals(sim.trace, r)) for r in range(32))
    assert dom.count('class="point"') == 2 * 32 * 256 + n_idle


# -- reading at a glance: ticks, units, chunks, capacity, large pages, images -------------
def test_ticks_and_units_on_every_panel(chromium: str, tmp_path: Path) -> None:
    html = tmp_path / "compare.html"
    argv = ["plot", "gpipe", "1f1b", "--compare", "-p", "4", "-m", "8"]
    assert main([*argv, "--activation-bytes", "3e6", "-o", str(html)]) == 0
    dom, console = _dump(chromium, tmp_path, _with_collector(html, tmp_path / "page.html"))
    assert _js_errors(dom) == "[]" and console == []
    # two schedule panels and the memory panel: each has its own time axis title and ticks
    assert dom.count(">time (units)<") == 3
    ticks = {}
    for axis in ("x", "x2", "x3"):  # tick labels under every panel, from 0 up to 33
        labels = re.findall(rf'<g class="{axis}tick"><text[^>]*>([^<]*)<', dom)
        values = [float(label) for label in labels]
        assert len(values) >= 4 and values[0] == 0 and values == sorted(values), (axis, labels)
        assert values[-1] <= 33
        ticks[axis] = values
    assert ticks["x"] == ticks["x2"] == ticks["x3"]  # one shared time axis
    # 1F1B / GPipe peaks of 4 and 8 micro-batches of 3e6 bytes: MiB, never "15B"-style
    assert ">activation memory (MiB)<" in dom
    assert "<title>2 schedules on one time axis · pipesim</title>" in dom


def test_chunks_and_over_capacity_are_visible(chromium: str, tmp_path: Path) -> None:
    from pipesim.plot.memory import OVER_CAPACITY_COLOR
    from pipesim.plot.style import shade

    html = tmp_path / "il.html"
    argv = ["plot", "interleaved-1f1b", "-p", "4", "-m", "8", "-v", "2"]
    flags = ["--activation-bytes", "100", "--memory-capacity", "500", "-o", str(html)]
    assert main([*argv, *flags]) == 0
    png = tmp_path / "shot.png"
    result = _run(
        chromium, tmp_path, f"--screenshot={png}", "--window-size=1100,800", html.resolve().as_uri()
    )
    assert result.returncode == 0, result.stderr[-2000:]
    _, _, counts = _pixel_counts(png)
    assert counts.get(_rgb(OP_COLORS["F"]), 0) > 500  # chunk 0 in the forward colour
    assert counts.get(_rgb(shade(OP_COLORS["F"], 1, 2)), 0) > 500  # chunk 1 darker
    assert counts.get(_rgb(OVER_CAPACITY_COLOR), 0) > 300  # memory above 500 B drawn red


@pytest.mark.slow
def test_very_large_schedule_page_is_small_and_renders(chromium: str, tmp_path: Path) -> None:
    """64 ranks x 1024 micro-batches (131,072 actions) of 1F1B: drawn binned, the page
    stays a few MB and renders without errors within a minute (it was 11.7 MB of bars
    that a browser could not draw)."""
    import time

    html = tmp_path / "huge.html"
    argv = ["plot", "1f1b", "-p", "64", "-m", "1024", "--activation-bytes", "1e6"]
    assert main([*argv, "-o", str(html)]) == 0
    size = html.stat().st_size
    assert size < 6_000_000  # plotly.js is ~4.7 MB of it
    started = time.monotonic()
    dom, console = _dump(chromium, tmp_path, _with_collector(html, tmp_path / "page.html"))
    elapsed = time.monotonic() - started
    assert _js_errors(dom) == "[]" and console == []
    assert "<image" in dom and "time bins" in dom  # one picture, and the page says so
    assert 'class="point"' not in dom  # no bar drawn one by one
    assert "rank 63" in dom and ">time (units)<" in dom
    assert elapsed < 60, f"the page took {elapsed:.0f} s to render"


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_static_images(suffix: str, tmp_path: Path, chromium: str) -> None:
    """``-o x.png|svg|pdf`` through kaleido and the system chromium."""
    target = tmp_path / f"timeline{suffix}"
    argv = ["plot", "1f1b", "-p", "4", "-m", "8", "--activation-bytes", "100"]
    assert main([*argv, "-o", str(target)]) == 0
    data = target.read_bytes()
    if suffix == ".png":
        width, height, counts = _pixel_counts(target)
        assert width == 1100 and height > 400
        assert counts.get(_rgb(OP_COLORS["F"]), 0) > 2000
        assert counts.get(_rgb(OP_COLORS["B"]), 0) > 2000
    elif suffix == ".svg":
        text = data.decode("utf-8")
        assert text.lstrip().startswith("<svg") and "time (units)" in text
        assert "1f1b: 4 ranks" in text
    else:
        assert data.startswith(b"%PDF") and len(data) > 5_000


@pytest.mark.parametrize("container", ["trace", "verify report"])
def test_measured_overlay_renders(container: str, chromium: str, tmp_path: Path) -> None:
    """``plot --measured``: both sides drawn, one bar per action each, no script error;
    from a trace file or from a verify JSON report that embeds it (``measured_trace``)."""
    import json

    from pipesim import CostModel, generate, save_trace, simulate

    schedule = generate("1f1b", n_ranks=2, n_microbatches=4)
    slow = simulate(schedule, costs=CostModel.uniform(forward=5, backward=8, time_unit="ms"))
    trace = save_trace(
        slow.trace,
        tmp_path / "m.json",
        schedule=schedule,
        costs=CostModel.uniform(forward=4, backward=8, time_unit="ms"),
    )
    if container == "verify report":  # the keys `pipesim verify --json` writes around it
        report = {"bit_identical": True, "measured_trace": json.loads(trace.read_text())}
        trace = tmp_path / "report.json"
        trace.write_text(json.dumps(report))
    html = tmp_path / "overlay.html"
    assert main(["plot", "--measured", str(trace), "-o", str(html)]) == 0
    dom, console = _dump(chromium, tmp_path, _with_collector(html, tmp_path / "page.html"))
    assert _js_errors(dom) == "[]" and console == []
    assert dom.count('class="point"') == 2 * 16  # 16 actions, predicted and measured
    assert "rank 1 measured" in dom and ">time (ms)<" in dom
    assert "F +0.0%" not in dom and "F -20.0%" in dom  # 4 ms predicted against 5 measured


def test_comms_schedule_draws_its_sends_and_receives(
    chromium: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipesim import CostModel, Link, generate, simulate
    from pipesim.comms import comms_to_csv, lower_comms
    from pipesim.metrics import idle_intervals

    # 1F1B, p=4, m=8 as torch's compute_comms CSV: 2 (p-1) m = 48 messages, each a send
    # mark and a receive mark (plotly draws a marker as <path class="point ...">, a bar as
    # <g class="point">): 96 marks; 64 actions, 48 transfers and the idle gaps as bars.
    comms = lower_comms(generate("1f1b", n_ranks=4, n_microbatches=8))
    csv_path, html = tmp_path / "x.csv", tmp_path / "comms.html"
    csv_path.write_text(comms_to_csv(comms))
    argv = ["plot", str(csv_path), "--link-latency", "0.5", "--no-memory", "-o", str(html)]
    assert main(argv) == 0
    assert "comms schedule: 48 sends, 48 receives" in capsys.readouterr().out
    dom, console = _dump(chromium, tmp_path, _with_collector(html, tmp_path / "page.html"))
    assert _js_errors(dom) == "[]" and console == []
    assert dom.count('<path class="point') == 96
    sim = simulate(comms, costs=CostModel.uniform(link=Link(latency="0.5")))
    n_idle = sum(len(idle_intervals(sim.trace, r)) for r in range(4))
    assert dom.count('<g class="point"') == 64 + 48 + n_idle


def test_plan_report_renders_with_binary_units(chromium: str, tmp_path: Path) -> None:
    """``plan -o plan.html``: the chart draws, no script error, every amount of memory in
    binary units (the axis in GiB for an 80 GB H100, whose usable 71.7 GiB it marks)."""
    import json

    tiny = ["plan", "--layers", "4", "--hidden", "256", "--heads", "4", "--seq-length", "128"]
    tiny += ["--vocab", "1000", "--devices", "2", "--accelerator", "h100-sxm"]
    tiny += ["--global-batch", "4", "--workers", "1", "--min-mfu", "0", "--no-progress"]
    assert main([*tiny, "-o", str(tmp_path / "plan.json")]) == 0
    data = json.loads((tmp_path / "plan.json").read_text())
    assert main([*tiny, "-o", str(tmp_path / "plan.html")]) == 0
    page = _with_collector(tmp_path / "plan.html", tmp_path / "page.html")
    dom, console = _dump(chromium, tmp_path, page)
    assert _js_errors(dom) == "[]" and console == []
    # oracle: 81,559 MiB (the driver's H100 figure) less 10% headroom, in GiB
    usable = 81_559 * 2**20 * 0.9 / 2**30
    assert data["usable_memory_bytes"] == int(81_559 * 2**20 * 0.9)
    assert "peak memory per device (GiB)" in dom and f"usable {usable:.3g} GiB" in dom
    # drawn: every simulated point up to 4x the fastest that fits and 2x the usable memory
    simulated = [p for p in data["points"] if p["step_time_s"] is not None]
    ceiling = 4 * min(p["step_time_s"] for p in simulated if p["fits"])
    limit = 2 * data["usable_memory_bytes"]
    shown = [
        p for p in simulated if p["step_time_s"] <= ceiling and p["peak_memory_bytes"] <= limit
    ]
    assert dom.count('class="point"') == len(shown) > 0
    # the note under the chart, beside the line's label (not in place of it)
    assert f"{len(simulated) - len(shown)} configurations slower than" in dom
    # the table's unit: the largest peak shown is under 1 GiB, so MiB or KiB, never GB
    peaks = [p["peak_memory_bytes"] for p in data["points"] if p["fits"]]
    unit = "MiB" if max(peaks) >= 2**20 else "KiB"
    assert f"<th>memory {unit}</th>" in dom
    assert not re.search(r"[0-9] ?GB\b(?!/s)", dom)  # no amount of bytes in SI units
