"""The tabular model (fisher_ref.models.tabular): a window's logits are its row of theta."""
import numpy as np

from fisher_ref.models.tabular import TabularModel


def test_tabular_logits_are_the_table_row_of_the_window():
    m = TabularModel(3, context=2, eos=False)
    th = np.arange(m.num_params, dtype=float)
    W = np.array([[3, 3], [1, 2]])
    rows = [3 * 4 + 3, 1 * 4 + 2]
    assert np.array_equal(m.logits(th, W), th.reshape(16, 3)[rows])
