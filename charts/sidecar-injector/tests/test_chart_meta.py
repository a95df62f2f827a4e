"""Things about the chart as a whole: Helm 3 and 4 agree, the README is current."""

import subprocess
import sys

import pytest

from chart import CHART, ROOT, helm_binaries, render_text
from snapshot import normalise




@pytest.mark.skipif(len(helm_binaries()) < 2, reason="only one helm binary installed")
@pytest.mark.parametrize("sets", [(), ("certificates.mode=certManager",),
                                  ("webhook.url=https://127.0.0.1:8443", "deployment.enabled=false",
                                   "certificates.mode=existingSecret",
                                   "certificates.existingSecret.caBundle=eA==")])
def test_helm_3_and_4_render_the_same(sets):
    first, *others = helm_binaries()
    for other in others:
        assert normalise(render_text(*sets, helm=first)) == normalise(render_text(*sets, helm=other))


def test_readme_values_table_is_current():
    proc = subprocess.run([sys.executable, str(ROOT / "charts" / "readme_values.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_readme_explains_the_failure_policies():
    readme = (CHART / "README.md").read_text()
    assert "## Failure policies" in readme
    assert "mutating `Ignore`, validating `Fail`" in readme
