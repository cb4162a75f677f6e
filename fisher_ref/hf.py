"""``fisher_ref.hf``: the documented path of :mod:`fisher_ref.models.hf` (fisher_ref's GPT-2
as a Hugging Face ``GPT2LMHeadModel`` and back)."""
from fisher_ref.models.hf import *  # noqa: F401,F403
from fisher_ref.models.hf import __all__  # noqa: F401
