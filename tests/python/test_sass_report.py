"""scripts/sass_report.py reads cuobjdump's listings: checked on a hand-written listing whose
kernels, resources, store widths and loops are known (no cuobjdump needed), including a 16-byte
store split into four 4-byte ones, the pattern the tool exists to show."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))

import sass_report  # noqa: E402

SASS = """
	code for sm_90
		Function : _Z4copyPv
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                   /* 0x00000a00ff017b82 */
        /*0010*/                   LDS.128 R4, [R5] ;                       /* 0x0000000005047984 */
        /*0020*/                   STG.E desc[UR24][R12.64], R4 ;           /* 0x0000000418007986 */
        /*0030*/                   STG.E desc[UR24][R12.64+0x4], R5 ;       /* 0x0000040518007986 */
        /*0040*/                   STG.E desc[UR24][R12.64+0x8], R6 ;       /* 0x0000080618007986 */
        /*0050*/                   STG.E desc[UR24][R12.64+0xc], R7 ;       /* 0x00000c0718007986 */
        /*0060*/               @!P1 BRA 0x10 ;                               /* 0xfffffff800789947 */
        /*0070*/                   EXIT ;                                   /* 0x000000000000794d */
		..........
		Function : _Z4fastPv
        /*0000*/                   LDS.128 R4, [R5] ;                       /* 0x0000000005047984 */
        /*0010*/                   STG.E.128 desc[UR24][R12.64], R4 ;       /* 0x0000000418007986 */
        /*0020*/                   STL [R1], R4 ;                           /* 0x0000000418007986 */
        /*0030*/                   LDL R4, [R1] ;                           /* 0x0000000418007986 */
        /*0040*/                   STG.E.64.STRONG.SYS desc[UR24][R2.64], R8 ;  /* 0x0 */
        /*0050*/                   STG.E.U16 desc[UR24][R2.64], R8 ;        /* 0x0 */
        /*0060*/                   BRA 0x60 ;                               /* 0x0 */
		..........
"""

RES = """
Resource usage:
 Function _Z4copyPv:
  REG:24 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:368 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z4fastPv:
  REG:64 STACK:8 SHARED:0 LOCAL:0 CONSTANT[0]:368 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_kernels_and_their_instructions_are_read():
    k = sass_report.parse_sass(SASS)
    assert list(k) == ["_Z4copyPv", "_Z4fastPv"]
    assert len(k["_Z4copyPv"]) == 8
    assert k["_Z4copyPv"][2] == (0x20, "STG.E desc[UR24][R12.64], R4")
    assert len(k["_Z4fastPv"]) == 7


def test_resources_are_read_per_kernel():
    assert sass_report.parse_resources(RES) == {"_Z4copyPv": (24, 0), "_Z4fastPv": (64, 8)}


def test_a_split_store_shows_as_four_narrow_ones_and_widths_are_told_apart():
    k = sass_report.parse_sass(SASS)
    assert sass_report.store_widths(k["_Z4copyPv"]) == {"STG.32": 4}
    assert sass_report.store_widths(k["_Z4fastPv"]) == {"STG.128": 1, "STG.sys": 1, "STG.16": 1}


def test_backward_branches_are_loops_and_forward_ones_are_not():
    k = sass_report.parse_sass(SASS)
    assert sass_report.loops(k["_Z4copyPv"]) == [(1, 6)]  # 0x10 .. the branch at 0x60
    assert sass_report.loops(k["_Z4fastPv"]) == [(6, 6)]  # a branch to itself


def test_the_summary_counts_local_memory_and_opcodes_without_predicates():
    k = sass_report.parse_sass(SASS)
    s = sass_report.summary(k["_Z4fastPv"], (64, 8))
    assert s["registers"] == 64 and s["stack"] == 8
    assert s["local"] == 2
    assert s["instructions"] == 7
    assert sass_report.opcode("@!P1 BRA 0x10") == "BRA"
    assert sass_report.opcode("@UP0 STG.E.128 desc[UR4][R2.64], R4") == "STG"
