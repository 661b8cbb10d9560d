// One AdamW update over a list of f32 parameters with the arithmetic of learner/src/optim.rs
// (rl.md §8), through ATen's foreach operations: on a GPU a few multi-tensor launches instead of
// about ten kernels per parameter. On the CPU the foreach operations run the same per-tensor
// operations in the same order, so the updated bits do not change.
#include <ATen/ATen.h>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

char* copy_error(const char* what) {
  size_t n = std::strlen(what);
  char* out = static_cast<char*>(std::malloc(n + 1));
  if (out != nullptr) std::memcpy(out, what, n + 1);
  return out;
}

std::vector<at::Tensor> list(at::Tensor** ts, int64_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (int64_t i = 0; i < n; ++i) out.push_back(*ts[i]);
  return out;
}

}  // namespace

extern "C" {

// weights, grads, m, v: n tensors each, weights/m/v f32 and updated in place; grads of any
// float dtype (converted to f32 first); the caller holds a no-grad guard. decay: the factor
// weights are multiplied by first (1 − lr·weight_decay), skipped when it is 1. Returns false
// with *error set on failure (no tensor is then known to be unchanged: the caller restores its
// snapshot).
bool comas_foreach_adamw(at::Tensor** weights, at::Tensor** grads, at::Tensor** m, at::Tensor** v, int64_t n,
                         double lr, double beta1, double beta2, double bc1, double bc2, double eps, double decay,
                         char** error) {
  try {
    std::vector<at::Tensor> w = list(weights, n), ms = list(m, n), vs = list(v, n), g;
    g.reserve(n);
    for (int64_t i = 0; i < n; ++i) g.push_back(grads[i]->to(at::kFloat));
    if (decay != 1.0) at::_foreach_mul_(w, decay);
    // m ← m·β1 + g·(1 − β1)
    at::_foreach_mul_(ms, beta1);
    at::_foreach_add_(ms, at::_foreach_mul(g, 1.0 - beta1));
    // v ← v·β2 + g²·(1 − β2)
    at::_foreach_mul_(vs, beta2);
    std::vector<at::Tensor> g2 = at::_foreach_mul(g, g);
    at::_foreach_mul_(g2, 1.0 - beta2);
    at::_foreach_add_(vs, g2);
    // w ← w − lr · (m / bc1) / (sqrt(v / bc2) + eps)
    std::vector<at::Tensor> denom = at::_foreach_div(vs, bc2);
    at::_foreach_sqrt_(denom);
    at::_foreach_add_(denom, eps);
    std::vector<at::Tensor> update = at::_foreach_div(ms, bc1);
    at::_foreach_div_(update, denom);
    at::_foreach_mul_(update, lr);
    at::_foreach_sub_(w, update);
    return true;
  } catch (const std::exception& e) {
    *error = copy_error(e.what());
    return false;
  }
}

}  // extern "C"
