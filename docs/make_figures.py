"""Make the README's pictures from a real run of the example study.

    .venv/bin/python docs/make_figures.py        # needs tmux (a real terminal for the live view)

1. runs `python -m sweep run studies/digits_mlp.yaml` (in a temporary workdir, saving every 200
   steps) in a tmux pane,
   captures the pane while a trial is half-way: docs/progress.png;
2. kills the run with SIGKILL right there, runs the same command again and captures the restart's
   decisions and the resumed trial's first new step: docs/restart.png;
3. `python -m sweep plot` on the finished study; the killed trial's learning curve (with its
   resume marker) becomes docs/learning_curve.png.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from PIL import Image, ImageDraw, ImageFont
from rich.console import Console
from rich.text import Text

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
COLS, ROWS = 118, 26


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


def pane(session: str, history: bool = False) -> str:
    return tmux("capture-pane", "-e", "-p", "-t", session, *(["-S", "-200"] if history else []))


def wait_pane(session: str, pattern: str, timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = pane(session)
        if re.search(pattern, re.sub(r"\x1b\[[0-9;]*m", "", text)):
            return text
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {pattern!r}:\n{pane(session, history=True)}")


def render(ansi: str, path: Path, title: str) -> None:
    """Draw captured terminal text (with its ANSI colours) as a PNG."""
    import matplotlib

    font_path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSansMono.ttf"
    font, bold = ImageFont.truetype(str(font_path), 15), ImageFont.truetype(
        str(font_path.with_name("DejaVuSansMono-Bold.ttf")), 15)
    lines = ansi.rstrip("\n").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    cw, ch, pad = 9, 19, 14
    img = Image.new("RGB", (COLS * cw + 2 * pad, (len(lines) + 1) * ch + 2 * pad + 8), (30, 30, 36))
    draw = ImageDraw.Draw(img)
    draw.text((pad, pad), title, fill=(150, 150, 160), font=font)
    console = Console(width=COLS * 2, force_terminal=True, color_system="truecolor")
    for row, line in enumerate(lines):
        x, y = pad, pad + (row + 1) * ch + 8
        for seg in Text.from_ansi(line).render(console):
            style = seg.style
            color = (215, 215, 220)
            if style is not None and style.color is not None and not style.color.is_default:
                tc = style.color.get_truecolor()
                color = (tc.red, tc.green, tc.blue)
            draw.text((x, y), seg.text, fill=color, font=bold if style is not None and style.bold else font)
            x += cw * len(seg.text)
    img.save(path)


def attempt(work: Path, session: str) -> bool:
    """One kill-and-resume; False when the killed trial had no checkpoint yet (the view lags ~0.5 s)."""
    raw = yaml.safe_load((REPO / "studies" / "digits_mlp.yaml").read_text())
    raw["workdir"] = str(work / "runs")
    # Saves every 200 steps (the example saves every 30 s, longer than its trials): the killed
    # trial resumes from a checkpoint, which the learning curve marks.
    raw["checkpoint"] = {"every_steps": 200, "keep_last": 2, "keep_best": 1}
    study = work / "digits_mlp.yaml"
    study.write_text(yaml.safe_dump(raw, sort_keys=False))
    command = f"cd {work} && {sys.executable} -m sweep run {study}; sleep 600"
    tmux("new-session", "-d", "-s", session, "-x", str(COLS), "-y", str(ROWS), command)
    shot = wait_pane(session, r"\b([3-9]|1[0-5])\s+\S+\s+([6-9]|1[0-7])\d\d/2000 .*ago")
    pid = int(tmux("list-panes", "-t", session, "-F", "#{pane_pid}").strip())
    victim = subprocess.run(["pgrep", "-P", str(pid), "-f", "sweep run"], capture_output=True, text=True)
    os.kill(int(victim.stdout.split()[0]), signal.SIGKILL)
    tmux("kill-session", "-t", session)
    tmux("new-session", "-d", "-s", session, "-x", str(COLS), "-y", str(ROWS), command)
    decided = wait_pane(session, r"trial \d+: interrupted, will resume from")
    m = re.search(r"trial (\d+): interrupted, will resume from its newest checkpoint", decided)
    if m is None:
        return False
    killed = int(m.group(1))
    restart = wait_pane(session, rf"trial {killed}: training again")
    render(shot, DOCS / "progress.png", "$ python -m sweep run studies/digits_mlp.yaml")
    render(restart, DOCS / "restart.png", "$ python -m sweep run studies/digits_mlp.yaml   # again, after kill -9")
    wait_pane(session, r"best trial: \d+")
    subprocess.run([sys.executable, "-m", "sweep", "plot", str(study), "--out", str(work / "plots")],
                   check=True, cwd=work, capture_output=True)
    shutil.copy(work / "plots" / "curves" / f"trial_{killed:04d}.png", DOCS / "learning_curve.png")
    shutil.copy(work / "plots" / "optimization_history.png", DOCS / "optimization_history.png")
    print(f"killed trial {killed}; wrote docs/progress.png, restart.png, learning_curve.png, "
          "optimization_history.png")
    return True


def main() -> None:
    session = "sweep-figures"
    for _ in range(5):
        work = Path(tempfile.mkdtemp(prefix="sweep-figures-"))
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        try:
            if attempt(work, session):
                return
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
            shutil.rmtree(work, ignore_errors=True)
    raise SystemExit("no attempt killed a trial that had a checkpoint")


if __name__ == "__main__":
    main()
