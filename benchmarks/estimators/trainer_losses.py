"""Losses written as verl and TRL write them, over a batch of K groups (the
``fisher_ref.estimators.LossBatch`` fields; ``old_logp`` is the trainer's
``old_log_prob`` / ``old_per_token_logps``). Shared by the scripts of this folder."""
import torch


def _advantages(b, eps, kind):
    G = b.group_size
    R = b.rewards.view(-1, G)  # (K, G): one row per group (verl's uid, TRL's view)
    if kind == "rloo":
        return ((R - R.mean(1, keepdim=True)) * (G / (G - 1))).view(-1)
    return ((R - R.mean(1, keepdim=True)) / (R.std(1, keepdim=True) + eps)).view(-1)


def _per_token(b, A, low, high):
    ratio = torch.exp(b.logp - b.old_logp)  # 1 at the first step
    return torch.maximum(-A[:, None] * ratio, -A[:, None] * torch.clamp(ratio, low, high))


def verl_token_mean(kind="grpo", reading="batch"):
    """verl: GRPO (eps 1e-6) or RLOO advantages per group, the vanilla clipped policy loss,
    ``agg_loss(..., "token-mean")``: divided by the tokens of the mini-batch
    (``reading="batch"``) or by their large-batch limit (``"limit"``)."""
    def loss(b):
        pg = _per_token(b, _advantages(b, 1e-6, kind), 0.8, 1.2)
        m = b.mask.to(pg.dtype)
        n = m.sum() if reading == "batch" else b.groups_per_batch * b.limit.tokens_per_group
        return (pg * m).sum() / n
    loss.__name__ = f"verl_{kind}_token_mean_{reading}"
    return loss


def trl_dapo(reading="batch"):
    """TRL ``GRPOTrainer`` ``loss_type="dapo"``: GRPO advantages (eps 1e-4), clip
    (0.2, 0.28), divided by ``num_items_in_batch`` (the generation batch's tokens; one
    mini-batch here) or by its large-batch limit."""
    def loss(b):
        pg = _per_token(b, _advantages(b, 1e-4, "grpo"), 0.8, 1.28)
        n = b.mask.sum().clamp(min=1.0) if reading == "batch" \
            else b.groups_per_batch * b.limit.tokens_per_group
        return (pg * b.mask).sum() / n
    loss.__name__ = f"trl_dapo_{reading}"
    return loss


def trl_verbatim_style(G):
    """A TRL-style loss as TRL writes it, with ``.item()`` for its logged metrics and a
    boolean-mask assignment: ``vmap`` refuses both."""
    def loss(b):
        adv = _advantages(b, 1e-4, "grpo")
        adv[b.rewards.view(-1, G).std(1).repeat_interleave(G) == 0] = 0.0  # mask assignment
        pg = _per_token(b, adv, 0.8, 1.28)
        metrics = {"clip_ratio": ((torch.exp(b.logp - b.old_logp) - 1).abs() > 0.2)
                   .float().mean().item()}  # logging
        assert metrics is not None
        return (pg * b.mask).sum() / b.mask.sum()
    return loss


def trl_vectorised(G):
    """The same loss without the metric and with ``torch.where`` for the assignment."""
    def loss(b):
        adv = _advantages(b, 1e-4, "grpo")
        zero = b.rewards.view(-1, G).std(1).repeat_interleave(G) == 0
        adv = torch.where(zero, torch.zeros_like(adv), adv)
        pg = _per_token(b, adv, 0.8, 1.28)
        return (pg * b.mask).sum() / b.mask.sum()
    return loss
