"""Trial 60's findings fixed in the lead's hands: money under a dollar keeps three significant digits."""

from __future__ import annotations

import pytest

from kvlab.report.text import dollars


@pytest.mark.parametrize(("amount", "text"), [(0.034036, "$0.034"), (0.41, "$0.41"), (6.2149, "$6.21"),
                                               (1234.567, "$1,234.57"), (0.0, "$0.00"), (0.000123456, "$0.000123")])
def test_dollars_under_one_keep_three_significant_digits(amount, text):  # (finding 9c: "$0.03" for $0.034)
    assert dollars(amount) == text
