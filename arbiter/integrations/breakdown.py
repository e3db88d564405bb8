"""A grader component's breakdown as series the adapters can log and return."""

from __future__ import annotations

from arbiter.proto.gateway import GroupScore


def breakdown(group: GroupScore) -> dict[str, list[float | None]]:
    """A grader component's sub-scores (a multi grader's ``info[name]["scores"]``), each
    as ``<component>/<sub-grader>``: logged with the components, and a ``component`` an
    ``ArbiterReward`` can return. A response whose text the group repeats (scored once,
    ``sent_indices``) is None there."""
    out: dict[str, list[float | None]] = {}
    n = len(group.rewards)
    for name, info in group.info.items():
        subs = info.get("scores")
        if not isinstance(subs, list):
            continue
        at = info.get("sent_indices") or list(range(len(subs)))
        for k, scores in zip(at, subs, strict=False):
            if not isinstance(scores, dict) or not isinstance(k, int) or not 0 <= k < n:
                continue  # not a grader's breakdown
            for sub, score in scores.items():
                out.setdefault(f"{name}/{sub}", [None] * n)[k] = score
    return out
