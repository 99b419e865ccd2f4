"""Node features and partitions as labels, and Slurm's ``--constraint`` as node-affinity terms.

The Slurm backend reports a node feature ``f`` as the label ``slurm.feature/f`` = ``true`` and a
partition ``p`` as ``slurm.partition/p`` = ``true`` (docs/slurm.md); ``fleetlog submit
--constraint 'a100&ib|h100'`` asks for them as Slurm users write it. Any producer may use the
same convention for its own node features.
"""

from __future__ import annotations

from typing import Final

from fleetlog.events.model import NodeSelectorRequirement, NodeSelectorTerm

FEATURE_LABEL: Final = "slurm.feature/"
"""A node feature ``f`` (``Features=`` / ``AvailableFeatures``) is the label ``slurm.feature/f``
with the value ``true``: what ``--constraint`` expressions select (:func:`constraint_terms`)."""
PARTITION_LABEL: Final = "slurm.partition/"
"""A node in partition ``p`` carries the label ``slurm.partition/p`` = ``true``."""


def constraint_terms(expression: str) -> tuple[NodeSelectorTerm, ...]:
    """A Slurm ``--constraint`` of features joined by ``&`` (AND) and ``|`` (OR; ``&`` binds
    tighter, as Slurm reads it) as node-affinity terms over the feature labels. Slurm's
    brackets, counts (``a*2``) and parentheses are refused (ValueError): they say how to spread
    a job over nodes, which a node's eligibility cannot."""
    if any(c in expression for c in "[]()*"):
        raise ValueError(f"--constraint {expression!r}: brackets, parentheses and counts are not supported")
    terms = []
    for alternative in expression.split("|"):
        features = [f.strip() for f in alternative.split("&")]
        if not all(features):
            raise ValueError(f"--constraint {expression!r}: an empty feature")
        reqs = tuple(NodeSelectorRequirement(key=FEATURE_LABEL + f, operator="Exists") for f in features)
        terms.append(NodeSelectorTerm(match_expressions=reqs))
    return tuple(terms)
