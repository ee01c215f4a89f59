"""What eatta's command-line programs and example scripts share.

:class:`HelpFormatter` prints each option's default once, in plain text; :func:`exit_on_user_error`
turns a user's mistake (a missing dataset folder, weights that are not cached, a checkpoint path
that does not exist) into one line on stderr and exit status :data:`USAGE_ERROR`, the status
argparse gives a bad flag. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable

from eatta.data._layout import DatasetLayoutError
from eatta.models.backbones import WeightsUnavailableError

__all__ = [
    "USAGE_ERROR",
    "USER_ERRORS",
    "HelpFormatter",
    "UsageError",
    "exit_on_user_error",
    "says_default",
]

#: The exit status of a user's mistake: argparse's for a bad flag, and eatta's for the rest.
USAGE_ERROR = 2


class UsageError(Exception):
    """A command's own check of what the user gave failed (the message says what to change)."""


#: The library's exceptions for a mistake in what the user gave rather than in eatta.
USER_ERRORS: tuple[type[Exception], ...] = (
    DatasetLayoutError,
    WeightsUnavailableError,
    FileNotFoundError,
    UsageError,
)

_QUOTED = re.compile(r"'[^']*'")
_DEFAULT = re.compile(r"\bdefault\b")


def says_default(text: str) -> bool:
    """Whether an option's help names its default itself (the word outside quotes, where it may
    be a value such as ``'default'``)."""
    return bool(_DEFAULT.search(_QUOTED.sub("", text)))


class HelpFormatter(argparse.HelpFormatter):
    """Adds ``(default: X)`` to an option's help unless the help says its default itself or
    there is nothing to say (no value: None, a switch, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        nothing = default is None or default is argparse.SUPPRESS or default == []
        if not action.option_strings or action.nargs == 0 or nothing or says_default(text):
            return text
        return text + " (default: %(default)s)"


def exit_on_user_error(prog: str, call: Callable[[], object]) -> int:
    """``call()``'s exit status (the int it returns, else 0); a user's mistake
    (:data:`USER_ERRORS`) is printed as ``PROG: error: MESSAGE`` and gives :data:`USAGE_ERROR`."""
    try:
        status = call()
    except USER_ERRORS as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return USAGE_ERROR
    return status if isinstance(status, int) else 0
