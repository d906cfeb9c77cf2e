"""SASS instructions of one 16-token sub-block's code unpack, per thread, for each per-warp body (issue 16).

CPU only: writes a PTX microkernel per body (the sub-block's key loads, unpack and mma.sync consumers,
the same bit tricks as jspec/pallas/int2_mosaic*.py), assembles it with ptxas for sm_90a and counts the
opcodes nvdisasm shows. The unpack alone, not the softmax or addressing: a check of the counts in
benchmarks/NOTES.md, and of what ptxas does with LLVM's and/or pairs.

    python benchmarks/unpack_sass.py        # needs ptxas and nvdisasm (pip nvidia-cuda-nvdisasm)
"""

from __future__ import annotations

import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

BF16, F16 = 0x43004300, 0x64006400


class Ptx:
    def __init__(self, lop3: bool):
        self.lines, self.n, self.lop3 = [], 0, lop3

    def reg(self):
        self.n += 1
        return f"%r{self.n}"

    def op(self, fmt, *args):
        out = self.reg()
        self.lines.append(fmt.format(out, *args))
        return out

    def andor(self, y, mask, magic):
        if self.lop3:
            return self.op("lop3.b32 {}, {}, {:#x}, {:#x}, 0xEA;", y, mask, magic)
        return self.op("or.b32 {}, {}, {:#x};", self.op("and.b32 {}, {}, {:#x};", y, mask), magic)


def unpack(body: str, lop3: bool):
    """PTX lines and the output registers of the keys (4 words) and values (one ldmatrix.x4) at D = 128."""
    p = Ptx(lop3)
    words = []
    for off in (0, 8):
        a, b = p.reg(), p.reg()
        p.lines.append(f"ld.shared.v2.b32 {{{a}, {b}}}, [%base+{off}];")
        words += [a, b]
    keys, shr = [], lambda x, s: p.op("shr.u32 {}, {}, {};", x, s)
    for x in words:
        if body == "lean8":  # u8: planes 0/1 in place, 2/3 after a shift by 4
            y = shr(x, 4)
            keys += [p.op("and.b32 {}, {}, {:#x};", x if i < 2 else y, 0x03030303 << 2 * (i % 2)) for i in range(4)]
            continue
        for y in (x, shr(x, 8)):
            for i in range(4):
                if body == "warp" and i == 3:
                    keys.append(p.andor(shr(y, 6), 0x00030003, BF16))
                else:
                    keys.append(p.andor(y, 0x00030003 << 2 * i, BF16 if body == "warp" else F16))
    vals = [p.reg() for _ in range(4)]
    p.lines.append(f"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{', '.join(vals)}}}, [%base+64];")
    values = []
    for x in vals:
        if body == "warp":
            for y in (x, shr(x, 8)):
                values += [p.andor(y, 0x00030003 << 2 * i, BF16) for i in range(3)]
                values.append(p.andor(shr(y, 6), 0x00030003, BF16))
        else:  # x, x >> 6, x >> 12
            src = {0: x, 6: shr(x, 6), 12: shr(x, 12)}
            for s, m in ((0, 3), (0, 0xC), (0, 0x30), (6, 3), (6, 0xC), (6, 0x30), (12, 3), (12, 0xC)):
                values.append(p.andor(src[s], m * 0x10001, BF16))
    return p, keys, values


def kernel(body: str, lop3: bool) -> str:
    p, keys, values = unpack(body, lop3)
    acc = [p.reg() for _ in range(4)]
    b = [p.reg(), p.reg()]
    tail = [f"mov.b32 {a}, 0;" for a in acc] + [f"ld.shared.v2.b32 {{{b[0]}, {b[1]}}}, [%base+128];"]
    bf16 = ("f32.bf16.bf16.f32", "k16")
    key_mma = {"lean8": ("s32.u8.s8.s32", "k32"), "lean": ("f32.f16.f16.f32", "k16")}.get(body, bf16)
    kinds = [key_mma] * (len(keys) // 4) + [bf16] * (len(values) // 4)
    regs = keys + values
    for j, (types, k) in enumerate(kinds):
        a = ", ".join(regs[4 * j:4 * j + 4])
        tail.append(f"mma.sync.aligned.m16n8{k}.row.col.{types} {{{', '.join(acc)}}}, {{{a}}}, "
                    f"{{{b[0]}, {b[1]}}}, {{{', '.join(acc)}}};")
    body_ptx = "\n  ".join(p.lines + tail)
    return f""".version 8.0
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 out)
{{
  .reg .b32 %r<{p.n + 2}>; .reg .b32 %base; .reg .b32 %t; .reg .b64 %rd;
  .shared .align 16 .b8 smem[512];
  mov.u32 %base, smem; mov.u32 %t, %tid.x; and.b32 %t, %t, 7; shl.b32 %t, %t, 4; add.u32 %base, %base, %t;
  {body_ptx}
  ld.param.u64 %rd, [out];
  st.global.v4.b32 [%rd], {{{', '.join(acc)}}};
  ret;
}}
"""


def nvdisasm():
    found = shutil.which("nvdisasm") or next(iter(glob.glob(os.path.join(os.path.dirname(os.__file__),
                                                                         "site-packages/nvidia/*/bin/nvdisasm"))), None)
    if not found:
        sys.exit("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    return found


def count(ptx: str, tmp: str) -> collections.Counter:
    src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
    open(src, "w").write(ptx)
    subprocess.run(["ptxas", "-arch=sm_90a", src, "-o", cubin], check=True)
    sass = subprocess.run([nvdisasm(), cubin], check=True, capture_output=True, text=True).stdout
    ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass)
    return collections.Counter(ops)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for body, lop3 in (("warp", False), ("warp", True), ("lean", True), ("lean8", True)):
            c = count(kernel(body, lop3), tmp)
            alu = c["LOP3"] + c["SHF"]
            print(f"{body:6} lop3={lop3!s:5}: {alu:4d} LOP3+SHF ({c['LOP3']} LOP3, {c['SHF']} SHF), "
                  f"{c['HMMA']} HMMA, {c['IMMA']} IMMA")


if __name__ == "__main__":
    main()
