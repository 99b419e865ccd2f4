"""Placement constraints: which nodes a constraint class may use (``eligible_nodes``).

Label keys and values are interned to integers by the caller
(:mod:`fleetlog.core.constraints`); a node's labels and taints arrive as CSR arrays, a class's
selector, affinity terms and tolerations as flat arrays. Everything is integer comparison: a
string the fleet never carries has an id no node has, so it matches nothing.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from fleetlog.core.kernels.base import I32, I64, _hot, _jit

B8 = npt.NDArray[np.bool_]

OP_IN = 0
OP_NOT_IN = 1
OP_EXISTS = 2
OP_DOES_NOT_EXIST = 3
EFFECT_ANY = 0  # a toleration's empty effect
EFFECT_NO_SCHEDULE = 1
EFFECT_NO_EXECUTE = 3
NO_KEY = -1  # a toleration's empty key (with Exists: every taint)


@_hot
def _label(lab_ptr: I64, lab_key: I32, lab_val: I32, n: int, key: int) -> int:
    """The value id of node ``n``'s label ``key``, or -1 when it has none."""
    for i in range(lab_ptr[n], lab_ptr[n + 1]):
        if lab_key[i] == key:
            return int(lab_val[i])
    return -1


@_hot
def _requirement_met(value: int, op: int, vals: I32, lo: int, hi: int) -> bool:
    if op == OP_EXISTS:
        return value >= 0
    if op == OP_DOES_NOT_EXIST:
        return value < 0
    found = False
    if value >= 0:
        for j in range(lo, hi):
            if vals[j] == value:
                found = True
                break
    return found if op == OP_IN else not found


@_hot
def _tolerated(
    key: int, val: int, eff: int, tol_key: I32, tol_exists: I32, tol_val: I32, tol_eff: I32
) -> bool:
    for j in range(tol_key.shape[0]):
        if tol_eff[j] != EFFECT_ANY and tol_eff[j] != eff:
            continue
        if tol_key[j] == NO_KEY:
            if tol_exists[j]:
                return True
            continue
        if tol_key[j] == key and (tol_exists[j] or tol_val[j] == val):
            return True
    return False


@_jit
def eligible_nodes(
    lab_ptr: I64,
    lab_key: I32,
    lab_val: I32,
    taint_ptr: I64,
    taint_key: I32,
    taint_val: I32,
    taint_eff: I32,
    cordoned: B8,
    sel_key: I32,
    sel_val: I32,
    req_term: I32,
    req_key: I32,
    req_op: I32,
    req_ptr: I64,
    req_vals: I32,
    n_terms: int,
    tol_key: I32,
    tol_exists: I32,
    tol_val: I32,
    tol_eff: I32,
    out: B8,
) -> int:
    """Mark in ``out`` each node a task of the class may be placed on: not cordoned, every
    selector label equal, at least one affinity term (requirements ``req_*`` grouped by
    ``req_term``, 0..n_terms-1, in order) whose requirements all hold (none: any node), and
    every taint (only ``NoSchedule``/``NoExecute`` ones are given) tolerated. The count marked."""
    count = 0
    n_req = req_key.shape[0]
    for n in range(out.shape[0]):
        ok = not cordoned[n]
        for s in range(sel_key.shape[0]):
            if not ok:
                break
            ok = _label(lab_ptr, lab_key, lab_val, n, int(sel_key[s])) == sel_val[s]
        if ok and n_terms > 0:
            any_term = False
            r = 0
            for term in range(n_terms):
                term_ok = True
                while r < n_req and req_term[r] == term:
                    if term_ok:
                        value = _label(lab_ptr, lab_key, lab_val, n, int(req_key[r]))
                        lo, hi = req_ptr[r], req_ptr[r + 1]
                        term_ok = _requirement_met(value, int(req_op[r]), req_vals, lo, hi)
                    r += 1
                if term_ok:
                    any_term = True
                    break
            ok = any_term
        if ok:
            for i in range(taint_ptr[n], taint_ptr[n + 1]):
                key, val, eff = int(taint_key[i]), int(taint_val[i]), int(taint_eff[i])
                if not _tolerated(key, val, eff, tol_key, tol_exists, tol_val, tol_eff):
                    ok = False
                    break
        out[n] = ok
        count += ok
    return count
