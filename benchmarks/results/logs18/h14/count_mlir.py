"""Inlined StableHLO op count of a lowered module, attributed to the scope (loc name) of the op in main
or of the outermost func.call in main that reaches it."""
import collections, functools, re, sys

def parse(path):
    text = open(path).read()
    locs = {}
    for line in text.splitlines():
        m = re.match(r"(#loc\d*) = loc\((.*)\)$", line)
        if m:
            locs[m.group(1)] = m.group(2)
    @functools.cache
    def name(ref):
        body = locs.get(ref, "")
        s = re.match(r'"([^"]*)"', body)
        if s:
            return s.group(1)
        r = re.search(r"(#loc\d*)", body)
        return name(r.group(1)) if r else "?"
    funcs, cur = collections.defaultdict(list), None
    for line in text.splitlines():
        h = re.match(r"\s*func\.func (?:private |public )?@([\w.$]+)\(", line)
        if h:
            cur = h.group(1); continue
        if cur is None or line.startswith("#loc"):
            continue
        st = line.strip()
        m = re.match(r'(?:%\S+ = )?"?([a-z_]+\.[a-z_.]+|call(?= @))', st)
        if not m or st.startswith(("return", "}")) or m.group(1) in ("stablehlo.return", "func.return"):
            continue
        op = m.group(1)
        l = re.search(r"loc\((#loc\d*)\)\s*$", line)
        callee = re.search(r"call @([\w.$]+)\(", line) if op in ("func.call", "call") else None
        if op == "stablehlo.custom_call":
            c = re.search(r"custom_call @([\w.$]+)", line); op = "custom_call:" + c.group(1)
        funcs[cur].append((op, name(l.group(1)) if l else "?", callee.group(1) if callee else None))
    return funcs

def main(path, depth=4):
    funcs = parse(path)
    @functools.cache
    def total(fn):
        return sum(1 + (total(c) if c else 0) for _, _, c in funcs[fn])  # the call op itself counts 1
    @functools.cache
    def kinds(fn):
        k = collections.Counter()
        for op, _, c in funcs[fn]:
            if c: k.update(kinds(c))
            else: k[op] += 1
        return k
    by_scope, by_callee = collections.Counter(), collections.Counter()
    for op, nm, c in funcs["main"]:
        n = total(c) + 0 if c else 1
        parts = [p for p in nm.split("/") if p not in ("while", "body", "cond", "branch_0_fun", "branch_1_fun")]
        scope = "/".join(re.sub(r"layer\d+", "layerN", p) for p in parts[1:depth])
        by_scope[scope] += n
        if c: by_callee[c] += n
    print(f"{path}: {total('main')} ops inlined (own ops of main {len(funcs['main'])}); functions {len(funcs)}")
    print("  by scope:")
    for s, n in by_scope.most_common(25): print(f"   {n:7d}  {s}")
    print("  calls from main by callee (inlined size x calls):")
    cnt = collections.Counter(c for _, _, c in funcs["main"] if c)
    for c, n in by_callee.most_common(15): print(f"   {n:7d}  {c}: {cnt[c]} calls x {total(c)}")
    k = kinds("main")
    print("  op kinds (inlined):", ", ".join(f"{o.replace('stablehlo.','')} {n}" for o, n in k.most_common(22)))
    return funcs, total

if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
