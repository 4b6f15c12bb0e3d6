"""Backend-agnostic test suites. A backend's test module imports them and provides fixtures.

Assertions in the suite modules are rewritten by pytest (registered here, before
they are imported) so that failures show the compared values.
"""

import pytest

pytest.register_assert_rewrite(
    "conformance.store_suite",
    "conformance.store_suite_approvals",
    "conformance.store_suite_claims",
    "conformance.store_suite_lifecycle",
    "conformance.store_suite_records",
    "conformance.store_suite_support",
    "conformance.store_suite_writer",
)
