"""The trainer tells transformers that scikit-learn is unavailable (runtime/common.py without_sklearn, issue 22): with a
scikit-learn installed, transformers' model classes then load without importing it (1.5-2 s of every start
on an H200 host with transformers 5.17). An installed stand-in package proves the check would say yes."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.e2e  # each test starts a real process

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture
def installed_sklearn(tmp_path):
    """A package named sklearn with its distribution's metadata, as pip leaves one; importing it says so."""
    pkg = tmp_path / "sklearn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import os\nopen(os.environ['SKLEARN_MARK'], 'w').close()\n")
    dist = tmp_path / "scikit_learn-1.5.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: scikit-learn\nVersion: 1.5.0\n")
    (dist / "top_level.txt").write_text("sklearn\n")
    (dist / "RECORD").write_text("sklearn/__init__.py,,\n")
    return tmp_path


def _run(site, mark, quiet: bool) -> str:
    code = textwrap.dedent(
        f"""
        import sys
        if {quiet}:
            from trainer.runtime.common import quiet_transformers
            quiet_transformers()
        from transformers import AutoModelForCausalLM  # noqa: F401 - the model classes, as the trainer loads
        from transformers.generation import candidate_generator
        print(candidate_generator.is_sklearn_available(), "sklearn" in sys.modules)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, str(site)]), "SKLEARN_MARK": str(mark)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_model_classes_load_without_sklearn(installed_sklearn, tmp_path):
    mark = tmp_path / "imported"
    assert _run(installed_sklearn, mark, quiet=False)[0] == "True"  # transformers sees the package
    mark.unlink(missing_ok=True)
    available, imported = _run(installed_sklearn, mark, quiet=True)
    assert available == "False" and imported == "False"
    assert not mark.exists()
