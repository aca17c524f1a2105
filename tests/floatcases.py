"""The float bodies the emulator's float tests run (tests/test_ptxemu_float.py): each a
one-entry module around the usual prologue, whose result is left in %r10.

Here rather than in that test module, so tests/test_ptxemu_forms.py can count the forms
on the bodies' own lines as unit-tested without importing a test module."""
from __future__ import annotations

from emucases import THREAD_ID, element_address

HEADER = ".version 8.0\n.target sm_80\n.address_size 64\n"
REGS = ("  .reg .pred %p<8>;\n  .reg .b16 %h<8>;\n  .reg .b32 %r<32>;\n"
        "  .reg .f32 %f<32>;\n  .reg .b64 %rd<16>;\n  .reg .u32 %u<4>;\n"
        "  .shared .align 16 .b8 sh[256];\n")
# thread gid = %r4; %f1, %f2 = a[gid], b[gid] as f32 (%r5, %r6 the same bits);
# %rd2/%rd3/%rd4 = &a[gid], &b[gid], &out[gid]; the body leaves its u32 result in %r10
PROLOGUE = (THREAD_ID + "  mul.wide.u32 %rd1, %r4, 4;\n"
            + "".join(element_address(param, reg, "%rd1", reg)
                      for param, reg in (("a", "%rd2"), ("b", "%rd3"), ("out", "%rd4")))
            + "  ld.global.f32 %f1, [%rd2];\n  ld.global.f32 %f2, [%rd3];\n"
            "  ld.global.b32 %r5, [%rd2];\n  ld.global.b32 %r6, [%rd3];\n")
TAIL = "  st.global.b32 [%rd4], %r10;\n"


def entry(name: str, body: str) -> str:
    return (f".visible .entry {name}(\n  .param .u64 out,\n  .param .u64 a,\n  .param .u64 b\n)"
            f"\n{{\n{REGS}{PROLOGUE}{body}\n{TAIL}  ret;\n}}\n")


def f32_result(op: str) -> str:
    """A body computing ``op %f10, ...`` and returning its bits."""
    return f"  {op};\n  mov.b32 %r10, %f10;"


def pred_result(op: str) -> str:
    return f"  {op};\n  selp.u32 %r10, 1, 0, %p1;"


# Every accepted form under test; the tests run them, and ptxas assembles them all.
BODIES = {
    **{f"{op}{rn.replace('.', '_')}": f32_result(f"{op}{rn}.f32 %f10, %f1, %f2")
       for op in ("add", "sub", "mul") for rn in ("", ".rn")},
    "div": f32_result("div.rn.f32 %f10, %f1, %f2"),
    "rcp": f32_result("rcp.rn.f32 %f10, %f1"),
    "abs": f32_result("abs.f32 %f10, %f1"),
    "neg": f32_result("neg.f32 %f10, %f1"),
    **{f"{op}{nan.replace('.', '_')}": f32_result(f"{op}{nan}.f32 %f10, %f1, %f2")
       for op in ("min", "max") for nan in ("", ".NaN")},
    **{f"setp_{c}": pred_result(f"setp.{c}.f32 %p1, %f1, %f2")
       for c in ("eq", "ne", "lt", "le", "gt", "ge", "equ", "neu", "ltu", "leu", "gtu", "geu",
                 "num", "nan")},
    "setp_and": "  setp.gt.f32 %p2, %f2, 0f00000000;\n"
                "  setp.lt.and.f32 %p1|%p3, %f1, 0f3F800000, %p2;\n"
                "  selp.u32 %r10, 1, 0, %p1;\n  selp.u32 %r11, 2, 0, %p3;\n"
                "  or.b32 %r10, %r10, %r11;",
    "selp": "  setp.gt.f32 %p1, %f1, %f2;\n" + f32_result("selp.f32 %f10, %f1, 0fBF800000, %p1"),
    "selp_regs": "  setp.lt.f32 %p1, %f1, %f2;\n" + f32_result("selp.f32 %f10, %f1, %f2, %p1"),
    "selp_imms": "  setp.gt.f32 %p1, %f1, %f2;\n" + f32_result("selp.f32 %f10, 0f5F800000, 0f3F800000, %p1"),
    "mov_hex": f32_result("mov.f32 %f10, 0f3FC00000"),
    "mov_decimal": f32_result("mov.f32 %f10, 0.1"),
    "mov_double": f32_result("mov.f32 %f10, 0d3FF8000000000000"),
    "bitcast": "  mov.b32 %f10, %r5;\n  add.f32 %f10, %f10, 0f00000000;\n  mov.b32 %r10, %f10;",
    **{f"testp_{t}": pred_result(f"testp.{t}.f32 %p1, %f1")
       for t in ("finite", "infinite", "number", "notanumber", "normal", "subnormal")},
    "to_bf16": "  cvt.rn.bf16.f32 %h1, %f1;\n  cvt.u32.u16 %r10, %h1;",
    "to_f16": "  cvt.rn.f16.f32 %h1, %f1;\n  cvt.u32.u16 %r10, %h1;",
    "from_bf16": "  ld.global.b16 %h1, [%rd2];\n" + f32_result("cvt.f32.bf16 %f10, %h1"),
    "from_f16": "  ld.global.u16 %h1, [%rd2];\n" + f32_result("cvt.f32.f16 %f10, %h1"),
    "from_s32": f32_result("cvt.rn.f32.s32 %f10, %r5"),
    "from_u32": f32_result("cvt.rn.f32.u32 %f10, %r5"),
    **{f"to_s32_{r}": f"  cvt.{r}.s32.f32 %r10, %f1;" for r in ("rni", "rzi", "rmi", "rpi")},
    "to_s8": "  cvt.rni.s8.f32 %r10, %f1;",
    "to_s8_sat": "  cvt.rni.sat.s8.f32 %r10, %f1;",
    "to_s16": "  cvt.rni.s16.f32 %r10, %f1;",
    "to_u8": "  cvt.rni.u8.f32 %r10, %f1;",
    "fences": "  membar.gl;\n  fence.acq_rel.gpu;\n  fence.sc.gpu;\n  membar.cta;\n  mov.b32 %r10, %r5;",
    "ordered": "  st.release.gpu.global.b32 [%rd4], %r6;\n  ld.acquire.gpu.global.b32 %r10, [%rd4];\n"
               "  ld.volatile.global.u32 %r11, [%rd2];\n  add.u32 %r10, %r10, %r11;",
    "exch": "  ld.param.u64 %rd5, [b];\n  cvta.to.global.u64 %rd5, %rd5;\n"
            "  atom.global.exch.b32 %r10, [%rd5], %r4;",
    "ticket": "  ld.param.u64 %rd5, [b];\n  cvta.to.global.u64 %rd5, %rd5;\n"
              "  atom.global.add.u32 %r10, [%rd5], 1;",
    "guarded": "  mov.b16 %h2, 0x7FC0;\n  mov.b16 %h1, 0;\n  mov.f32 %f10, 0fBF800000;\n"
               "  setp.ne.u32 %p1, %r5, 0;\n"
               "  @%p1 ld.global.f32 %f10, [%rd2];\n  @%p1 st.global.f32 [%rd3], %f10;\n"
               "  @%p1 ld.global.b16 %h1, [%rd2];\n  @!%p1 st.global.b16 [%rd3], %h2;\n"
               "  ld.global.f32 %f11, [%rd3];\n  mov.b32 %r10, %f11;\n"
               "  mov.b32 %r11, %f10;\n  cvt.u32.u16 %r12, %h1;\n  xor.b32 %r11, %r11, %r12;\n"
               "  st.global.b32 [%rd2], %r11;",
    # %r21 = &sh[4 tid]: each thread's own shared word
    "shared_f32": "  mov.u32 %r20, sh;\n  shl.b32 %r21, %r1, 2;\n  add.u32 %r21, %r20, %r21;\n"
                  "  st.shared.f32 [%r21], %f1;\n  setp.lt.u32 %p1, %r1, 32;\n"
                  "  mov.f32 %f3, 0fBF800000;\n  @%p1 ld.shared.f32 %f3, [%r21];\n"
                  "  mul.rn.f32 %f5, %f3, 0f40000000;\n  @%p1 st.shared.f32 [%r21], %f5;\n"
                  "  ld.shared.f32 %f4, [%r21];\n  mov.b32 %r10, %f4;",
    "shared_ints": "  mov.u32 %r20, sh;\n  shl.b32 %r21, %r1, 2;\n  add.u32 %r21, %r20, %r21;\n"
                   "  st.shared.u32 [%r21], %r5;\n  setp.lt.u32 %p1, %r1, 32;\n  not.pred %p2, %p1;\n"
                   "  selp.b32 %r11, 7, %r6, %p2;\n  st.shared.u8 [%r21+1], %r11;\n"
                   "  ld.shared.u32 %r10, [%r21];",
    "global_narrow": "  setp.lt.u32 %p1, %r1, 16;\n  @%p1 st.global.u8 [%rd3], %r5;\n"
                     "  ld.global.u32 %r10, [%rd3];\n  st.global.u32 [%rd3], %r5;",
    "compare_imm": "  setp.eq.f32 %p1, %f1, 0f00000000;\n  selp.f32 %f3, 0f3F800000, %f1, %p1;\n"
                   "  div.rn.f32 %f4, %f3, 0f42FE0000;\n  setp.lt.f32 %p2, %f4, 0fBF000000;\n"
                   "  selp.f32 %f5, 0f40000000, %f4, %p2;\n  mov.b32 %r10, %f5;",
    "shfl_down_plain": "  shfl.sync.down.b32 %f10, %f1, 16, 31, 0xffffffff;\n  mov.b32 %r10, %f10;",
    # split-K arrival: thread 0 of each CTA takes a ticket, the CTA learns it through shared
    # memory; the last CTA resets the counter and reads a (the others return the ticket).
    # The fences release what each CTA read of b before its ticket and acquire it after.
    "arrival": "  ld.param.u64 %rd5, [b];\n  cvta.to.global.u64 %rd5, %rd5;\n  mov.u32 %r20, sh;\n"
               "  fence.acq_rel.gpu;\n"
               "  setp.eq.u32 %p1, %r1, 0;\n  @%p1 atom.global.add.u32 %r12, [%rd5], 1;\n"
               "  @%p1 st.shared.b32 [%r20], %r12;\n  bar.sync 0;\n  fence.acq_rel.gpu;\n"
               "  ld.shared.b32 %r12, [%r20];\n"
               "  mov.u32 %r13, %nctaid.x;\n  sub.u32 %r13, %r13, 1;\n  setp.eq.u32 %p2, %r12, %r13;\n"
               "  and.pred %p3, %p1, %p2;\n  mov.u32 %r14, 0;\n  @%p3 st.global.b32 [%rd5], %r14;\n"
               "  mov.u32 %r10, %r12;\n  @%p2 ld.global.cg.b32 %r10, [%rd2];",
    "guarded_vector": "  ld.param.u64 %rd5, [b];\n  cvta.to.global.u64 %rd5, %rd5;\n"
                      "  mul.wide.u32 %rd6, %r4, 16;\n  add.s64 %rd6, %rd5, %rd6;\n"
                      "  mov.f32 %f3, 0f00000000;\n  mov.f32 %f6, 0f00000000;\n"
                      "  setp.lt.u32 %p1, %r1, 32;\n"
                      "  @%p1 ld.global.v4.f32 {%f3, %f4, %f5, %f6}, [%rd6];\n"
                      "  add.f32 %f10, %f3, %f6;\n  mov.b32 %r10, %f10;\n"
                      "  @%p1 st.global.u32 [%rd2], %r10;",
    "halves_vector": "  ld.param.u64 %rd5, [b];\n  cvta.to.global.u64 %rd5, %rd5;\n"
                     "  mul.wide.u32 %rd6, %r4, 16;\n  add.s64 %rd6, %rd5, %rd6;\n"
                     "  mov.b32 %r12, 0;\n  mov.b32 %r15, 0;\n  setp.lt.u32 %p1, %r1, 32;\n"
                     "  @%p1 ld.global.v4.b32 {%r12, %r13, %r14, %r15}, [%rd6];\n"
                     "  mov.b32 {%h1, %h2}, %r12;\n  cvt.u32.u16 %r16, %h2;\n"
                     "  cvt.u32.u16 %r17, %h1;\n  mov.b32 %r10, %r15;\n"
                     "  @%p1 st.global.v2.b32 [%rd6], {%r16, %r17};",
    "vector_f32": "  ld.param.u64 %rd5, [b];\n  cvta.to.global.u64 %rd5, %rd5;\n"
                  "  mul.wide.u32 %rd6, %r4, 16;\n  add.s64 %rd6, %rd5, %rd6;\n"
                  "  mul.wide.u32 %rd7, %r4, 8;\n  add.s64 %rd5, %rd5, %rd7;\n"
                  "  ld.global.v2.f32 {%f3, %f4}, [%rd5];\n"
                  "  ld.global.v4.f32 {%f5, %f6, %f7, %f8}, [%rd6+512];\n"
                  "  add.f32 %f10, %f3, %f4;\n  add.f32 %f10, %f10, %f5;\n"
                  "  add.f32 %f10, %f10, %f8;\n  st.global.v2.f32 [%rd5], {%f10, %f6};\n"
                  "  mov.b32 %r10, %f10;",
    "shfl_bfly_sum": "".join(f"  shfl.sync.bfly.b32 %f3, %f1, {k}, 31, 0xffffffff;\n"
                             "  add.f32 %f1, %f1, %f3;\n" for k in (16, 8, 4, 2, 1))
                     + "  mov.b32 %r10, %f1;",
    "shfl_down": "  shfl.sync.down.b32 %r10|%p1, %r5, 3, 31, 0xffffffff;\n"
                 "  selp.u32 %r11, 0x80000000, 0, %p1;\n  or.b32 %r10, %r10, %r11;",
    "shfl_up": "  shfl.sync.up.b32 %r10|%p1, %r5, 2, 0, 0xffffffff;\n"
               "  selp.u32 %r11, 0x80000000, 0, %p1;\n  or.b32 %r10, %r10, %r11;",
    "shfl_idx": "  shfl.sync.idx.b32 %r10, %r5, 5, 31, 0xffffffff;",
    "shfl_idx_width8": "  shfl.sync.idx.b32 %r10, %r5, 3, 0x181f, 0xffffffff;",
    "shfl_bfly_width8": "  shfl.sync.bfly.b32 %r10, %r5, 4, 0x181f, 0xffffffff;",
    "shfl_half_warps": "  and.b32 %r11, %r1, 16;\n  setp.eq.u32 %p1, %r11, 0;\n"
                       "  selp.b32 %r12, 0x0000ffff, 0xffff0000, %p1;\n"
                       "  shfl.sync.bfly.b32 %r10, %r5, 1, 31, %r12;",
}


def body_source(name: str) -> tuple[str, range]:
    """Body ``name`` as a one-entry module and the line numbers of the body itself (what
    tests/test_ptxemu_forms.py counts as the forms tests/test_ptxemu_float.py tests)."""
    text = HEADER + entry(f"k_{name}", BODIES[name])
    first = text.index(BODIES[name])
    start = text[:first].count("\n") + 1
    return text, range(start, start + BODIES[name].count("\n") + 1)


def module(*names: str) -> str:
    return HEADER + "".join(entry(f"k_{n}", BODIES[n]) for n in names)
