"""The learner gpu_check.py uses where DeepSpeed is not installed: ZeRO-0 on plain torch, with the
project's own micro-batching and policy loss (imported from the checkout)."""

from __future__ import annotations

from pathlib import Path


class PlainTorchLearner:
    """ZeRO-0 without DeepSpeed: the learner's module, micro-batches and loss on plain torch."""

    def __init__(self, model_path: Path, device: str, micro_batch_tokens: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from stare_tir.learner.parts import token_logprob_model

        lm = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.bfloat16).to(device)
        self.module = token_logprob_model(lm, 1.0, 1024)
        self.opt = torch.optim.AdamW(self.module.parameters(), lr=1e-6)
        self.device, self.budget = torch.device(device), micro_batch_tokens

    def _mbs(self, trajs):
        from stare_tir.learner.micro_batch import build_micro_batch, plan_micro_batches

        plan = plan_micro_batches([len(t.prompt_ids) + len(t.response_ids) for t in trajs], self.budget)
        return [build_micro_batch(trajs, idx, 0) for idx in plan]

    def _fwd(self, mb, with_entropy: bool):
        d = mb.to(self.device)
        return self.module(
            d.input_ids, d.attention_mask, d.position_ids, d.sel_rows, d.sel_pos, d.targets, with_entropy=with_entropy
        )

    def compute_logprobs_entropy(self, trajs):
        import torch

        out = [None] * len(trajs)
        with torch.no_grad():
            for mb in self._mbs(trajs):
                lp, _ = self._fwd(mb, True)
                rows = torch.zeros(mb.mask.shape).index_put((mb.sel_rows, mb.sel_resp), lp.float().cpu())
                for r, i in enumerate(mb.indices):
                    out[i] = rows[r, : len(trajs[i].response_ids)].clone()
        return out, None

    def train_step(self, trajs, advantages, omega, old, **kw):
        import torch

        from stare_tir.algos.policy_loss import Clip, LossInputs, clip_loss

        mbs = self._mbs(trajs)
        n_tok = float(sum(mb.num_tokens for mb in mbs))
        for mb in mbs:
            logp, _ = self._fwd(mb, False)
            lp = torch.zeros(mb.mask.shape, device=self.device).index_put(
                (mb.sel_rows.to(self.device), mb.sel_resp.to(self.device)), logp.float()
            )
            mask = mb.mask.to(self.device)
            loss, _ = clip_loss(
                LossInputs(
                    lp,
                    mb.per_token(old).to(self.device),
                    mb.per_token(advantages).to(self.device) * mask,
                    mask,
                    clip=kw.get("clip") or Clip(),
                    token_weights=mb.per_token(omega, 1.0).to(self.device),
                    global_tokens=n_tok,
                )
            )
            loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return {"step_skipped": 0.0}
