r"""A tiny stock causal LM and its tokenizer, to run a real trainer on a task fisher_ref
enumerates: :func:`tiny_tokenizer` and :func:`tiny_llama`.

The tokenizer's ids are the task's vocabulary ``0..V-1`` exactly (a trainer samples from the
model's whole vocabulary), EOS id 0 where fisher_ref puts it (``eos=True`` of
:func:`fisher_ref.torch.causal_lm_task`), no BOS: a ``tokenizers`` WordLevel model
wrapped in ``transformers.PreTrainedTokenizerFast``, token ``i`` written ``t{i}`` (EOS
``<eos>``), whitespace-separated. The model is a stock ``LlamaForCausalLM`` from a small
``LlamaConfig`` in float64, initialised with a standard deviation large enough (1 by
default, not the stock 0.02) that its next-token distributions are far from uniform: near
uniform, every gradient test is weak.
"""
from __future__ import annotations

import torch

__all__ = ["EOS", "tiny_tokenizer", "tiny_llama", "token_text", "CHECKABLE_GRPO",
           "checkable_grpo_trainer"]


#: fisher_ref's EOS id.
EOS = 0


def token_text(i):
    """The text of token ``i``: ``"<eos>"`` for EOS (id 0), else ``"t{i}"``."""
    return "<eos>" if i == EOS else f"t{i}"


def tiny_tokenizer(vocab_size):
    """A ``PreTrainedTokenizerFast`` whose ids are ``0..vocab_size-1``, EOS (and PAD) id 0,
    no BOS, no special tokens added: ``tok("t1 t2").input_ids == [1, 2]``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an integer >= 2, got {vocab_size!r}")
    vocab = {token_text(i): i for i in range(vocab_size)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=token_text(EOS)))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    eos_text = token_text(EOS)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token=eos_text,
                                   pad_token=eos_text, unk_token=eos_text)


def tiny_llama(vocab_size, *, hidden=8, layers=1, heads=2, intermediate=16,
               positions=16, init_std=1.0, seed=0):
    """A stock ``LlamaForCausalLM`` in float64 with vocabulary ``vocab_size``, EOS and PAD
    id 0 (config and generation config), no BOS, untied embeddings, weights drawn with
    ``initializer_range=init_std`` under ``torch.manual_seed(seed)``."""
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=heads, max_position_embeddings=positions,
                         bos_token_id=None, eos_token_id=EOS, pad_token_id=EOS,
                         tie_word_embeddings=False, initializer_range=init_std)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float64)
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = EOS
    model.generation_config.bos_token_id = None
    return model


#: The ``GRPOConfig`` settings under which a run's applied gradient can be held to the
#: exact one (fisher_ref.estimators.trl_run refuses the others by name): weights frozen,
#: no clipping, no KL term, float64 throughout (no bf16 autocast), on the CPU, nothing
#: logged or saved.
CHECKABLE_GRPO = dict(learning_rate=0.0, max_grad_norm=0.0, beta=0.0, bf16=False,
                      use_cpu=True, activation_checkpointing=False, report_to="none",
                      logging_steps=10 ** 6, save_strategy="no", disable_tqdm=True,
                      output_dir="unused")


def checkable_grpo_trainer(model, tokenizer, reward_funcs, prompt, *, num_generations=None,
                           max_completion_length=None, steps=None, callbacks=(), copies=8,
                           args=None, **config):
    """A ``trl.GRPOTrainer`` on the text ``prompt`` (or a list of them), ``copies`` rows
    each of a ``datasets`` dataset, with :data:`CHECKABLE_GRPO` and
    ``per_device_train_batch_size = num_generations`` unless ``config`` says otherwise
    (``loss_type``, ``scale_rewards``, ``gradient_accumulation_steps``, ``seed``, or a
    :data:`CHECKABLE_GRPO` key); or with ``args``, a ``GRPOConfig`` taken as it is."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    if args is None:
        kw = dict(CHECKABLE_GRPO, num_generations=num_generations,
                  per_device_train_batch_size=num_generations,
                  max_completion_length=max_completion_length, max_steps=steps)
        kw.update(config)
        args = GRPOConfig(**kw)
    elif config or num_generations or max_completion_length or steps:
        raise TypeError("pass either args (a GRPOConfig) or its settings, not both")
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    return GRPOTrainer(model=model, reward_funcs=reward_funcs, args=args,
                       train_dataset=Dataset.from_dict({"prompt": prompts * copies}),
                       processing_class=tokenizer, callbacks=list(callbacks))
