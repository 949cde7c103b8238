"""Errors a user can act on.

Every error that reaches the CLI is a :class:`BloomlineError`; the CLI prints its message
on one line and exits with status 2, without a traceback. Anything else is a bug.
"""


class BloomlineError(Exception):
    """A problem with the user's input, configuration or data (not a bug)."""


class ConfigError(BloomlineError):
    """A configuration value is unknown, of the wrong type or out of range.

    ``key`` is the dotted path of the offending key (``dedup.threshold``), so the message can
    name it even when the error was raised deep inside a nested config.
    """

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = message
        super().__init__(f"config key '{key}': {message}" if key else message)


class DataError(BloomlineError):
    """Input data or an intermediate file is missing, unreadable or corrupt."""


class CheckpointError(BloomlineError):
    """A checkpoint folder is missing, incomplete, of another format, or inconsistent
    (``training/CHECKPOINT.md``); the message names the file and the field."""
