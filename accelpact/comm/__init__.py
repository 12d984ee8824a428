"""Communicator lifecycle: build, retire, replace and validate process groups; classify failures."""

from accelpact.comm.classify import Classification, FailureCause, classify_failure, is_communication_failure
from accelpact.comm.lifecycle import (
    MembershipError,
    make_group,
    replace_group,
    retire_group,
    retired_group_names,
)
from accelpact.comm.naming import group_identity, group_name, parse_group_name, store_prefix
from accelpact.comm.validate import GroupValidationError, ValidationResult, validate_group

__all__ = [
    "Classification",
    "FailureCause",
    "GroupValidationError",
    "MembershipError",
    "ValidationResult",
    "classify_failure",
    "group_identity",
    "group_name",
    "is_communication_failure",
    "make_group",
    "parse_group_name",
    "replace_group",
    "retire_group",
    "retired_group_names",
    "store_prefix",
    "validate_group",
]
