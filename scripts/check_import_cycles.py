"""Fail on any import cycle between kfactory modules (`make lint`).

The import graph is grimp's (import-linter's graph library): it resolves relative imports and `from pkg import
module`, and it sees every import statement, those inside functions too. A lazy import inside a function is how a
cycle is usually hidden, not removed, so it counts here; only imports under `if TYPE_CHECKING:` are left out (they
never run). Each cycle is a strongly connected component of the module graph (Tarjan), printed with the import
lines that close it, so the fix can start from the file and line.

Usage: python scripts/check_import_cycles.py [PACKAGE]   (exit 1 when a cycle is found)
"""

from __future__ import annotations

import sys

import grimp


def import_graph(package: str) -> tuple[dict[str, set[str]], grimp.ImportGraph]:
    """Module -> the modules of the package it imports (TYPE_CHECKING imports left out), and grimp's graph."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=True)
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}, graph


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        # an explicit stack of (module, its remaining successors): the recursive form is limited by recursion depth
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            nxt = next(successors, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(component: list[str], edges: dict[str, set[str]], graph: grimp.ImportGraph) -> list[str]:
    """The import lines between members of one cycle: 'importer:line -> imported  (statement)'."""
    members = set(component)
    lines = []
    for importer in component:
        for imported in sorted(edges[importer] & members):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"  {importer}:{detail['line_number']} -> {imported}  ({detail['line_contents']})")
    return lines


def main(argv: list[str]) -> int:
    """Print every cycle in the package (kfactory unless named) and return 1 if there is one."""
    package = argv[1] if len(argv) > 1 else "kfactory"
    edges, graph = import_graph(package)
    found = cycles(edges)
    for component in found:
        print(f"import cycle: {' <-> '.join(component)}")
        print("\n".join(describe(component, edges, graph)))
    if found:
        print(f"{len(found)} import cycle(s) in {package}", file=sys.stderr)
        return 1
    print(f"no import cycle in {package} ({len(edges)} modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
