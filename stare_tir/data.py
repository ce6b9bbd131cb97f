"""Which problems the trainer sees, and in which order (deterministic and resumable)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

from loguru import logger


@dataclass
class DataConfig:
    # Training problems: "arithmetic" (the synthetic CPU task), a shipped short name ("dapo17k"),
    # a JSONL/JSON/parquet path, or a Hugging Face dataset id.
    train: str = "arithmetic"
    # Held-out problems for periodic and final evaluation (same kinds of source).
    eval: str = "arithmetic"
    # Sizes of the synthetic task's splits (ignored for other sources).
    arithmetic_train_size: int = 4000
    # Held-out problems of the synthetic task (its "test" split; also eval.datasets=[arithmetic]).
    arithmetic_eval_size: int = 100
    # Keep only the first N eval problems (None: all).
    eval_limit: int | None = None
    # Our field -> the source's field (a dotted path), e.g. {problem: question, answer: solution}.
    fields: dict[str, str] = field(default_factory=dict)
    # Malformed rows: fail naming file and row ("error"), or count, log and skip them ("skip").
    on_bad_row: Literal["error", "skip"] = "error"
    # Drop DAPO-17k problems that overlap the shipped eval sets.
    exclude_overlap: bool = True
    # Seed of the synthetic task and of the shuffling order.
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arithmetic_train_size < 1 or self.arithmetic_eval_size < 1:
            raise ValueError("arithmetic_*_size: must be >= 1")
        if self.eval_limit is not None and self.eval_limit < 1:
            raise ValueError(f"eval_limit={self.eval_limit!r}: must be >= 1 or null")


def load_split(cfg: DataConfig, split: Literal["train", "eval"]) -> list[dict]:
    """Problems of one split as {id, problem, answer, ...} dicts."""
    source = cfg.train if split == "train" else cfg.eval
    if source == "arithmetic":
        from envs.arithmetic import make_problems

        n = cfg.arithmetic_train_size if split == "train" else cfg.arithmetic_eval_size
        problems = make_problems(n, seed=cfg.seed, split="train" if split == "train" else "test")
    else:
        from envs.data import load_problems

        problems = load_problems(
            source,
            fields=cfg.fields or None,
            on_bad_row=cfg.on_bad_row,
            exclude_overlap=cfg.exclude_overlap and split == "train",
        )
    if split == "eval" and cfg.eval_limit is not None:
        problems = problems[: cfg.eval_limit]
    if not problems:
        raise ValueError(f"data.{split}={source!r} yielded no problems")
    logger.info(f"data: {len(problems)} {split} problems from {source!r}")
    return problems


class PromptSampler:
    """Epoch-wise shuffled stream of problems; its state is one integer (problems consumed).

    The order of epoch e is a permutation seeded by (seed, e), so a run resumed from a checkpoint
    sees exactly the problems an uninterrupted run would have seen, in the same order.
    """

    def __init__(self, problems: list[dict], seed: int) -> None:
        self.problems = problems
        self.seed = seed
        self.position = 0
        self._epoch_order: tuple[int, list[int]] = (-1, [])

    def _order(self, epoch: int) -> list[int]:
        if self._epoch_order[0] != epoch:
            order = list(range(len(self.problems)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._epoch_order = (epoch, order)
        return self._epoch_order[1]

    def take(self, k: int) -> list[dict]:
        out = []
        n = len(self.problems)
        for _ in range(k):
            epoch, i = divmod(self.position, n)
            out.append(self.problems[self._order(epoch)[i]])
            self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])
        self.seed = int(state["seed"])
