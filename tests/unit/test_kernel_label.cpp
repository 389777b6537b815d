// readable_kernel_name (core/kernel_label.hpp): the CUTLASS kernels of kiln's
// FP8 GEMM shown by their configuration in profiles and study reports.
#include <gtest/gtest.h>

#include "core/kernel_label.hpp"

namespace kiln {
namespace {

// A kernel name as the H200 reported it in session 20's resnet50 FP8 profile
// (bench/results/2026-12-05-h200-session20/call1/study_resnet50/profile_b1.json).
const std::string kCutlassFp8 =
      "_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEENS1_10collective13CollectiveMma"
      "INS1_37MainloopSm90TmaGmmaWarpSpecializedFP8ILi18ENS5_IJNS4_1CILi1EEESB_SB_EEENS1_32KernelTmaWarpSpecializedPi"
      "ngpongEEENS5_IJNSA_ILi128EEENSA_ILi64EEESG_EEENS_12float_e4m3_tENS5_IJlSB_lEEESI_SJ_NS4_8TiledMMAINS4_8MMA_Ato"
      "mIJNS4_4SM904GMMA30MMA_64x64x32_F32E4M3E4M3_SS_TNILNSN_7ScaleInE1ELSP_1EEEEEENS4_6LayoutISC_NS5_IJNSA_ILi0EEES"
      "T_ST_EEEEENS5_IJNS4_10UnderscoreESW_SW_EEEEENS4_13SM90_TMA_LOADENS4_14ComposedLayoutINS4_7SwizzleILi2ELi4ELi3E"
      "EENS4_18smem_ptr_flag_bitsILi8EEENSS_INS5_IJNSA_ILi8EEESG_EEENS5_IJSG_SB_EEEEEEEvNS4_8identityESZ_S19_vS1A_EEN"
      "S_8epilogue10collective18CollectiveEpilogueINS1C_22Sm90TmaWarpSpecializedILi2ELi2ELi32ELb0ELb1EEEJSH_NS5_IJSG_"
      "SG_EEEvSJ_SI_SJ_NS1C_6fusion15Sm90TreeVisitorINS1I_11Sm90ComputeIN4kiln4cuda7fp8sm9017LayerEpilogueE4m3ESI_fLN"
      "S_15FloatRoundStyleE2EvEEJNS1I_12Sm90AccFetchENS1I_16Sm90RowBroadcastILi0ESH_ffNS5_IJST_SB_lEEELi4ELb1EEES1U_E"
      "EESZ_S19_NS4_39AutoVectorizingCopyWithAssumedAlignmentILi128EEENS4_14SM90_TMA_STOREES19_S1X_NS4_9Copy_AtomIJNS"
      "4_17SM90_U32x4_STSM_NENS_6half_tEEEEvEEEvvEEEEvNT_6ParamsE";

TEST(KernelLabel, CutlassGemmsShowTheirConfiguration) {
  EXPECT_EQ(readable_kernel_name(kCutlassFp8),
            "cutlass GEMM sm90 [64x64x32 F32E4M3E4M3, 18 stages, ping-pong, LayerEpilogueE4m3]");
}

TEST(KernelLabel, OtherNamesAndUnknownCutlassPassUnchanged) {
  EXPECT_EQ(readable_kernel_name("kiln::cuda::map_kernel"), "kiln::cuda::map_kernel");
  EXPECT_EQ(readable_kernel_name("nvjet_sm90_hsh_64x8_64x16_2x4_h_bz_bias_TNT"), "nvjet_sm90_hsh_64x8_64x16_2x4_h_bz_bias_TNT");
  EXPECT_EQ(readable_kernel_name("_ZN7cutlass13device_kernelIiEEvNT_6ParamsE"), "_ZN7cutlass13device_kernelIiEEvNT_6ParamsE");
  // A truncated name: the epilogue's length prefix runs past the end and is left out.
  EXPECT_EQ(readable_kernel_name("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIKernelTmaWarpSpecializedCooperative"
                                 "N4kiln4cuda7fp8sm9099Layer"),
            "cutlass GEMM sm90 [cooperative]");
  EXPECT_EQ(readable_kernel_name(""), "");
}

}  // namespace
}  // namespace kiln
