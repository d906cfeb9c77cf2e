"""Compiled HLO text: instructions (lines with ' = ') attributed to a scope: an instruction's own op_name, else
that of the instruction calling its computation (fusion, reduce's to_apply, ...), else '(plumbing)'."""
import collections, re, sys

SKIP = {"while", "body", "cond", "closed_call", "jit(block)", "vmap()"}

def scope(nm, depth):
    if not nm: return ""
    parts = [p for p in nm.split("/")[1:] if p not in SKIP]
    out = []
    for p in parts:
        if re.fullmatch(r"layer\d+", p): out.append("layerN"); break
        out.append(p)
        if len(out) >= depth: break
    return "/".join(out)

def parse(path):
    comps, order, cur, entry = collections.defaultdict(list), [], None, None
    caller = {}
    for line in open(path):
        h = re.match(r"(ENTRY )?%?([\w.\-]+) \(.*\{\s*$", line)
        if h and not line.startswith(" "):
            cur = h.group(2); order.append(cur)
            if h.group(1): entry = cur
            continue
        if cur is None or " = " not in line: continue
        op = re.search(r" = (?:\([^=]*\)|\S+) ([\w\-]+)\(", line)
        nm = re.search(r'op_name="([^"]*)"', line)
        rec = dict(op=op.group(1) if op else "?", name=nm.group(1) if nm else "", comp=cur)
        comps[cur].append(rec)
        for m in re.finditer(r"(calls|body|condition|to_apply|branch_computations|true_computation|false_computation)=(\{[^}]*\}|%[\w.\-]+)", line):
            for r in re.findall(r"%([\w.\-]+)", m.group(2)):
                caller[r] = (cur, rec, m.group(1))
    return comps, caller, entry

def main(path, depth=3):
    comps, caller, entry = parse(path)
    def kind(c):
        if c == entry: return "entry"
        if c not in caller: return "?"
        _, rec, attr = caller[c]
        if attr in ("body", "condition", "branch_computations", "true_computation", "false_computation"): return "loop"
        return "nested"
    def owner(c):  # op_name inherited by a nested computation
        seen = 0
        while c in caller and kind(c) == "nested" and seen < 50:
            pc, rec, _ = caller[c]
            if rec["name"]: return rec["name"]
            c = pc; seen += 1
        return ""
    total = collections.Counter(); bykind = collections.Counter(); top = collections.Counter(); topfus = collections.Counter()
    nameless = collections.Counter()
    for c, recs in comps.items():
        k = kind(c); own = owner(c) if k == "nested" else ""
        roots = [r["name"] for r in recs if r["name"]]
        for r in recs:
            nm = r["name"] or own or (roots[-1] if k == "nested" and roots else "")
            s = scope(nm, depth) if nm else f"(plumbing: {r['op']})"
            total[s] += 1; bykind[k] += 1
            if k in ("entry", "loop"):
                top[r["op"]] += 1
                if r["op"] == "fusion" or r["op"] == "custom-call": topfus[s] += 1
    n = sum(total.values())
    print(f"{path}: {n} instructions ({dict(bykind)})")
    print("  top-level ops:", ", ".join(f"{o} {c}" for o, c in top.most_common(10)))
    print("  by scope (all instructions):")
    for s, c in total.most_common(22): print(f"   {c:7d} {100*c/n:5.1f}%  {s}")
    print("  top-level fusions+custom-calls (thunks) by scope:", ", ".join(f"{s} {c}" for s, c in topfus.most_common(10)))
    return total

if __name__ == "__main__":
    d = int(sys.argv[1]) if sys.argv[1].isdigit() else None
    for p in sys.argv[2 if d else 1:]: main(p, d or 3)
