"""fisher_ref.hf, the documented path of fisher_ref.models.hf: the same names, each the
model module's own object, and importing it needs neither torch nor transformers."""
import json

import fisher_ref.hf as hf
import fisher_ref.models.hf as models_hf
from tests.test_package import run_python


def test_public_names_are_the_model_modules_objects():
    assert hf.__all__ == models_hf.__all__
    assert {"to_hf", "theta_from_hf", "hf_logits"} <= set(hf.__all__)
    for name in models_hf.__all__:
        assert getattr(hf, name) is getattr(models_hf, name), name


def test_importing_it_loads_no_torch_or_transformers():
    out = run_python("import json, sys, fisher_ref.hf\n"
                     "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
                     "('torch', 'transformers'))))")
    assert json.loads(out) == []
