"""How close a run's updates are to Adam's: the paper's Appendix figure "Cosine Similarities
between the Update Matrices of FOAM with or without Residual and Adam".

With ``trainer.log_update_cosine=true`` a shadow Adam is fed the same gradients as the run's
optimizer (its own float32 moments of the attention/MLP matrices, the ones every method treats
specially; kept only while the option is on, not checkpointed, so a resumed run restarts them).
At every evaluation step the step the optimizer actually took, ``W_after - W_before``, is
compared with the step Adam would take from its moments, ``-m_hat / (sqrt(v_hat) + eps)``, with
the run's betas and eps: one cosine per matrix, logged as averages per decoder layer (the paper's
figure: "the average similarity across all modules within each layer"), per module type
(``q_proj`` ... ``down_proj``, over the layers) and overall. The lr and alpha scale both steps
alike, so the cosine is about directions only; weight decay, if any, is part of the step taken.

Everything rides on the optimizer's step hooks (``register_step_pre_hook`` / ``_post_hook``):
nothing is registered, allocated or computed when the option is off.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

import foam
from foam.sharding import is_sharded
from train.errors import ConfigError

PREFIX = "update_cosine/"
LAYER = re.compile(r"\.layers\.(\d+)\.")


def module_type(name: str) -> str:
    """``model.layers.3.self_attn.q_proj.weight`` -> ``q_proj``."""
    return name.rsplit(".", 2)[-2]


def layer_index(name: str) -> int | None:
    """The decoder layer a parameter belongs to (``None`` outside the layers)."""
    match = LAYER.search(name)
    return int(match[1]) if match else None


def averages(cosines: dict[str, float]) -> dict[str, float]:
    """Per-matrix cosines as the logged record: per layer, per module type, overall."""
    groups: dict[str, list[float]] = defaultdict(list)
    for name, value in cosines.items():
        layer = layer_index(name)
        if layer is not None:
            groups[f"{PREFIX}layer_{layer}"].append(value)
        groups[f"{PREFIX}{module_type(name)}"].append(value)
        groups[f"{PREFIX}mean"].append(value)
    return {key: sum(values) / len(values) for key, values in groups.items()}


class UpdateCosine:
    """Shadow Adam moments of ``model``'s matrices and, at the steps ``due(step)`` says, the
    cosine of the optimizer's step with Adam's, handed to ``log`` as one record."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        next_step: Callable[[], int],
        due: Callable[[int], bool],
        log: Callable[[dict[str, Any]], None],
    ) -> None:
        self.matrices = foam.split_params(model).matrices
        if any(is_sharded(p) for _, p in self.matrices):
            raise ConfigError(
                "trainer.log_update_cosine=true needs whole matrices: use trainer.parallelism=ddp"
            )
        group_of = {p: g for g in optimizer.param_groups for p in g["params"]}
        self.settings = {
            name: (group_of[p]["betas"], group_of[p]["eps"]) for name, p in self.matrices
        }
        self.moments = {
            name: (
                torch.zeros_like(p, dtype=torch.float32),
                torch.zeros_like(p, dtype=torch.float32),
            )
            for name, p in self.matrices
        }
        self.t = 0
        self.next_step, self.due, self.log = next_step, due, log
        self.before: dict[str, torch.Tensor] | None = None
        optimizer.register_step_pre_hook(self._before_step)
        optimizer.register_step_post_hook(self._after_step)

    @torch.no_grad()
    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.t += 1
        for name, p in self.matrices:
            (beta1, beta2), _ = self.settings[name]
            m, v = self.moments[name]
            g = p.grad.float()
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        if self.due(self.next_step()):
            self.before = {
                name: p.detach().to(torch.float32, copy=True) for name, p in self.matrices
            }

    @torch.no_grad()
    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.before is None:
            return
        cosines = {}
        for name, p in self.matrices:
            taken = p.detach().float() - self.before[name]
            cosines[name] = torch.nn.functional.cosine_similarity(
                taken.flatten(), self.adam_step(name).flatten(), dim=0
            ).item()
        self.before = None
        self.log({"step": self.next_step(), **averages(cosines)})

    def adam_step(self, name: str) -> torch.Tensor:
        """The direction Adam would step in: ``-m_hat / (sqrt(v_hat) + eps)``."""
        (beta1, beta2), eps = self.settings[name]
        m, v = self.moments[name]
        m_hat, v_hat = m / (1 - beta1**self.t), v / (1 - beta2**self.t)
        return -m_hat / (v_hat.sqrt() + eps)


def track_update_cosine(run: Any, state: Any, sink: Any) -> UpdateCosine | None:
    """The trainer's hook: an ``UpdateCosine`` logging into ``sink`` at the run's evaluation steps
    (``trainer.eval_every`` and the last step) when ``trainer.log_update_cosine``, else nothing."""
    t = run.cfg.trainer
    if not t.log_update_cosine:
        return None

    def due(step: int) -> bool:
        return step == t.max_steps or bool(t.eval_every and step % t.eval_every == 0)

    return UpdateCosine(
        run.model, run.optimizer, next_step=lambda: state.step + 1, due=due, log=sink.log
    )
