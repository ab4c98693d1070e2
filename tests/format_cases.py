"""Parameters over the formats registry that skip, with the reason, the peer formats whose
library this interpreter lacks (they run under the peers environment: ``-m peers``)."""

from __future__ import annotations

import pytest

from storebench.formats import is_peer_format, unavailable_reason


def format_param(format_name: str, *values, id: str | None = None):
    """``pytest.param(format_name, *values)``, marked ``peers`` for a peer format and skipped
    where its library is missing."""
    marks = []
    if is_peer_format(format_name):
        marks.append(pytest.mark.peers)
    reason = unavailable_reason(format_name)
    if reason:
        marks.append(pytest.mark.skip(reason=reason))
    return pytest.param(format_name, *values, marks=marks, id=id)


def format_cases(cases, ids):
    """``format_param`` over ``(format, encoding)`` pairs with their ids."""
    return [format_param(*case, id=case_id) for case, case_id in zip(cases, ids)]
