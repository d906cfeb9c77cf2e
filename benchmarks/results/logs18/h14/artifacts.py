"""Compiled CPU HLO: instructions that are CPU-only (bf16->f32 convert / layout-copy fusions with no op_name, and
their bodies) or prototype-only (the scan prototype's stack of per-layer leaves and unstack slices)."""
import collections, os, re, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from count_hlo import parse
CPU_ONLY = re.compile(r"^(convert_bitcast_fusion|wrapped_convert|copy_bitcast_fusion|convert_convert_fusion|wrapped_copy|bitcast_copy_fusion|slice_convert_fusion)")
for path in sys.argv[1:]:
    comps, caller, entry = parse(path)
    lines = open(path).read().splitlines()
    # map fusion instruction name -> called computation, for nameless CPU-only fusions
    cpu_comps, cpu_fusions = set(), 0
    for l in lines:
        m = re.match(r"\s+(?:ROOT )?%([\w.\-]+) = .* fusion\(.*calls=%([\w.\-]+)", l)
        if m and "op_name" not in l and CPU_ONLY.match(m.group(1)):
            cpu_comps.add(m.group(2)); cpu_fusions += 1
    def nested_in(c):
        seen = set()
        while c in caller and c not in seen:
            seen.add(c)
            if c in cpu_comps: return True
            c = caller[c][0]
        return False
    cpu_body = sum(len(v) for c, v in comps.items() if nested_in(c))
    proto = 0
    for c, v in comps.items():
        for r in v:
            if re.search(r"/(stack|slice)$|/stack/|unstack", r["name"]) and re.search(r"(prefill|verify|draft|commit)/(stack|slice)", r["name"]): proto += 1
    total = sum(len(v) for v in comps.values())
    params = sum(1 for r in comps[entry] if r["op"] == "parameter")
    print(f"{path}: total {total}; CPU-only convert/copy fusions {cpu_fusions} + bodies {cpu_body}; stack/unstack-scoped {proto}; entry parameters {params}; rest {total - cpu_fusions - cpu_body - proto}")
