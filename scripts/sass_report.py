#!/usr/bin/env python3
"""What the compiler made of each kernel in a CUDA object, without a GPU.

Per kernel: registers, stack bytes (spills), SASS instructions, local-memory accesses, global
stores by width, and with --loops every loop (backward branch) with its size and busiest
opcodes. With --base OTHER.o, only the kernels that differ, old -> new. It reads the objects with
`cuobjdump` (from PATH, the CUDA toolkit, or the `nvidia-cuda-cuobjdump` wheel).

  python3 scripts/sass_report.py build/CMakeFiles/swiftqk.dir/src/epilogue_table_bf16.cu.o \\
      --kernel 'qk_epilogue' --loops
  python3 scripts/sass_report.py new.o --base old.o

Static counts are not time: a change they favour still has to be measured on a GPU
(docs/performance.md), but a new spill or a store split into narrower ones shows here first.
"""
import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys

INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
FUNC_SASS = re.compile(r"Function : (\S+)")
FUNC_RES = re.compile(r"Function (\S+):")
RES = re.compile(r"REG:(\d+) STACK:(\d+)")
BRANCH = re.compile(r"\bBRA\b.*?(0x[0-9a-f]+)")
PREDICATE = re.compile(r"^@!?U?P\w+\s+")


def find_cuobjdump():
    """cuobjdump from PATH, the toolkit next to nvcc, or the nvidia-cuda-cuobjdump wheel."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    nvcc = shutil.which("nvcc")
    if nvcc:
        beside = os.path.join(os.path.dirname(os.path.realpath(nvcc)), "cuobjdump")
        if os.path.exists(beside):
            return beside
    try:
        import nvidia  # the wheels' namespace package

        for root in nvidia.__path__:
            for path in glob.glob(os.path.join(root, "*", "bin", "cuobjdump")):
                return path
    except ImportError:
        pass
    sys.exit("sass_report.py: no cuobjdump (install the CUDA toolkit's, or "
             "`pip install nvidia-cuda-cuobjdump`)")


def opcode(instruction):
    """The opcode of one SASS instruction, without predicate or modifiers: 'STG', 'FFMA'."""
    return PREDICATE.sub("", instruction).split()[0].split(".")[0]


def parse_sass(text):
    """{kernel: [(address, instruction), ...]} from `cuobjdump -sass` output."""
    kernels = collections.OrderedDict()
    name = None
    for line in text.splitlines():
        m = FUNC_SASS.search(line)
        if m:
            name = m.group(1)
            kernels[name] = []
            continue
        m = INSTR.match(line)
        if m and name is not None:
            kernels[name].append((int(m.group(1), 16), m.group(2).strip()))
    return kernels


def parse_resources(text):
    """{kernel: (registers, stack bytes)} from `cuobjdump -res-usage` output."""
    out = {}
    name = None
    for line in text.splitlines():
        m = FUNC_RES.search(line)
        if m:
            name = m.group(1)
            continue
        m = RES.search(line)
        if m and name is not None:
            out[name] = (int(m.group(1)), int(m.group(2)))
            name = None
    return out


def store_widths(instructions):
    """Plain global stores by width: {'STG.128': n, 'STG.64': n, 'STG.32': n, 'STG.16': n, ...}.
    System-scope (.STRONG.SYS) stores, the exchange's, are counted apart as 'STG.sys'."""
    counts = collections.Counter()
    for _, ins in instructions:
        body = PREDICATE.sub("", ins)
        if not body.startswith("STG"):
            continue
        mods = body.split()[0].split(".")[1:]
        if "SYS" in mods:
            counts["STG.sys"] += 1
            continue
        width = next((m for m in mods if m in ("128", "64", "U16", "16", "U8", "S8", "S16")), "32")
        counts["STG." + width.replace("U", "").replace("S", "")] += 1
    return counts


def loops(instructions):
    """[(first index, last index)] of every backward branch's body, outermost first."""
    index = {addr: i for i, (addr, _) in enumerate(instructions)}
    found = []
    for i, (addr, ins) in enumerate(instructions):
        m = BRANCH.search(ins)
        if m:
            target = int(m.group(1), 16)
            if target <= addr and target in index:
                found.append((index[target], i))
    return sorted(found)


def summary(instructions, resources):
    regs, stack = resources if resources else (None, None)
    ops = collections.Counter(opcode(ins) for _, ins in instructions)
    return {
        "registers": regs,
        "stack": stack,
        "instructions": len(instructions),
        "local": ops["LDL"] + ops["STL"],
        "stores": dict(store_widths(instructions)),
    }


def demangle(names):
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt or not names:
        return {n: n for n in names}
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True).stdout
    return dict(zip(names, out.splitlines()))


def report(obj, cuobjdump):
    sass = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True, check=True)
    res = subprocess.run([cuobjdump, "-res-usage", obj], capture_output=True, text=True, check=True)
    kernels = parse_sass(sass.stdout)
    resources = parse_resources(res.stdout)
    return kernels, {k: summary(v, resources.get(k)) for k, v in kernels.items()}


def fmt(s):
    stores = " ".join(f"{k}:{v}" for k, v in sorted(s["stores"].items()))
    return (f"regs {s['registers']} stack {s['stack']} instr {s['instructions']} "
            f"local {s['local']} {stores}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("object", help="a CUDA object (.o) or anything cuobjdump reads")
    ap.add_argument("--kernel", default="", help="only kernels whose demangled name matches")
    ap.add_argument("--loops", action="store_true", help="list each kernel's loops")
    ap.add_argument("--base", help="another build of the object: show only what differs")
    args = ap.parse_args(argv)
    cuobjdump = find_cuobjdump()
    kernels, new = report(args.object, cuobjdump)
    names = demangle(list(new))
    pattern = re.compile(args.kernel)
    if args.base:
        _, old = report(args.base, cuobjdump)
        total = [0, 0]
        for k, s in new.items():
            if not pattern.search(names[k]) or k not in old:
                continue
            total[0] += old[k]["instructions"]
            total[1] += s["instructions"]
            if old[k] != s:
                print(names[k])
                print("  was " + fmt(old[k]))
                print("  now " + fmt(s))
        gone = [k for k in old if k not in new]
        added = [k for k in new if k not in old]
        print(f"instructions in the kernels of both: {total[0]} -> {total[1]}; "
              f"{len(added)} kernels only in the object, {len(gone)} only in the base")
        return 0
    for k, s in new.items():
        if not pattern.search(names[k]):
            continue
        print(names[k])
        print("  " + fmt(s))
        if args.loops:
            ins = kernels[k]
            for first, last in loops(ins):
                ops = collections.Counter(opcode(t) for _, t in ins[first:last + 1])
                top = ", ".join(f"{o}:{n}" for o, n in ops.most_common(10))
                print(f"  loop {ins[first][0]:#06x}-{ins[last][0]:#06x}: "
                      f"{last - first + 1:5d} instructions  {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
