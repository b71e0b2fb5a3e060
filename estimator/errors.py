"""User-facing errors: one line that says what to fix. The CLI prints them without a traceback."""


class MeshplanError(ValueError):
    """A problem with the user's input (unknown name, impossible degree, malformed file, ...)."""
