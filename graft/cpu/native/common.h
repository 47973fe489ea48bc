// The instruction set this build is for, named once from the compiler's macros (graft/cpu/native/build.py
// builds one variant per instruction set with explicit -m flags), and the vector width the kernels are written in.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>
#define GRAFT_AVX512 1
#if defined(__AVX512BF16__)
#define GRAFT_BF16_DOT 1  // bfloat16 panels multiplied by vdpbf16ps (bfloat16_panel_products: "dot")
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define GRAFT_AMX 1  // and by AMX tiles (tdpbf16ps) where the kernel grants the tile state
#endif
#endif
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define GRAFT_AVX2 1  // the AVX-512F kernels in 8-float vectors, for CPUs without AVX-512F
#endif

#if defined(GRAFT_AVX512) || defined(GRAFT_AVX2)
#define GRAFT_VECTORS 1  // the panel kernel and the vector attention are built
#endif

namespace graft {

#if defined(GRAFT_AVX512)
constexpr int kLanes = 16;  // floats per vector
#elif defined(GRAFT_AVX2)
constexpr int kLanes = 8;
#endif

}  // namespace graft
