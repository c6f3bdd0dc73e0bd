"""The one exception type users see: a problem and its fix, printed as one line."""


class DiffmeterError(Exception):
    """A user-facing error. The CLI prints ``str(error)`` and exits with code 2."""


class MissingPackage(DiffmeterError):
    """A technique would apply, but the optional package it needs is not installed."""


class DoesNotFit(DiffmeterError):
    """A run refused up front because its lower-bound memory exceeds what the device has."""
