"""The step line: one line rewritten in place on a terminal, plain lines when the output is piped.

A training run prints a line per step (step, loss, time, tokens/s, peak memory, ETA). On a terminal those
lines scroll the screen for hours; there the line is rewritten in place (carriage return, the new text,
spaces over what the longer previous text left), and only lines that must stay -- an evaluation result,
the summary -- move to a new line. Piped or redirected (a log file, ``autoplan run``'s supervisor, a
batch scheduler's output), every step is its own line, as logs expect.
"""

from __future__ import annotations

import sys
from typing import TextIO


class StepLine:
    """Where rank 0 prints its step lines (``stream`` default: stdout)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout
        isatty = getattr(self.stream, "isatty", None)
        self.in_place = bool(isatty and isatty())
        self._width = 0
        """Characters of the line now shown in place (0: none)."""

    def step(self, text: str) -> None:
        """Show a step's line: in place on a terminal, else as a line of its own."""
        if not self.in_place:
            print(text, file=self.stream, flush=True)
            return
        self.stream.write("\r" + text + " " * max(0, self._width - len(text)))
        self.stream.flush()
        self._width = len(text)

    def keep(self, text: str) -> None:
        """A line that stays (an evaluation, the summary): below the step line, which it leaves in view."""
        self.end()
        print(text, file=self.stream, flush=True)

    def end(self) -> None:
        """Close the line shown in place, so what follows starts on a new line."""
        if self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0
