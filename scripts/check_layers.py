#!/usr/bin/env python3
"""Checks that every #include under src/ goes down the layer graph.

Each folder of src/ is a library (CMakeLists.txt, agentkv_layer); the build
writes the libraries, their folders and their DEPS to build/layers.txt. A
file may include headers of its own library and of the libraries its
library depends on, directly or through others (PUBLIC links); anything else
is a dependency in the wrong direction. Static libraries do not catch an
include of a header-only type, hence this check (a ctest test).

  check_layers.py LAYERS SRC [--plant FILE HEADER]...

--plant pretends FILE (relative to SRC) also includes HEADER: the test suite
uses it to show that a wrong-direction include fails. src/cli (the binary)
may include anything.
"""
import os
import re
import sys


def load_layers(path):
    layers = {}
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        name, folder, mode, files, deps = line.split('|')
        layer = layers.setdefault(name, {'dir': folder, 'mode': mode, 'files': set(), 'deps': set()})
        layer['files'] |= {f for f in files.split(',') if f}
        layer['deps'] |= {d for d in deps.split(',') if d}
    return layers


def closure(layers, name, seen=None):
    seen = set() if seen is None else seen
    if name in seen:
        return seen
    seen.add(name)
    for d in layers.get(name, {}).get('deps', ()):
        closure(layers, d, seen)
    return seen


def layer_of(layers, rel):
    """The library a file (path relative to src/) belongs to, or None."""
    folder, base = os.path.split(rel)
    stem = base.split('.')[0]
    best, best_len = None, -1
    for name, l in layers.items():
        if l['mode'] == 'FILES':
            if folder == l['dir'] and stem in l['files']:
                return name
            continue
        if folder == l['dir'] or (l['mode'] == 'RECURSE' and folder.startswith(l['dir'] + '/')):
            if len(l['dir']) > best_len:
                best, best_len = name, len(l['dir'])
    return best


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    layers = load_layers(argv[1])
    src = argv[2]
    planted = {}
    rest = argv[3:]
    while rest:
        if rest[0] != '--plant' or len(rest) < 3:
            print('bad arguments: ' + ' '.join(rest))
            return 2
        planted.setdefault(rest[1], []).append(rest[2])
        rest = rest[3:]
    allowed = {name: closure(layers, name) for name in layers}
    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
    errors = []
    checked = 0
    for root, _, files in os.walk(src):
        for f in sorted(files):
            if not f.endswith(('.h', '.cc', '.cu', '.cuh')):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)
            if rel.startswith('cli/'):
                continue
            mine = layer_of(layers, rel)
            if mine is None:
                errors.append('%s: in no library of layers.txt' % rel)
                continue
            checked += 1
            with open(os.path.join(root, f), encoding='utf-8', errors='replace') as fh:
                headers = include.findall(fh.read()) + planted.get(rel, [])
            for h in headers:
                if not os.path.exists(os.path.join(src, h)):
                    continue  # not a project header (or a relative one of the same folder)
                theirs = layer_of(layers, h)
                if theirs is None or theirs in allowed[mine]:
                    continue
                errors.append('%s (%s) includes %s (%s): %s does not depend on %s' %
                              (rel, mine, h, theirs, mine, theirs))
    for e in errors:
        print(e)
    print('%d files checked, %d wrong-direction includes' % (checked, len(errors)))
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
