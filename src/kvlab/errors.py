"""The one exception type for a user's mistake.

Anything raised as ``KvlabError`` is shown to the user as a one-line message (CLI: exit code 2; web: HTTP 400).
Every other exception is a bug in kvlab and keeps its traceback.
"""


class KvlabError(ValueError):
    """A bad input: the message names the bad value and what would be valid."""


def require_scipy(what: str) -> None:
    """Refuse ``what`` in one line, before any work, where SciPy (the ``calibrate`` extra) is not installed."""
    try:
        import scipy  # noqa: F401
    except ImportError:
        raise KvlabError(f"{what} needs SciPy (least squares), which this installation lacks: "
                         "pip install scipy (the calibrate extra: pip install '.[calibrate]' in kvlab's checkout)") from None
