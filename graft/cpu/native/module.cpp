// The Python module, built once per instruction-set variant by graft/cpu/native/build.py. The other files are
// compiled into it as one translation unit: parsing the torch headers they share took most of a build when each
// was compiled apart, and the tests build every variant.
#include <torch/csrc/utils/pybind.h>  // pybind11 with torch's tensor casters (lighter than torch/extension.h)

#include "attention.cpp"
#include "layers.cpp"
#include "native.h"
#include "products.cpp"
#include "rates.cpp"
#include "rows.cpp"

namespace graft {

std::string variant() {
#if defined(GRAFT_AMX)
  return "amx";
#elif defined(GRAFT_BF16_DOT)
  return "avx512bf16";
#elif defined(GRAFT_AVX512)
  return "avx512";
#elif defined(GRAFT_AVX2)
  return "avx2";
#else
  return "generic";
#endif
}

}  // namespace graft

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  using namespace graft;
  m.def("variant", &variant, "the instruction set this build was compiled for (graft/cpu/native: VARIANTS)");
  m.def("lean_layers", &lean_layers, "the lean forward's layer loop (float32)");
  m.def("lean_rows", &lean_rows, "the layer loop over several sequences' rows, each over its own cache slot");
  m.def("head_rows", &head_rows, "an EAGLE head's layer over several sequences' entries, each on its own cache");
  m.def("head_layer", &head_layer, "an EAGLE draft head's decoder layer for a few entries (float32)");
  m.def("panels_supported", &panels_supported, "whether this build has the panel kernel (AVX-512F or AVX2)");
  m.def("bfloat16_panels_supported", &bfloat16_panels_supported, "whether the panels may hold bfloat16 weights");
  m.def("bfloat16_panel_products", &bfloat16_panel_products,
        "how the bfloat16 panels multiply: widened (float32 activations), dot (bfloat16 activations), amx, or none");
  m.def("pack_panels", &pack_panels, "W [N, K] float32 (or bfloat16) in the panel kernel's layout [N / B, K, B]");
  m.def("panel_linear", &panel_linear, "x @ W^T (+ bias) through the panel kernel (float32 x and y)", py::arg("x"),
        py::arg("panels"), py::arg("bias"), py::arg("prefetch") = 0);
  m.def("tile_prefetch_supported", &tile_prefetch_supported,
        "whether the panel tiles take tile prefetch modes (the AVX-512F builds)");
  m.def("use_amx", &use_amx,
        "the bfloat16 panels through AMX tiles where granted (true) or not; returns whether they are");
  m.def("rms_norm_rows", &rms_norm_rows, "RMSNorm of x [n, d] float32 with a float32 weight [d]");
  m.def("swiglu", &swiglu, "SiLU(gate) * up for gate_up [n, 2 * inner] float32 -> [n, inner]");
  m.def("move_rows", &move_rows, "every buffer's positions start + rows[j] moved to start + j (a commit)");
  m.def("row_logsumexp", &row_logsumexp, "each row's logsumexp of x [n, V] float32, as [n, 1]");
  m.def("row_topk", &row_topk, "each row's k largest float32 values, largest first, ties in index order");
  m.def("fma_rate", &fma_rate, "float32 G FMA/s with every torch thread running register-only vector FMAs");
  m.def("dot_rate", &dot_rate, "bfloat16 G multiply-adds/s through vdpbf16ps on every torch thread (0: none)");
}
