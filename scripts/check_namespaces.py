#!/usr/bin/env python3
"""Checks that every file under src/ declares its code in its layer's namespace.

The namespace follows the folder: src/util/ is `agentkv` itself (the
vocabulary every layer shares: Status, Result, hashing); every other folder
is `agentkv::` plus its path below src/, leaving out `engine/` for the
engine's parts: src/cache/ -> agentkv::cache, src/engine/ (the runtime) ->
agentkv::engine, src/engine/text/chat/ -> agentkv::text::chat,
src/engine/backend/cuda/kernels/ -> agentkv::backend::cuda::kernels. A file
may open namespaces nested in its own (a `detail`-like helper namespace),
anonymous ones, and the namespace of another layer only to forward-declare
a type there (`namespace agentkv::text { class Tokenizer; }`).

  check_namespaces.py SRC [--plant FILE NAMESPACE]

--plant pretends FILE (relative to SRC) opens NAMESPACE with a definition
in it: the test suite uses it to show that a misplaced file fails.
"""
import os
import re
import sys

OPEN = re.compile(r'^\s*namespace\s+([A-Za-z_][\w:]*)\s*\{(.*)$')


def expected(rel):
    parts = rel.split('/')[:-1]
    if parts and parts[0] == 'engine':
        parts = parts[1:] or ['engine']
    if not parts or parts[0] == 'util':
        return 'agentkv'
    return 'agentkv::' + '::'.join(parts)


def blocks(lines):
    """Yields (namespace, forward_declarations_only) for each top-level block.

    clang-format indents no namespace, so blocks open at column 0 and close
    with a column-0 `}`; nested blocks count as their outer block's code.
    """
    stack = []  # [name, body lines, brace depth inside the block]
    for line in lines:
        m = OPEN.match(line)
        if m and not line.startswith((' ', '\t')):
            stack.append([m.group(1), [m.group(2)], 0])
            continue
        code = re.sub(r'//.*|"([^"\\]|\\.)*"|\'([^\'\\]|\\.)*\'', '', line)
        if stack and stack[-1][2] == 0 and re.match(r'^\}\s*$', code):
            name, body, _ = stack.pop()
            if stack:
                stack[-1][1].extend(body)
                continue
            code = [b for b in body if b.strip() and not b.strip().startswith('//')]
            fwd = all(re.match(r'^\s*(class|struct)\s+\w+;\s*(//.*)?$', b) for b in code)
            yield name, fwd
            continue
        if stack:
            stack[-1][1].append(line)
            stack[-1][2] += code.count('{') - code.count('}')


def check(src, plants):
    bad = []
    for root, _, files in os.walk(src):
        for f in sorted(files):
            if not f.endswith(('.h', '.cc', '.cu', '.cuh')):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, src)
            want = expected(rel)
            lines = open(path, encoding='utf-8').read().split('\n')
            for ns in plants.get(rel, []):
                lines += [f'namespace {ns} {{', 'int planted = 0;', '}']
            for name, fwd in blocks(lines):
                if name == want or (want != 'agentkv' and name.startswith(want + '::')) or fwd:
                    continue
                if want == 'agentkv' and not name.startswith('agentkv'):
                    bad.append(f'{rel}: namespace {name} is outside agentkv')
                    continue
                bad.append(f'{rel}: opens namespace {name}; a file of src/'
                           f'{os.path.dirname(rel)}/ is in {want}')
    return bad


def main(argv):
    src = argv[1]
    plants = {}
    rest = argv[2:]
    while rest:
        if rest[0] != '--plant' or len(rest) < 3:
            sys.exit('usage: check_namespaces.py SRC [--plant FILE NAMESPACE]...')
        plants.setdefault(rest[1], []).append(rest[2])
        rest = rest[3:]
    bad = check(src, plants)
    for b in bad:
        print(b)
    if bad:
        print(f'{len(bad)} file(s) outside their layer\'s namespace')
        return 1
    print('every file is in its layer\'s namespace')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
