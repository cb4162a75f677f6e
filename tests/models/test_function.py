"""Any logits function as a model (fisher_ref.models.function): it wraps the function and
checks its arguments."""
import numpy as np
import pytest

from fisher_ref.models.function import FunctionModel


def test_function_model_wraps_a_logits_function():
    m = FunctionModel(lambda th, w: np.outer(w[:, 0], th), 3, 3, 1, eos=False, name="outer")
    assert m.logits(np.array([1.0, 2.0, 3.0]), np.array([[2]])).tolist() == [[2.0, 4.0, 6.0]]
    assert m.describe()["arch"] == "outer" and m.bos == 3


def test_function_model_arguments_are_checked():
    with pytest.raises(TypeError, match="callable logits_fn"):
        FunctionModel(None, 3, 3, 1)
    with pytest.raises(ValueError, match="num_params must be a positive integer"):
        FunctionModel(lambda th, w: th, 2.5, 3, 1)
    with pytest.raises(ValueError, match="context is 2,000, more than the limit"):
        FunctionModel(lambda th, w: th, 3, 3, 2000)
