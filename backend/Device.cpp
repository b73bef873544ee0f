// Sizes of device tensor views; the devices themselves live in cpu/ and cuda/.
#include "backend/Device.h"

namespace epl::backend {

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

int64_t TensorView::bytes() const {
  return numel() * ir::dtypeBytes(dtype);
}

} // namespace epl::backend
