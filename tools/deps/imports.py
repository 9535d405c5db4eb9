#!/usr/bin/env python3
"""The import drawing: which module of a crate uses which (``crate::a::b`` paths and
``super::`` paths, comments and tests excluded), and the cycles among them (strongly
connected components of more than one module). Also the graph between the workspace's
crates, from their Cargo.toml files.

    python3 tools/deps/imports.py actors/src            # modules of one crate
    python3 tools/deps/imports.py --crates .            # crates of the workspace

Exit 1 when there is a cycle, so CI can run it.
"""
import os, re, sys

def modules(src):
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith('.rs'):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src)[:-3]
            parts = rel.split(os.sep)
            if parts[-1] in ('lib', 'main', 'mod'):
                parts = parts[:-1]
            mods['::'.join(parts)] = path
    return mods

def strip(text):
    # Drop unit-test modules and comments: what tests import is not the architecture.
    i = text.find('#[cfg(test)]\nmod tests')
    if i >= 0:
        text = text[:i]
    return re.sub(r'//[^\n]*', '', text)

def edges(src):
    mods = modules(src)
    names = set(mods)
    out = {m: set() for m in mods}
    for m, path in mods.items():
        # `pub mod x;` declarations are the file tree, not uses.
        text = re.sub(r'^\s*(pub(\([^)]*\))? )?mod \w+;', '', strip(open(path).read()), flags=re.M)
        here = m.split('::') if m else []
        refs = set()
        for p in re.findall(r'\bcrate((?:::\w+)+)', text):
            refs.add(tuple(p.strip(':').split('::')))
        for p in re.findall(r'\bsuper((?:::\w+)+)', text):
            base = here[:-1]
            refs.add(tuple(base + p.strip(':').split('::')))
        # grouped imports: use crate::{a::b, c}
        for grp in re.findall(r'\buse crate::\{([^}]*)\}', text):
            for item in grp.split(','):
                item = item.strip()
                if item:
                    refs.add(tuple(item.split('::')))
        for r in refs:
            r = list(r)
            # the longest module prefix of the path
            for k in range(len(r), 0, -1):
                cand = '::'.join(r[:k])
                if cand in names:
                    # A use of the crate root (`crate::Foo`, the lib.rs re-exports) is
                    # not an edge; a parent's and a child's uses of each other are.
                    if cand and cand != m:
                        out[m].add(cand)
                    break
    return out

def sccs(g):
    index, low, on, stack, res, n = {}, {}, set(), [], [], [0]
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1
        stack.append(v); on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                res.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in g:
        if v not in index:
            visit(v)
    return res

def crate_edges(root):
    try:
        import tomllib
    except ImportError:
        import tomli as tomllib
    ws = tomllib.load(open(os.path.join(root, 'Cargo.toml'), 'rb'))
    members = []
    for m in ws['workspace']['members']:
        if m.endswith('/*'):
            d = os.path.join(root, m[:-2])
            members += [os.path.join(m[:-2], x) for x in sorted(os.listdir(d)) if os.path.exists(os.path.join(d, x, 'Cargo.toml'))]
        else:
            members.append(m)
    members.append('.')
    g = {}
    for m in members:
        t = tomllib.load(open(os.path.join(root, m, 'Cargo.toml'), 'rb'))
        name = t['package']['name']
        deps = set(k for k in t.get('dependencies', {}) if k.startswith('hanzod'))
        g[name] = deps
    return g

if __name__ == '__main__':
    if sys.argv[1] == '--crates':
        g = crate_edges(sys.argv[2])
    else:
        g = edges(sys.argv[1])
    for m in sorted(g):
        print(f'{m or "(root)"} -> {", ".join(sorted(g[m])) or "-"}')
    cyc = sccs(g)
    print(f'\ncycles: {len(cyc)}')
    for c in cyc:
        print('  ' + ' <-> '.join(c))
    sys.exit(1 if cyc else 0)
