"""Every limit a call can exceed has one row in `LIMITS`, naming a real policy field."""

from __future__ import annotations

from typing import get_args

import pytest
from stockade.sandbox.outcome import OverLimit
from stockade.sandbox.policy import LIMITS, Resource, ResourcePolicy


def test_every_resource_has_one_row_naming_a_policy_field() -> None:
    assert set(LIMITS) == set(get_args(Resource))
    fields = set(ResourcePolicy.__struct_fields__)
    assert {row.field for row in LIMITS.values()} <= fields


@pytest.mark.parametrize(
    ("resource", "text"),
    [
        ("memory", "exceeded its memory limit (512 MiB)"),
        ("cpu", "exceeded its CPU time limit (30 s)"),
        ("open_files", "exceeded its open files limit (256)"),
        ("disk", "exceeded its disk limit (1024 MiB)"),
    ],
)
def test_over_limit_text_names_the_limit_in_its_unit(resource: Resource, text: str) -> None:
    policy = ResourcePolicy()
    limit = policy.limit(resource)
    assert limit is not None
    assert text in OverLimit(tool="t", resource=resource, limit=limit).error_text()
