"""The one exception type users see: a problem and its fix, printed as one line."""


class DiffmeterError(Exception):
    """A user-facing error. The CLI prints ``str(error)`` and exits with code 2."""


class MissingPackage(DiffmeterError):
    """A technique would apply, but the optional package it needs is not installed."""


class DoesNotFit(DiffmeterError):
    """A run refused up front because its lower-bound memory exceeds what the device has."""


def validation_problem(error, whole: str) -> str:
    """A pydantic ``ValidationError``'s first problem as "where: what"; ``whole`` names the place where the problem
    is the input itself (an empty location, as a list given for an object)."""
    problem = error.errors()[0]
    return f"{'.'.join(str(part) for part in problem['loc']) or whole}: {problem['msg']}"
