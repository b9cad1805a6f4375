"""Shared by the trace readers (kernel_timeline.py, step_gaps.py): short
kernel names and the cut of a trace into engine steps."""
import re


def short(mangled):
    """The kernel's own name and its integer template arguments from an
    Itanium-mangled name: _Z[N]<length><identifier>... then I...E with the
    template arguments (Li64E an int 64, Lb1E a bool)."""
    if not mangled.startswith("_Z"):
        return mangled[:60]
    at = 3 if mangled.startswith("_ZN") else 2
    name = mangled[:60]
    while at < len(mangled) and mangled[at].isdigit():
        m = re.match(r"\d+", mangled[at:])
        n = int(m.group(0))
        at += len(m.group(0))
        name = mangled[at:at + n]
        at += n
    args = re.match(r"I((?:L[a-z]\d+E)+)E", mangled[at:])
    if args:
        name += "<" + ",".join(re.findall(r"L[a-z](\d+)E", args.group(1))) + ">"
    return name


def split_steps(rows, name):
    """Rows in start order cut into steps, a step starting at each Embed
    kernel; name(row) gives a row's kernel name."""
    steps, cur = [], []
    for r in rows:
        if "Embed" in name(r) and cur:
            steps.append(cur)
            cur = []
        cur.append(r)
    if cur:
        steps.append(cur)
    return steps
