"""The golden-file schema: its name and versions, every key with its dtype, shape and
comparison scale kind (written out in ``docs/golden_format.md``), and what each scale
kind divides by. Bump ``SCHEMA_VERSION`` here when keys or meaning change.
"""
from __future__ import annotations

__all__ = ["SCHEMA", "SCHEMA_VERSION", "OLDEST_READABLE_VERSION", "MATRIX_MAX_PARAMS",
           "ON_POLICY_KEYS", "OFF_POLICY_KEYS", "MATRIX_KEYS", "SCALE_KINDS", "expected_keys",
           "scale_kind"]

SCHEMA = "fisher_ref.golden"
# Bump on ANY change of keys, dtypes, shapes or meaning. History: 1 first format;
# 2 adds meta["meta_sha256"]; 3 adds state_logits, seq_score, the P x P matrices and
# meta["matrices"]. Older files are refused: regenerate them.
SCHEMA_VERSION = 3
OLDEST_READABLE_VERSION = 3
# The P x P matrices are written by default when P is at most this.
MATRIX_MAX_PARAMS = 2000
REGENERATE_HINT = ("regenerate it with `python -m fisher_ref export --config NAME --out FILE` "
                   "(or `--task FILE.json`), or rewrite the shipped files with "
                   "`python -m fisher_ref regenerate`")

# key -> (dtype, shape as size symbols, comparison scale kind). P params, V vocab,
# T max_len, N states, M responses, L state width, X prompts; "" is a 0-d array.
ON_POLICY_KEYS = {
    "theta": ("f8", "P", "value"), "prompt_weights": ("f8", "X", "value"),
    "state_tokens": ("i8", "NL", "exact"), "state_prompt": ("i8", "N", "exact"),
    "state_depth": ("i8", "N", "exact"), "state_reach": ("f8", "N", "value"),
    "state_logits": ("f8", "NV", "value"), "state_probs": ("f8", "NV", "value"),
    "state_token_fisher": ("f8", "NP", "fisher"),
    "state_uniform_token_fisher": ("f8", "NP", "fisher"),
    "seq_tokens": ("i8", "MT", "exact"), "seq_prompt": ("i8", "M", "exact"),
    "seq_prob": ("f8", "M", "value"), "seq_reward": ("f8", "M", "reward"),
    "seq_advantage": ("f8", "M", "reward"), "seq_score": ("f8", "MP", "score"),
    "sequence_fisher": ("f8", "P", "fisher"), "token_fisher_sum": ("f8", "P", "fisher"),
    "score_mean": ("f8", "P", "score"), "gradient": ("f8", "P", "gradient"),
    "covariance": ("f8", "P", "gradient"), "gradient_autodiff": ("f8", "P", "gradient"),
    "bound": ("f8", "P", "gradient"), "correlation": ("f8", "P", "correlation"),
    "cross_terms": ("f8", "TTP", "fisher"),
    "expected_reward": ("f8", "", "reward"), "reward_std": ("f8", "", "reward"),
    "baseline": ("f8", "", "reward"),
}
OFF_POLICY_KEYS = {
    "sampler_theta": ("f8", "P", "value"), "sampler_reach": ("f8", "N", "value"),
    "sampler_probs": ("f8", "NV", "value"), "sampler_token_fisher": ("f8", "NP", "fisher"),
    "sampler_raw_score_mean": ("f8", "NP", "score"),
    "seq_sampler_prob": ("f8", "M", "value"), "seq_sampler_advantage": ("f8", "M", "reward"),
    "offpolicy_sequence_fisher": ("f8", "P", "fisher"),
    "offpolicy_token_fisher_sum": ("f8", "P", "fisher"),
    "offpolicy_score_mean": ("f8", "P", "score"),
    "offpolicy_gradient": ("f8", "P", "gradient"),
    "offpolicy_covariance": ("f8", "P", "gradient"),
    "offpolicy_bound": ("f8", "P", "gradient"),
    "offpolicy_correlation": ("f8", "P", "correlation"),
    "offpolicy_cross_terms": ("f8", "TTP", "fisher"),
    "offpolicy_gradient_uncentered": ("f8", "P", "gradient"),
    "offpolicy_score_mean_uncentered": ("f8", "P", "score"),
    "offpolicy_sequence_fisher_uncentered": ("f8", "P", "fisher"),
    "offpolicy_importance_gradient": ("f8", "P", "gradient"),
    "offpolicy_expected_reward": ("f8", "", "reward"),
    "offpolicy_reward_std": ("f8", "", "reward"),
    "offpolicy_baseline": ("f8", "", "reward"),
}
MATRIX_KEYS = {
    "sequence_fisher_matrix": ("f8", "PP", "fisher"),
    "token_fisher_matrix_sum": ("f8", "PP", "fisher"),
}
# The denominator of each scale kind (docs/golden_format.md, "Comparing"): ``own`` is
# max(max|golden|, max|yours|); S = sqrt of the largest sequence Fisher entry (on- or
# off-policy), Rs = the largest sqrt(E[R^2]) + |b| over the streams in the file.
SCALE_KINDS = {
    "exact": "integers: must be equal",
    "value": "own",
    "reward": "max(own, Rs)",
    "score": "max(own, S)",
    "fisher": "max(own, S^2)",
    "gradient": "max(own, Rs*S)",
    "correlation": "error |d rho_i| * B_i over max(max B, Rs*S), B the bound",
}


def expected_keys(offpolicy, matrices):
    """key -> (dtype, size symbols, scale kind) of a file with or without a sampler and
    the ``P x P`` matrices."""
    out = dict(ON_POLICY_KEYS)
    if offpolicy:
        out.update(OFF_POLICY_KEYS)
    if matrices:
        out.update(MATRIX_KEYS)
    return out


def scale_kind(key):
    """The comparison scale kind of a golden key (``KeyError`` for an unknown key)."""
    return expected_keys(True, True)[key][2]
