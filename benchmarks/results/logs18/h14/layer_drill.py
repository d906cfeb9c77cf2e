import collections, os, re, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from count_hlo import parse
def drill(path, stack, layer="layer5", depth=2):
    comps, caller, entry = parse(path)
    def owner(c):
        while c in caller and caller[c][2] in ("calls", "to_apply"):
            pc, rec, _ = caller[c]
            if rec["name"]: return rec["name"]
            c = pc
        return ""
    cnt, per_layer, ops = collections.Counter(), collections.Counter(), collections.Counter()
    topk = collections.Counter()
    for c, recs in comps.items():
        own = owner(c); top = c == entry or (c in caller and caller[c][2] in ("body", "condition"))
        for r in recs:
            nm = r["name"] or own
            m = re.search(stack + r"/(layer\d+)/(.*)", nm)
            if not m: continue
            per_layer[m.group(1)] += 1
            if m.group(1) != layer: continue
            rest = [p for p in m.group(2).split("/") if p not in ("jit(block)", "vmap()")]
            cnt["/".join(rest[:depth])] += 1; ops[r["op"]] += 1
            if top: topk[r["op"] + ":" + "/".join(rest[:1])] += 1
    v = sorted(per_layer.items(), key=lambda kv: int(kv[0][5:]))
    print(f"{path} {stack}: per layer {[n for _, n in v]}")
    print(f"  {layer}: {sum(cnt.values())} instr; by sub-scope:", ", ".join(f"{s} {n}" for s, n in cnt.most_common(18)))
    print("   ops:", ", ".join(f"{s} {n}" for s, n in ops.most_common(15)))
    print("   top-level:", ", ".join(f"{s} {n}" for s, n in topk.most_common(15)))
drill("/tmp/h14/start.hlo.txt", "prefill/while/body/TGT")
drill("/tmp/h14/start.hlo.txt", "prefill/while/body/DRF")
drill("/tmp/h14/rounds.hlo.txt", "verify/TGT")
drill("/tmp/h14/rounds.hlo.txt", "draft/while/body/closed_call/DRF")
print("---- layer0")
drill("/tmp/h14/rounds.hlo.txt", "verify/TGT", "layer0")
drill("/tmp/h14/rounds.hlo.txt", "draft/while/body/closed_call/DRF", "layer0")
