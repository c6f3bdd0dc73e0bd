"""The one exception type users see: a problem and its fix, printed as one line."""


class DiffmeterError(Exception):
    """A user-facing error. The CLI prints ``str(error)`` and exits with code 2."""
