"""vLLM's activation of a classifier's scores (model_executor/layers/pooler activations: PoolerClassify and
get_classification_act_fn): by the config's problem_type, regression leaves them raw, multi-label takes a sigmoid
per label, and otherwise one label takes a sigmoid and several a softmax. Pure Python on a few floats."""

from __future__ import annotations

import math


def activate(scores: list[float], problem_type: str | None) -> list[float]:
    if problem_type == "regression":
        return list(scores)
    if problem_type == "multi_label_classification" or len(scores) < 2:
        return [_sigmoid(x) for x in scores]
    top = max(scores)
    weights = [math.exp(x - top) for x in scores]
    total = sum(weights)
    return [w / total for w in weights]


def _sigmoid(x: float) -> float:
    # Split by sign so that neither branch overflows exp().
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def predicted(probs: list[float]) -> int:
    """numpy's argmax: the first index of the largest value."""
    return max(range(len(probs)), key=lambda i: (probs[i], -i))
