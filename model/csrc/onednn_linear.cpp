// Prepacked oneDNN linears for decode steps on CPU. libtorch registers these operators
// (`mkldnn::_reorder_linear_weight`, `mkldnn::_linear_pointwise`, the ones torch.compile's CPU
// backend uses) but tch does not bind them, so this shim calls them through the dispatcher.
// Tensors cross as `at::Tensor*`, the same handles tch uses; errors come back as a malloc'd
// string that the caller frees.
#include <ATen/ATen.h>
#include "shim_error.h"
#include <ATen/core/dispatch/Dispatcher.h>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>

namespace {

c10::OperatorHandle op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

}  // namespace

extern "C" {

// The weight [out, in] reordered into oneDNN's blocked layout for its inner-product kernels.
at::Tensor* comas_onednn_pack(at::Tensor* weight, char** error) {
  try {
    static const auto reorder = op("mkldnn::_reorder_linear_weight").typed<at::Tensor(const at::Tensor&, std::optional<int64_t>)>();
    return new at::Tensor(reorder.call(*weight, std::nullopt));
  } catch (const std::exception& e) {
    *error = comas_copy_message(e.what());
    return nullptr;
  }
}

// x [rows, in] times the packed weight, plus `bias` when it is not null.
at::Tensor* comas_onednn_linear(at::Tensor* x, at::Tensor* packed, at::Tensor* bias, char** error) {
  try {
    static const auto linear = op("mkldnn::_linear_pointwise")
                                   .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, std::string_view,
                                                     c10::List<std::optional<at::Scalar>>, std::optional<std::string_view>)>();
    std::optional<at::Tensor> b;
    if (bias != nullptr) {
      b = *bias;
    }
    return new at::Tensor(linear.call(*x, *packed, b, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt));
  } catch (const std::exception& e) {
    *error = comas_copy_message(e.what());
    return nullptr;
  }
}

}  // extern "C"
