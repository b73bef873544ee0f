// The one-rank communicator.
#include "backend/Comm.h"

namespace epl::backend {

namespace {
class SelfComm : public Comm {
public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allReduceSum(float*, long) override {}
  void barrier() override {}
};
} // namespace

std::unique_ptr<Comm> makeSelfComm() {
  return std::make_unique<SelfComm>();
}

} // namespace epl::backend
