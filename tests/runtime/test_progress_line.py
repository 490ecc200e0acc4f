"""The step line (runtime/train/progress.py): rewritten in place on a terminal, plain lines when piped."""

from __future__ import annotations

import io

from runtime.train.progress import StepLine


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_sees_one_line_rewritten_and_the_lines_that_stay():
    out = Terminal()
    line = StepLine(out)
    line.step("step 1/3  loss 5.0000  ETA 0:00:02")
    line.step("step 2/3  loss 4.5")  # shorter: blanks cover the rest of the previous text
    line.keep("eval step 2  loss 4.4")
    line.step("step 3/3  loss 4.0")
    line.keep("summary")
    text = out.getvalue()
    assert text.split("\n") == ["\rstep 1/3  loss 5.0000  ETA 0:00:02\rstep 2/3  loss 4.5" + " " * 16,
                                "eval step 2  loss 4.4", "\rstep 3/3  loss 4.0", "summary", ""]


def test_piped_output_gets_a_line_per_step():
    out = io.StringIO()  # isatty() is False, as for a file, a pipe or autoplan run's supervisor
    line = StepLine(out)
    line.step("step 1/2  loss 5.0")
    line.step("step 2/2  loss 4.0")
    line.keep("summary")
    assert out.getvalue() == "step 1/2  loss 5.0\nstep 2/2  loss 4.0\nsummary\n"
