"""The one exception type the CLI turns into a one-line message and a non-zero exit."""


class UrewriteError(Exception):
    """A problem with the user's input: printed as one line, never as a traceback."""
