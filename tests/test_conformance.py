"""fisher_ref.conformance, the documented path of fisher_ref.checks.conformance: the same
names, each the checker's own object."""
import fisher_ref.checks.conformance as checks_conformance
import fisher_ref.conformance as conformance


def test_public_names_are_the_checkers_objects():
    assert conformance.__all__ == checks_conformance.__all__
    assert {"check_token_fisher", "conformance_cases"} <= set(conformance.__all__)
    for name in checks_conformance.__all__:
        assert getattr(conformance, name) is getattr(checks_conformance, name), name
