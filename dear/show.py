"""Draw a stored debate as one self-contained HTML page (inline SVG and CSS; nothing is fetched).

    python -m dear.show results/eval-gsm8k-n60-v2/traces/gsm8k/dear.jsonl --question test-1161 --html debate.html
    python -m dear.show traces.jsonl --html debate.html --png debate.png   # a file of one question

TRACE.jsonl is a trace file as `eval.run` and `dear.infer --out` write them (one DebateTrace per line). The
picture (dear/debate/picture.py): rounds as columns, agents as rows, who read whom as arrows, each turn's answer,
T / top-p where a call was made, tokens, the final vote. `--png` also takes a headless Chromium screenshot of it
(Debian package `chromium`).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from dear.cli import USER_ERRORS, command_line
from dear.cli import run as run_cli
from dear.debate.picture import write_html
from dear.debate.trace import DebateTrace, read_jsonl
from dear.integrity import check_output_file

PROG = "python -m dear.show"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "chromium-headless-shell", "google-chrome")
SHOWN_IDS = 8  # question ids an error lists


class ChromiumError(RuntimeError):
    """Headless Chromium failed or wrote nothing."""


def read_traces(path: str | Path) -> list[DebateTrace]:
    """Every debate of a trace file; a missing file, an empty one or a bad line (file:line) is a user error."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such trace file")
    traces = read_jsonl(path)
    if not traces:
        raise ValueError(f"{path}: no debates in the file")
    return traces


def question_ids(traces: Sequence[DebateTrace]) -> list[str]:
    return list(dict.fromkeys(t.question_id for t in traces))


def some_ids(ids: Sequence[str]) -> str:
    more = f", ... ({len(ids)} in all)" if len(ids) > SHOWN_IDS else ""
    return ", ".join(ids[:SHOWN_IDS]) + more


def select_debates(traces: Sequence[DebateTrace], question: str | None, path: str | Path) -> list[DebateTrace]:
    """The debates of `question` (all of them if the file repeats it); with no question, the file's only one."""
    ids = question_ids(traces)
    if question is None:
        if len(ids) > 1:
            raise ValueError(f"{path} has debates of {len(ids)} questions: choose one with --question "
                             f"(e.g. {some_ids(ids)})")
        return list(traces)
    chosen = [t for t in traces if t.question_id == question]
    if not chosen:
        raise ValueError(f"{path}: no debate of question {question!r}; its questions: {some_ids(ids)}")
    return chosen


def find_chromium() -> str | None:
    """The path of a Chromium (or Chrome) binary on PATH, None when there is none."""
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def chromium_command(binary: str, page: Path, profile: str, *flags: str) -> list[str]:
    """A headless run on a throwaway profile (two runs at once must not share one); no sandbox, since CI runs
    as root."""
    return [binary, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
            f"--user-data-dir={profile}", *flags, page.resolve().as_uri()]


def run_chromium(page: str | Path, *flags: str, timeout: float = 120) -> str:
    """Run headless Chromium on a local page with `flags` (e.g. --dump-dom); returns its standard output."""
    binary = find_chromium()
    if binary is None:
        raise FileNotFoundError(f"no Chromium binary on PATH ({', '.join(CHROMIUM_NAMES)}); on Debian: "
                                "apt-get install chromium")
    with tempfile.TemporaryDirectory(prefix="dear-chromium-") as profile:
        done = subprocess.run(chromium_command(binary, Path(page), profile, *flags), capture_output=True,
                              text=True, timeout=timeout)
    if done.returncode != 0:
        raise ChromiumError(f"{binary} exited with {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout


def screenshot(page: str | Path, png: str | Path, window: str = "1400,900") -> Path:
    """A PNG of the page as headless Chromium draws it in a window of `window` ("width,height") pixels."""
    png = Path(png).resolve()
    run_chromium(page, f"--screenshot={png}", f"--window-size={window}")
    if not png.is_file():
        raise ChromiumError(f"Chromium wrote no screenshot to {png}")
    return png


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    summary, details = __doc__.split("\n\n", 1)
    p = argparse.ArgumentParser(prog=PROG, description=summary, epilog=details,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", metavar="TRACE.jsonl", help="a trace file (eval.run's traces/TASK/METHOD.jsonl, "
                                                          "dear.infer --out)")
    p.add_argument("--question", help="question id to draw (needed when the file has several questions)")
    p.add_argument("--html", required=True, help="write the picture here (one self-contained HTML file)")
    p.add_argument("--png", help="also write a headless Chromium screenshot of it here")
    p.add_argument("--window-size", default="1400,900", help="screenshot window, WIDTH,HEIGHT (default 1400,900)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    check_output_file(a.html, "--html")
    if a.png:
        check_output_file(a.png, "--png")
    debates = select_debates(read_traces(a.traces), a.question, a.traces)
    page = write_html(debates, a.html, command=command_line(PROG, argv))
    print(f"picture of {len(debates)} debate(s) -> {page}")
    if a.png:
        print(f"screenshot -> {screenshot(page, a.png, a.window_size)}")
    return 0


if __name__ == "__main__":
    run_cli(main, PROG, errors=(*USER_ERRORS, ChromiumError))
