"""Where a report goes: stdout, or a file."""

from __future__ import annotations

from typing import Optional, TextIO


class Sink:
    """The report's destination: stdout, or a file opened at the first write, so that
    a command that cannot be started leaves no file."""

    def __init__(self, path: Optional[str], stdout: TextIO):
        self.path, self.stdout, self.file = path, stdout, None

    def write(self, text: str) -> None:
        if self.path is None:
            self.stdout.write(text)
            self.stdout.flush()
            return
        if self.file is None:
            self.file = open(self.path, "w")
        self.file.write(text)
        self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
