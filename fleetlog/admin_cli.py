"""``fleetlog quota set|get`` and ``fleetlog node add|drain|undrain|remove``: what operators
change by hand, appended to the inputs log as events (docs/cli.md).

- ``quota set TENANT`` appends a ``QuotaSet``: it replaces the tenant's quota in the cell (or in
  every cell), as the event does — a resource not given is 0, nothing of it guaranteed.
- ``quota get [TENANT...]`` lists quota, usage and borrowing from ``/v1/tenants`` (the running
  service's API, else the logs folded to their end, as ``fleetlog tenants`` reads).
- ``node add NODE`` appends one ``NodeHeartbeat`` (for development: a node nothing keeps beating
  for is taken down after the scheduler's node timeout, 60 s of log time by default).
- ``node drain NODE`` appends a ``NodeDrained``: no new task is placed on the node until
  ``node undrain``; what runs there stays, and the backend's heartbeats do not undo it.
- ``node remove NODE`` appends a ``NodeRemoved``: its gangs are requeued.
- ``policy get`` shows the policy in force (``/v1/policy``) and where it comes from.
- ``policy set FILE`` appends a ``PolicySet``: the grants of ``FILE`` (a policy file's TOML,
  ``[[grant]] principal roles``) become the API's authorization policy, whole, in place of the
  configured ``auth.policy_file`` and of any earlier ``PolicySet`` (docs/service.md).

``drain``, ``undrain`` and ``remove`` first read the node from the running service or the logs: a
node the scheduler does not know is one line and exit code 2, not an event the fold ignores.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Final

from fleetlog.client import ClientError, keyed
from fleetlog.client_cli import CommandLineError, _add_common, _pairs, _reporting, _send
from fleetlog.events.model import (
    TAINT_EFFECTS,
    InputEvent,
    NodeDrained,
    NodeHeartbeat,
    NodeRemoved,
    PolicySet,
    QuotaSet,
    Resources,
    Taint,
)
from fleetlog.reads_cli import Listing, ReadError, _read, show
from fleetlog.service.auth import AuthError
from fleetlog.service.authz import leaves_no_admin, policy_set
from fleetlog.usage import add_log_options, url_argument

Locate = Any


def add_admin_commands(sub: Any, usage_error: type[Exception], locate: Locate) -> None:
    """Register ``quota``, ``node`` and ``policy`` on the ``fleetlog`` subparsers."""
    quota = sub.add_parser("quota", help="set or show a tenant's quota")
    cmds = quota.add_subparsers(dest="quota_command", required=True)
    qset = cmds.add_parser("set", help="replace a tenant's quota (a QuotaSet)", description=(
        "Append a QuotaSet: the tenant's quota in --cell (default: every cell) becomes what the flags "
        "say; a resource not given is 0 (nothing of it guaranteed)."))
    qset.add_argument("tenant", metavar="TENANT")
    _resource_flags(qset, "", "guaranteed (nominal)")
    _resource_flags(qset, "borrow-", "at most borrowed from the cohort on top (any given: a limit)")
    qset.add_argument("--cell", default="", help="the cell (default: every cell)")
    qset.add_argument("--cohort", default="", help="the cohort it borrows from and lends to")
    qset.add_argument("--weight-milli", type=int, default=1000, help="fair-share weight, default 1000")
    _add_common(qset)
    qset.set_defaults(func=_reporting(cmd_quota_set, usage_error))
    qget = cmds.add_parser("get", help="quota, usage and borrowing of tenants (all, or those named)")
    qget.add_argument("tenants", nargs="*", metavar="TENANT")
    _add_read_flags(qget)
    qget.set_defaults(func=_reporting(_quota_get(locate), usage_error))
    _add_node_commands(sub, usage_error, locate)


def _resource_flags(parser: argparse.ArgumentParser, prefix: str, what: str) -> None:
    units = (("gpu-milli", "GPU thousandths"), ("cpu-milli", "CPU thousandths"), ("mem-mib", "MiB"))
    for flag, unit in units:
        parser.add_argument(f"--{prefix}{flag}", type=_natural, metavar="N", help=f"{unit} {what}")


def _natural(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer")
    return int(text)


def _add_read_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=("table", "wide", "json", "yaml"), default="table",
                        help="table (default), wide (every field), json or yaml (what the API answers)")
    parser.add_argument("--json", action="store_const", const="json", dest="output", help="-o json")
    parser.add_argument("--url", metavar="URL", type=url_argument, help="the service's address (http[s]://host:port)")
    add_log_options(parser)


def _add_node_commands(sub: Any, usage_error: type[Exception], locate: Locate) -> None:
    node = sub.add_parser("node", help="add, drain, undrain or remove a node")
    cmds = node.add_subparsers(dest="node_command", required=True)
    add = cmds.add_parser("add", help="one heartbeat of a node (development)", description=(
        "Append one NodeHeartbeat. For development: a node nothing keeps beating for is taken down "
        "after the scheduler's node timeout (60 s of log time by default)."))
    add.add_argument("node", metavar="NODE")
    add.add_argument("--cell", required=True)
    add.add_argument("--cpu-milli", type=_natural, required=True, metavar="N")
    add.add_argument("--mem-mib", type=_natural, required=True, metavar="N")
    add.add_argument("--gpus", type=_natural, default=0, metavar="N", help="whole GPUs, default 0")
    add.add_argument("--gpu-model", default="", help="needed with --gpus")
    add.add_argument("--topology", default="", metavar="A/B/C", help="its path, e.g. block/rack/host")
    add.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="a label (repeat)")
    add.add_argument("--taint", action="append", default=[], metavar="KEY[=VALUE]:EFFECT",
                     help="a taint (repeat)")
    add.add_argument("--unschedulable", action="store_true", help="cordoned, as the backend reports it")
    add.set_defaults(func=_reporting(cmd_node_add, usage_error))
    for name, text in (("drain", "no new placements on the node until undrained; its work stays"),
                       ("undrain", "undo a drain"), ("remove", "take the node out: its gangs are requeued")):
        one = cmds.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        one.add_argument("node", metavar="NODE")
        one.add_argument("--cell", help="the node's cell (default: the one cell that has a node so named)")
        if name == "drain":
            one.add_argument("--reason", default="", help="why (shown by fleetlog nodes)")
        one.add_argument("--url", metavar="URL", type=url_argument,
                         help="the service's HTTP address, to find the node")
        one.set_defaults(func=_reporting(_node_change(name, locate), usage_error))
    for parser in (add, *(cmds.choices[n] for n in ("drain", "undrain", "remove"))):
        _add_common(parser)
    policy = sub.add_parser("policy", help="set the API's authorization policy (a PolicySet)")
    pcmds = policy.add_subparsers(dest="policy_command", required=True)
    pset = pcmds.add_parser("set", help="replace the policy with a file's grants", description=(
        "Append a PolicySet: the grants of FILE (TOML, as auth.policy_file: [[grant]] principal = ..., "
        "roles = [...]) become the policy in force, whole, once the service has folded it; it takes "
        "the place of auth.policy_file and of any earlier PolicySet. At least one principal must keep "
        "policy-admin."))
    pset.add_argument("file", metavar="FILE", help="the policy (TOML)")
    pset.add_argument("--reason", default="", help="why (shown by fleetlog history --audit)")
    _add_common(pset)
    pset.set_defaults(func=_reporting(cmd_policy_set, usage_error))
    pget = pcmds.add_parser("get", help="the policy in force: each principal's roles, and its source")
    _add_read_flags(pget)
    pget.set_defaults(func=_reporting(_policy_get(locate), usage_error))


# -- the commands -------------------------------------------------------------------------------


def cmd_quota_set(args: argparse.Namespace) -> int:
    nominal = Resources(cpu_milli=args.cpu_milli or 0, mem_mib=args.mem_mib or 0,
                        gpu_milli=args.gpu_milli or 0)
    borrow = (args.borrow_cpu_milli, args.borrow_mem_mib, args.borrow_gpu_milli)
    limit = None if all(b is None for b in borrow) else Resources(*(b or 0 for b in borrow))
    return _append(args, QuotaSet(tenant=args.tenant, nominal=nominal, cell=args.cell, cohort=args.cohort,
                                  borrowing_limit=limit, weight_milli=args.weight_milli))


def _quota_get(locate: Locate) -> Any:
    def run(args: argparse.Namespace) -> int:
        found = _listed(args, "/v1/tenants", {}, locate)
        if args.tenants:
            known = {item["tenant"] for item in found["items"]}
            missing = [t for t in args.tenants if t not in known]
            if missing:
                raise CommandLineError(f"no tenant {missing[0]!r} (no quota and no job)")
            found = {"items": [item for item in found["items"] if item["tenant"] in args.tenants]}
        columns = ("tenant", "cohort", "nominal_gpu_milli", "used_gpu_milli", "borrowed_gpu_milli",
                   "borrowing_limit_gpu_milli", "nominal_cpu_milli", "used_cpu_milli", "weight_milli")
        show("tenants", Listing("/v1/tenants", "quotas", (), columns), found, args.output)
        return 0

    return run


def cmd_policy_set(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        event = policy_set(path, path.read_bytes())
    except OSError as exc:
        raise CommandLineError(f"cannot read {path}: {exc.strerror or exc}") from None
    except AuthError as exc:
        raise CommandLineError(str(exc)) from None
    if leaves_no_admin(event):
        raise CommandLineError(f"{path}: no principal keeps policy-admin: nobody could change the policy "
                               "again through the API")
    return _append(args, PolicySet(grants=event.grants, reason=args.reason))  # (checked there)


def _policy_get(locate: Locate) -> Any:
    def run(args: argparse.Namespace) -> int:
        found = _listed(args, "/v1/policy", {}, locate)
        show("principals", Listing("/v1/policy", "policy", (), ("principal", "roles")), found, args.output)
        if args.output in ("table", "wide"):
            print(POLICY_SOURCES[found["source"]] + (f" ({found['reason']})" if found.get("reason") else ""))
        return 0

    return run


POLICY_SOURCES: Final = {
    "log": "source: the log's newest PolicySet",
    "file": "source: auth.policy_file (the log holds no PolicySet)",
    "none": "source: none (no PolicySet in the log, no auth.policy_file: an authenticated principal may do "
            "everything)",
}


def cmd_node_add(args: argparse.Namespace) -> int:
    taints = tuple(_taint(text) for text in args.taint)
    topology = tuple(part for part in args.topology.split("/") if part)
    try:
        beat = NodeHeartbeat(cell=args.cell, node=args.node, cpu_milli=args.cpu_milli, mem_mib=args.mem_mib,
                             gpu_count=args.gpus, gpu_model=args.gpu_model, topology=topology,
                             labels=_pairs("--label", args.label), taints=taints,
                             unschedulable=args.unschedulable)
    except (ValueError, TypeError) as exc:
        raise CommandLineError(f"invalid node: {exc}") from None
    return _append(args, beat)


def _taint(text: str) -> Taint:
    """``KEY[=VALUE]:EFFECT``."""
    spec, _, effect = text.rpartition(":")
    key, _, value = spec.partition("=")
    if not key or effect not in TAINT_EFFECTS:
        effects = ", ".join(TAINT_EFFECTS)
        raise CommandLineError(f"--taint {text!r}: KEY[=VALUE]:EFFECT, EFFECT one of {effects}")
    return Taint(key=key, value=value, effect=effect)


def _node_change(name: str, locate: Locate) -> Any:
    def run(args: argparse.Namespace) -> int:
        cell = _cell_of(args, locate)
        event: InputEvent = (
            NodeRemoved(cell=cell, node=args.node) if name == "remove"
            else NodeDrained(cell=cell, node=args.node, drained=name == "drain",
                             reason=getattr(args, "reason", ""))
        )
        return _append(args, event)

    return run


def _cell_of(args: argparse.Namespace, locate: Locate) -> str:
    """The cell of the node ``args.node`` names (checked against ``--cell`` when given): a node
    the scheduler does not know, or one name in two cells without ``--cell``, is an error."""
    found = _listed(args, "/v1/nodes", {"cell": [args.cell]} if args.cell else {}, locate)
    cells = sorted({item["cell"] for item in found["items"]
                    if item["node"] == args.node and item["status"] != "removed"})
    where = f" in cell {args.cell!r}" if args.cell else ""
    if not cells:
        raise CommandLineError(f"no node {args.node!r}{where} (fleetlog nodes lists them)")
    if len(cells) > 1:
        raise CommandLineError(f"node {args.node!r} is in cells {', '.join(cells)}: give --cell")
    return str(cells[0])


def _listed(args: argparse.Namespace, path: str, query: dict[str, list[str]], locate: Locate
            ) -> dict[str, Any]:
    """The whole list at ``path`` from the running service or the logs; a failure is one line."""
    args.limit = None
    try:
        return _read(args, path, query, locate)
    except ReadError as exc:
        raise CommandLineError(str(exc)) from None


def _append(args: argparse.Namespace, event: InputEvent) -> int:
    """Append ``event`` (its key unique to this command: a drain after an undrain is not a resend)."""
    try:
        env = keyed(event, args.producer_id, seq=time.time_ns())
    except ClientError as exc:
        raise CommandLineError(f"invalid {type(event).__name__}: {exc}") from None
    return _send(args, [env])
