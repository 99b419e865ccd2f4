"""The shape of ``fleetlog/`` in two revisions: module tree, import cycles, replay fixtures.

    python -m benchmarks.shape --before REV --after REV [--json]

For a move that should change structure and nothing else (issue 16), in each revision's own
temporary worktree (``benchmarks.worktree``):

- **tree**: every file under ``fleetlog/`` with its line count (as ``wc -l``), before and after,
  marked ``new``, ``removed``, ``changed`` (±lines) or unchanged, with totals per package;
- **cycles**: the import cycles of ``fleetlog``'s module graph (grimp, lazy and TYPE_CHECKING
  imports included, as ``tests/test_shape.py`` checks), found by ``tests/core/test_layers.py``'s
  ``cycles`` (strongly connected components of more than one module);
- **fixtures**: ``python -m fleetlog.cli replay verify --log tests/replay/data/<name> --json`` of
  each revision over each fixture, and whether the reports are identical (same batches,
  decisions, final digest; the divergent fixture diverging at the same place). The fixtures
  are read from each tree; when their files differ between the revisions (re-recorded), each
  revision verifies both copies and the report says so.

Exit code 0 when the fixtures' reports are the same in both revisions, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.worktree import UsageError, checkouts, git, resolve, tree_env
from tests.core.test_layers import cycles

EXIT_USAGE = 2
FIXTURES = Path("tests") / "replay" / "data"
GRAPH = (
    "import grimp, json; g = grimp.build_graph('fleetlog', cache_dir=None); m = set(g.modules); "
    "print(json.dumps({k: sorted(g.find_modules_directly_imported_by(k) & m) for k in sorted(m)}))"
)


def lines(tree: Path) -> dict[str, int]:
    """Every file git tracks under ``fleetlog/`` in ``tree`` and its number of lines."""
    files = git("ls-files", "fleetlog", cwd=tree).splitlines()
    return {name: (tree / name).read_bytes().count(b"\n") for name in sorted(files)}


def tree_diff(before: dict[str, int], after: dict[str, int]) -> dict[str, Any]:
    """Each file's lines before and after and what happened to it; totals per package."""
    files: dict[str, dict[str, Any]] = {}
    for name in sorted(before.keys() | after.keys()):
        b, a = before.get(name), after.get(name)
        status = "new" if b is None else "removed" if a is None else "changed" if a != b else ""
        files[name] = {"before": b, "after": a, "delta": (a or 0) - (b or 0), "status": status}
    packages: dict[str, dict[str, int]] = {}
    for name, row in files.items():
        package = str(Path(name).parent)
        total = packages.setdefault(package, {"before": 0, "after": 0, "files_before": 0, "files_after": 0})
        for side in ("before", "after"):
            if row[side] is not None:
                total[side] += row[side]
                total[f"files_{side}"] += 1
    totals = {
        k: sum(p[k] for p in packages.values()) for k in ("before", "after", "files_before", "files_after")
    }
    return {"files": files, "packages": dict(sorted(packages.items())), "total": totals}


def import_graph(tree: Path) -> dict[str, set[str]]:
    """Each ``fleetlog`` module of ``tree`` and the ``fleetlog`` modules it imports directly."""
    done = subprocess.run(
        [sys.executable, "-c", GRAPH],
        cwd=tree,
        env=tree_env(tree),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"import graph of {tree}: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return {module: set(imported) for module, imported in json.loads(done.stdout).items()}


def graph_facts(tree: Path) -> dict[str, Any]:
    edges = import_graph(tree)
    return {
        "modules": len(edges),
        "imports": sum(len(v) for v in edges.values()),
        "cycles": cycles(edges),
    }


def digest_of(directory: Path) -> str:
    """One hash of every file's path and bytes under ``directory`` (are two fixtures the same?)."""
    h = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def verify(code: Path, log: Path) -> dict[str, Any]:
    """``fleetlog replay verify --json`` of the revision in ``code`` over ``log`` (exit 0: clean,
    1: diverged, as the divergent fixture must)."""
    argv = [sys.executable, "-m", "fleetlog.cli", "replay", "verify", "--log", str(log), "--json"]
    done = subprocess.run(argv, cwd=code, env=tree_env(code), capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1) or not done.stdout.strip():
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return {"error": last, "exit_code": done.returncode}
    return {"exit_code": done.returncode, **json.loads(done.stdout)}


def fixtures(before: Path, after: Path) -> dict[str, Any]:
    """Each fixture verified by both revisions; ``same`` when every report is identical."""
    names = sorted(p.name for p in (after / FIXTURES).iterdir() if p.is_dir())
    out: dict[str, Any] = {}
    for name in names:
        copies = {side: tree / FIXTURES / name for side, tree in (("before", before), ("after", after))}
        hashes = {side: digest_of(path) if path.is_dir() else None for side, path in copies.items()}
        logs = {"after": copies["after"]}
        if hashes["before"] is not None and hashes["before"] != hashes["after"]:
            logs["before"] = copies["before"]  # re-recorded: each revision verifies each copy
        on = {side: f" on the {side} copy" if len(logs) > 1 else "" for side in logs}
        reports = {
            f"{code_side} code{on[log_side]}": verify(code, log)
            for log_side, log in logs.items()
            for code_side, code in (("before", before), ("after", after))
        }
        same = "error" not in next(iter(reports.values())) and all(
            r == next(iter(reports.values())) for r in reports.values()
        )
        out[name] = {"fixture_files": hashes, "same_files": hashes["before"] == hashes["after"]}
        out[name] |= {"same_reports": same, "reports": reports}
    return out


def shape(before: Path, after: Path) -> dict[str, Any]:
    """The whole report over two checked-out trees."""
    return {
        "tree": tree_diff(lines(before), lines(after)),
        "graph": {"before": graph_facts(before), "after": graph_facts(after)},
        "fixtures": fixtures(before, after),
    }


def show(result: dict[str, Any]) -> None:
    """The report for people: the tree as a table, then cycles, then fixtures."""
    from rich.table import Table

    from fleetlog.display import console

    out = console()
    tree = result["tree"]
    table = Table(title="fleetlog/ files (lines)", title_justify="left")
    for column in ("file", "before", "after", "±", ""):
        table.add_column(column, justify="left" if column in ("file", "") else "right")
    for name, row in tree["files"].items():
        style = {"new": "green", "removed": "red", "changed": "yellow"}.get(row["status"])
        table.add_row(
            name, _n(row["before"]), _n(row["after"]), _delta(row["delta"]), row["status"], style=style
        )
    out.print(table)
    packages = Table(title="packages (files, lines)", title_justify="left")
    for column in ("package", "files before", "files after", "lines before", "lines after", "±"):
        packages.add_column(column, justify="left" if column == "package" else "right")
    for name, p in [*tree["packages"].items(), ("total", tree["total"])]:
        row = (p["files_before"], p["files_after"], p["before"], p["after"])
        packages.add_row(name, *(str(v) for v in row), _delta(p["after"] - p["before"]))
    out.print(packages)
    for side in ("before", "after"):
        g = result["graph"][side]
        found = "; ".join(" <-> ".join(c) for c in g["cycles"]) or "none"
        out.print(
            f"import cycles {side}: {len(g['cycles'])} "
            f"({g['modules']} modules, {g['imports']} imports): {found}"
        )
    for name, f in result["fixtures"].items():
        files = "same files" if f["same_files"] else "DIFFERENT files (re-recorded)"
        verdict = "identical reports" if f["same_reports"] else "REPORTS DIFFER"
        out.print(f"replay fixture {name}: {files}, {verdict}")
        for who, r in f["reports"].items():
            said = r.get("error") or (
                f"ok={r['ok']} batches={r['batches']} decisions={r['decisions']} "
                f"final_digest={r['final_digest']}" + _diverged(r)
            )
            out.print(f"  {who}: {said}")


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)


def _delta(value: int) -> str:
    return f"{value:+d}" if value else ""


def _diverged(report: dict[str, Any]) -> str:
    d = report.get("divergence")
    return f" diverged at decisions@{d.get('decisions_offset')} ({d.get('what')})" if d else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.shape",
        description=__doc__,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--before", required=True, help="a git revision")
    parser.add_argument("--after", required=True, help="a git revision")
    parser.add_argument("--json", action="store_true", help="one JSON object for scripts")
    args = parser.parse_args(argv)
    try:
        commits = [resolve(args.before), resolve(args.after)]
        with checkouts(args.before, args.after) as (before, after):
            result = {
                "before": {"rev": args.before, "commit": commits[0]},
                "after": {"rev": args.after, "commit": commits[1]},
                **shape(before, after),
            }
    except UsageError as bad:
        print(f"{parser.prog}: error: {bad}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted (worktrees removed)", file=sys.stderr)
        return 130
    except RuntimeError as failed:
        print(f"{parser.prog}: {failed}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        show(result)
    return 0 if all(f["same_reports"] for f in result["fixtures"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
