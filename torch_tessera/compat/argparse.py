"""What torch_tessera does to argparse's internals, in one place.

Checked on Python 3.11 (this machine's CI version) and 3.12 (the GPU machine's).

* ``HelpFormatter._get_help_string``: the hook ``ArgumentDefaultsHelpFormatter`` itself overrides to append
  ``(default: X)``; :class:`DefaultsOnceHelpFormatter` overrides it again so that an option whose help states its
  default already, or that has none, or a flag (``store_true``/``store_false``: a bool default), is left as written.
"""

from __future__ import annotations

import argparse


class DefaultsOnceHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to an option's help only where the help does not state its default already and there
    is a default to state (a flag's ``False``/``True`` is not one: the flag's name says it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text or action.default is None or action.default is argparse.SUPPRESS
                or isinstance(action.default, bool)):
            return text
        return super()._get_help_string(action) or text
