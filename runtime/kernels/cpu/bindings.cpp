// The Python module of parc's CPU kernels (loaded by ../build.py, called by ../ops.py).
#include <torch/extension.h>

namespace parc {
std::vector<at::Tensor> layer_norm_fwd(const at::Tensor&, const at::Tensor&, const at::Tensor&, double);
std::vector<at::Tensor> layer_norm_bwd(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                       const at::Tensor&, const at::Tensor&);
std::vector<at::Tensor> rms_norm_fwd(const at::Tensor&, const at::Tensor&, double);
std::vector<at::Tensor> rms_norm_bwd(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                     const at::Tensor&);
std::vector<at::Tensor> add_layer_norm_fwd(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                           const at::Tensor&, double);
std::vector<at::Tensor> add_layer_norm_bwd(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                           const at::Tensor&, const at::Tensor&, const at::Tensor&);
std::vector<at::Tensor> add_rms_norm_fwd(const at::Tensor&, const at::Tensor&, const at::Tensor&, double);
std::vector<at::Tensor> add_rms_norm_bwd(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const at::Tensor&);
at::Tensor bias_gelu_fwd(const at::Tensor&, const at::Tensor&);
std::vector<at::Tensor> bias_gelu_bwd(const at::Tensor&, const at::Tensor&, const at::Tensor&);
at::Tensor swiglu_fwd(const at::Tensor&, const at::Tensor&);
std::vector<at::Tensor> swiglu_bwd(const at::Tensor&, const at::Tensor&, const at::Tensor&);
void rotary_apply(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&, double);
std::vector<at::Tensor> cross_entropy_stats(const at::Tensor&, const at::Tensor&, int64_t, int64_t);
at::Tensor cross_entropy_grad(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, int64_t, int64_t);
std::vector<at::Tensor> block_attention_fwd(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, double);
std::vector<at::Tensor> block_attention_bwd(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                            const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, double);  // grad, q, k, v, out, lse
at::Tensor permute_rows_fwd(const at::Tensor&, const at::Tensor&);
at::Tensor permute_rows_bwd(const at::Tensor&, const at::Tensor&, int64_t);
at::Tensor combine_rows_fwd(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t);
std::vector<at::Tensor> combine_rows_bwd(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&);
at::Tensor grouped_mm_fwd(const at::Tensor&, const at::Tensor&, const at::Tensor&);
std::vector<at::Tensor> grouped_mm_bwd(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&);
}  // namespace parc

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "parc's fused CPU kernels";
  m.def("layer_norm_fwd", &parc::layer_norm_fwd);
  m.def("layer_norm_bwd", &parc::layer_norm_bwd);
  m.def("rms_norm_fwd", &parc::rms_norm_fwd);
  m.def("rms_norm_bwd", &parc::rms_norm_bwd);
  m.def("add_layer_norm_fwd", &parc::add_layer_norm_fwd);
  m.def("add_layer_norm_bwd", &parc::add_layer_norm_bwd);
  m.def("add_rms_norm_fwd", &parc::add_rms_norm_fwd);
  m.def("add_rms_norm_bwd", &parc::add_rms_norm_bwd);
  m.def("bias_gelu_fwd", &parc::bias_gelu_fwd);
  m.def("bias_gelu_bwd", &parc::bias_gelu_bwd);
  m.def("swiglu_fwd", &parc::swiglu_fwd);
  m.def("swiglu_bwd", &parc::swiglu_bwd);
  m.def("rotary_apply", &parc::rotary_apply);
  m.def("cross_entropy_stats", &parc::cross_entropy_stats);
  m.def("cross_entropy_grad", &parc::cross_entropy_grad);
  m.def("block_attention_fwd", &parc::block_attention_fwd);
  m.def("block_attention_bwd", &parc::block_attention_bwd);
  m.def("permute_rows_fwd", &parc::permute_rows_fwd);
  m.def("permute_rows_bwd", &parc::permute_rows_bwd);
  m.def("combine_rows_fwd", &parc::combine_rows_fwd);
  m.def("combine_rows_bwd", &parc::combine_rows_bwd);
  m.def("grouped_mm_fwd", &parc::grouped_mm_fwd);
  m.def("grouped_mm_bwd", &parc::grouped_mm_bwd);
}
