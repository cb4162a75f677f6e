"""The tiny stock Llama and its tokenizer: ids are the task's vocabulary, EOS 0, no BOS,
float64, a policy far from uniform."""
import pytest
import torch

from fisher_ref.torch.tiny import EOS, tiny_llama, tiny_tokenizer, token_text


def test_tokenizer_ids_are_the_vocabulary():
    tok = tiny_tokenizer(4)
    assert tok("t1 t2 t3").input_ids == [1, 2, 3]
    assert tok.eos_token_id == EOS == 0 and tok.pad_token_id == 0 and tok.bos_token_id is None
    assert tok.decode([1, 0]) == f"t1 {token_text(0)}" and len(tok) == 4
    with pytest.raises(ValueError, match="vocab_size"):
        tiny_tokenizer(1)


def test_model_is_float64_with_eos_zero_and_far_from_uniform():
    model = tiny_llama(4, init_std=0.6)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert model.config.eos_token_id == 0 and model.generation_config.eos_token_id == 0
    assert model.config.bos_token_id is None and model.generation_config.bos_token_id is None
    assert model.lm_head.weight.shape == (4, 8)
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([[1, 2]])).logits, -1)  # (1, 2, V)
    assert float((p.max(-1).values - p.min(-1).values).min()) > 0.1
    again = tiny_llama(4, init_std=0.6)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
