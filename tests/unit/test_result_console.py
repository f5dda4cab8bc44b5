"""The commands' one console: a write that failed leaves nothing for the next print."""

import io

import pytest

from tformer_cli.commands.options import ResultConsole


class _Stream:
    """A standard output whose writes fail until `target` is set."""

    target: io.StringIO | None = None

    def write(self, text: str) -> int:
        if self.target is None:
            raise OSError("no space left on device")
        return self.target.write(text)

    def flush(self) -> None:
        pass


def test_the_text_of_a_failed_write_is_not_printed_by_the_next_command():
    stream = _Stream()
    console = ResultConsole(file=stream, highlight=False, soft_wrap=True)  # type: ignore[arg-type]
    with pytest.raises(OSError):
        console.print("checkpoint: an earlier command's output")
    stream.target = io.StringIO()
    console.print("this command's output")
    assert stream.target.getvalue() == "this command's output\n"
