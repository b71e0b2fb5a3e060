"""meshplan's errors: one hierarchy, one line each that says what to fix, about the user's inputs.

Every layer raises these; the command line (`meshplan.cli.main`) prints them as `meshplan: error: ...` with no
traceback, naming the flag of the input at fault, and the UIs show them beside their own widget. Anything else
(an AttributeError, a KeyError) is a bug and keeps its traceback.
"""

from __future__ import annotations


class MeshplanError(ValueError):
    """A problem with the user's input. `field`: the input at fault, by its field name (`tp`, `seq_len`), when
    one is; messages then start with that name, which the CLI turns into its flag (`--tp`)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field

    def for_cli(self) -> str:
        """The message with its leading field name written as the command line's flag."""
        text = str(self)
        if self.field and text.startswith(self.field) and self.field.isidentifier():
            return "--" + self.field.replace("_", "-") + text[len(self.field):]
        return text


class InputError(MeshplanError):
    """A value, name or size the user gave that cannot be used (unknown model, negative size, bad name)."""


class ConfigError(MeshplanError):
    """A parallel configuration the rules reject (degrees that do not divide, a schedule that cannot fill)."""


class DataFileError(MeshplanError):
    """A file the user gave that cannot be read as what it should be (YAML, JSON, CSV, a profile)."""


class LaunchError(MeshplanError):
    """A launch this machine or engine cannot do (no torchrun, no CUDA for a CUDA run, a run dir of another plan)."""


class CheckpointError(MeshplanError):
    """A run directory or checkpoint that cannot be resumed (damaged, of another plan, missing)."""
