"""The one exception type the command line turns into a one-line message and a non-zero
exit. Every layer may raise it: it imports nothing of urewrite's (docs/design.md,
"Layout")."""


class UrewriteError(Exception):
    """A problem with the user's input: printed as one line, never as a traceback."""
