"""TensorBoard event files, one run per trial (`<logdir>/trial_NNNN/`), that stay one clean curve
across resumes.

Written with tensorboardX's protobufs and record writer: it needs neither TensorFlow nor PyTorch
(TensorBoard's own `tf.summary` writer needs TensorFlow), is maintained, and its `summary.hparams`
speaks the HParams plugin's format. sweep writes the records itself (not `SummaryWriter`) to
choose the file and when it is flushed: the tracking thread is already off the training thread.

A resumed trial's run is rewritten: each (re)start writes a fresh event file holding the
evaluations stored in Optuna up to the resume step (and the checkpoint notes of the old files up
to it), then deletes the older files, then appends. Evaluations a kill cut off past that step are
computed again bit-identically and written once, so the events are the same whatever the
interruptions (wall times aside).
"""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any, Iterator

from tensorboardX import summary
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.record_writer import RecordWriter

from sweep.tracking.events import TrialStart

CHECKPOINT_TAG = "checkpoints"  # text: "step N saved", at step N
NOTE_TAG = f"{CHECKPOINT_TAG}/text_summary"  # the tag a note's event has: tensorboardX's text summary appends it
EVENTS_INFIX = ".tfevents."  # TensorBoard reads files whose name holds it


def run_dir(logdir: Path, number: int) -> Path:
    return logdir / f"trial_{number:04d}"


class TensorBoardWriter:
    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self._files: dict[int, RecordWriter] = {}

    def start(self, trial: TrialStart) -> None:
        self._close(trial.number)
        folder = run_dir(self.logdir, trial.number)
        folder.mkdir(parents=True, exist_ok=True)
        now = time.time()
        old = sorted(p for p in folder.iterdir() if EVENTS_INFIX in p.name)
        # The saves up to the resume step: those the old files noted, and those still on disk (a
        # kill can come before a commit's note is written). A signal's save is a real one, so the
        # notes are the one part of a run that interruptions may change.
        notes = {e.step: e for e in _events(old) if e.step <= trial.step and _tag(e) == NOTE_TAG}
        for step in trial.saved:
            if step <= trial.step and step not in notes:
                notes[step] = _note(now, step)
        # One file per (re)start, named after the start's time in ns so a restart within the same
        # second never reuses (and then deletes) the file it writes.
        path = folder / f"events.out.tfevents.{time.time_ns()}.sweep"
        writer = RecordWriter(str(path))
        writer.write(Event(wall_time=now, file_version="brain.Event:2").SerializeToString())
        # HParams: an experiment listing the metrics and one session with this trial's values.
        for proto in summary.hparams(_hparam_values(trial.hparams), {m: 0.0 for m in trial.metrics}):
            writer.write(Event(wall_time=now, step=0, summary=proto).SerializeToString())
        kept = {s: m for s, m in trial.history.items() if s <= trial.step}
        for step in sorted(set(kept) | set(notes)):  # in step order: readers purge steps that go back
            for name, value in sorted(kept.get(step, {}).items()):
                writer.write(_scalar(now, step, name, value))
            if step in notes:
                writer.write(notes[step].SerializeToString())
        writer.flush()
        for p in old:  # only once the kept events are on disk: a kill before leaves both, never neither
            p.unlink(missing_ok=True)
        self._files[trial.number] = writer

    def evaluation(self, number: int, step: int, metrics: dict[str, float]) -> None:
        self.evaluations(number, [(step, metrics)])

    def evaluations(self, number: int, rows: list[tuple[int, dict[str, float]]]) -> None:
        writer = self._files.get(number)
        if writer is None:
            return
        now = time.time()
        for step, metrics in rows:
            for name, value in sorted(metrics.items()):
                writer.write(_scalar(now, step, name, value))
        writer.flush()  # once for the batch

    def checkpoint(self, number: int, step: int) -> None:
        writer = self._files.get(number)
        if writer is not None:
            writer.write(_note(time.time(), step).SerializeToString())
            writer.flush()

    def end(self, number: int, state: str, best_step: int | None) -> None:
        self._close(number)

    def close(self) -> None:
        for number in list(self._files):
            self._close(number)

    def _close(self, number: int) -> None:
        writer = self._files.pop(number, None)
        if writer is not None:
            writer.close()


def _scalar(wall_time: float, step: int, name: str, value: float) -> bytes:
    return Event(wall_time=wall_time, step=step, summary=summary.scalar(name, value)).SerializeToString()


def _note(wall_time: float, step: int) -> Event:
    return Event(wall_time=wall_time, step=step, summary=summary.text(CHECKPOINT_TAG, f"step {step} saved"))


def _hparam_values(hparams: dict[str, Any]) -> dict[str, Any]:
    """The values the HParams plugin takes (numbers, strings, bools); others as their repr."""
    return {k: v if isinstance(v, (bool, int, float, str)) else repr(v) for k, v in hparams.items()}


def _tag(event: Event) -> str | None:
    return event.summary.value[0].tag if event.HasField("summary") and event.summary.value else None


def _events(paths: list[Path]) -> Iterator[Event]:
    """The events of TFRecord files, each up to a record a kill cut short (crc not checked: a
    kill only ever truncates the end of the file)."""
    for path in paths:
        try:
            with open(path, "rb") as fh:
                yield from _records(fh)
        except OSError:
            continue


def _records(fh: Any) -> Iterator[Event]:
    while True:
        header = fh.read(12)
        if len(header) < 12:
            return
        (length,) = struct.unpack("<Q", header[:8])
        data = fh.read(length)
        if len(data) < length or len(fh.read(4)) < 4:
            return
        try:
            yield Event.FromString(data)
        except Exception:  # noqa: BLE001 - a garbled record: the rest of the file is not trusted
            return

