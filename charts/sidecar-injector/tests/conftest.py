import pytest

from chart import helm_binaries


def pytest_generate_tests(metafunc):
    # Tests taking `helm` run once per helm binary (Helm 4 and, when installed, Helm 3).
    if "helm" in metafunc.fixturenames:
        binaries = helm_binaries()
        if not binaries:
            pytest.fail("no helm on PATH: run tools/install.sh and source tools/env.sh")
        metafunc.parametrize("helm", binaries)
