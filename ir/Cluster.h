// A cluster EPL plans for without having it: its devices (peak FLOP/s by type, memory and
// its bandwidth) and the links between them, inside a node and between nodes. Built-in
// ones (`dgx-a100`, `dgx-h100`, `dgx-h200`) or a JSON file; docs/cluster.md gives the fields and
// where the built-in figures come from.
#pragma once
#include "ir/Ops.h"
#include "ir/Types.h"

#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace epl::ir {

struct Link {
  double bandwidth = 0; // bytes/s each way, per device: a ring's bus bandwidth
  double latency = 0;   // seconds per message hop
  // One device sending to another (a pipeline's transfers), where that differs from the
  // ring's figures (`epl calibrate` measures both); 0: as the ring's.
  double sendBandwidth = 0, sendLatency = 0;
  double sendSeconds(double bytes) const {
    return bytes / (sendBandwidth > 0 ? sendBandwidth : bandwidth) +
           (sendLatency > 0 ? sendLatency : latency);
  }
};

struct ClusterDevice {
  std::string name;
  double memoryBytes = 0;
  double memoryBandwidth = 0; // bytes/s
  // Peak dense FLOP/s of matrix products by element type (f32, bf16, fp16).
  double peakF32 = 0, peakBf16 = 0, peakF16 = 0;
  // The share of the peak large matrix products reach, and of the memory bandwidth
  // elementwise work reaches.
  double matmulEfficiency = 0.75, memoryEfficiency = 0.8;
  // The peak of products in `compute`; f32 products under `matmul = tf32` at the TF32
  // tensor-core peak where the device has one (peakTf32 > 0).
  double peak(DType compute, bool tf32 = false) const {
    if (compute == DType::F32 && tf32 && peakTf32 > 0) return peakTf32;
    return compute == DType::BF16 ? peakBf16 : compute == DType::F16 ? peakF16 : peakF32;
  }
  // GEMM FLOP/s measured by shape at one rank's threads (`epl calibrate`): for each layout
  // of the operands, a grid of m, n and k values and the rate at each point. A layout
  // without a grid takes A B^T's; none at all: every product at peak x matmulEfficiency.
  // bf16 products (amp, on a CPU that multiplies bf16 as it is) have grids of their own;
  // without them they take the f32 grids, as a CPU that widens bf16 runs them.
  struct ShapeRate {
    double m = 0, n = 0, k = 0, rate = 0;
    GemmLayout layout = GemmLayout::ABt;
    DType type = DType::F32;
  };
  struct GemmGrid {
    std::vector<double> m, n, k; // each axis's values, ascending
    std::map<std::array<double, 3>, double> rate;
    bool empty() const { return rate.empty(); }
    // The rate at (m, n, k): trilinear in the logarithms, clamped at the grid's edges, a
    // corner the grid lacks giving the others its weight; 0 where it has none.
    double at(double m, double n, double k) const;
    // A grid of these rows' points, each axis's values sorted (a point measured twice keeps
    // its last rate).
    void add(double m, double n, double k, double r);
    void sortAxes();
  };
  std::array<GemmGrid, 3> gemmGrids, bf16Grids; // by GemmLayout
  // Whether a calibrated CPU's products read `t` as it is stored: bf16 where the
  // calibration has its grid.
  bool readsHalf(DType t) const {
    return t == DType::BF16 && !bf16Grids[static_cast<size_t>(GemmLayout::ABt)].empty();
  }
  void setGemmRates(const std::vector<ShapeRate>& rows);
  // conv2d's FLOP/s measured by shape through a calibrated CPU's own kernel where it runs
  // oneDNN's direct convolution (`epl calibrate`'s `conv_by_shape`): the time of the whole
  // call (its reorders, its tensors read and written) over the FLOPs the model counts. By
  // pass: the forward, the backward that gives the input's gradient and the weights', the
  // backward that gives the weights' alone; each a grid over (Co, Ho Wo, C K K). Empty: the
  // convolution is costed as its im2col products and bytes.
  enum class ConvPass { Forward, Backward, Weights };
  struct ConvRate {
    double c = 0, co = 0, side = 0, k = 0; // x [B, c, side, side], w [co, c, k, k], stride 1
    double forward = 0, backward = 0, weights = 0;
  };
  std::array<GemmGrid, 3> convGrids{}; // by ConvPass
  void setConvRates(const std::vector<ConvRate>& rows);
  // The rate of a conv2d of co output channels, an output plane of `plane` values and
  // C K K = ckk; 0 without a grid.
  double convRate(ConvPass pass, double co, double plane, double ckk) const;
  // How attention's kernel treats each head's T x T scores. Scores: they go through the
  // device's memory, written and read back in the compute type (EPL's CUDA kernel, and the
  // unfused attention of Megatron-LM's 2021 runs): 4 passes over them a forward, 10 a
  // backward. Tiles: they stay in cache, recomputed tile by tile (EPL's CPU kernel, flash
  // attention): no traffic beyond the op's inputs and outputs.
  enum class Attention { Scores, Tiles };
  Attention attention = Attention::Scores;
  // Whether attention's per-head products (Product::perHead) are multiplied in f32 under
  // amp too: on a calibrated machine (EPL's CPU kernel multiplies its tiles with sgemm) and
  // in a GPU run's comparison (EPL's CUDA kernels take f32 operands); not on the built-in
  // clusters, whose runs (Megatron-LM's) multiply them in the half type.
  bool headProductsF32 = false;
  // With Tiles: heads wider than this go through memory as Scores (EPL's CUDA kernel tiles
  // heads up to 128 wide); 0: every width tiles.
  int64_t tilesUpTo = 0;
  // A calibrated machine's last-level cache as one rank sees it: its share of the bytes, and
  // the bandwidth elementwise work reaches inside it. A rank whose whole memory plan fits
  // moves its bytes at that rate, or where there is a curve (below) at the curve's rate for
  // the plan's bytes. 0: no cache modelled (every byte at memoryBandwidth).
  double cacheBytes = 0, cacheBandwidth = 0;
  // A calibrated machine's memory rate by working set, as one rank sees it while the others
  // run: [bytes, bytes/s] ascending, y = a + b over arrays that together take that many
  // bytes, interpolated in logarithms between points and clamped at the ends. The
  // optimizer's update, a kernel that only streams, moves its bytes at its working set's
  // rate. (The ops' kernels also compute: GELU's tanh, softmax's exp, im2col's indices. Their
  // bytes keep the rule above, standing for both; docs/cluster.md has the figures.) Empty:
  // memoryBandwidth.
  std::vector<std::pair<double, double>> bandwidthBySize{};
  double bandwidthFor(double bytes) const;
  // The rate of one product: interpolated over the grid in the logarithms of m, n and k
  // (clamped at its edges), or the peak's share.
  double matmulRate(const Product& p, DType compute, bool tf32 = false) const;
  // Dense FLOP/s of f32 products on tensor cores with TF32 operands (`matmul = tf32`); 0:
  // the device has none, and they run at peakF32.
  double peakTf32 = 0;
};

// The rate of a [bytes, rate] curve (ascending in bytes) at `bytes`: interpolated in
// logarithms, clamped at its ends.
double curveAt(const std::vector<std::pair<double, double>>& curve, double bytes);

// What `epl calibrate` measured of this machine (the `here` cluster): its cores, and
// by threads a rank, the GEMM FLOP/s and the memory bandwidth one rank reaches.
struct Calibration {
  int cores = 0;
  std::map<int, double> gemmFlops, memoryBandwidth; // threads -> FLOP/s, bytes/s
  // ranks -> the GEMM FLOP/s of that many ranks side by side, each of cores / ranks threads,
  // summed (as gemmFlops' products); empty in files of earlier versions
  std::map<int, double> gemmSideBySide;
  // The last-level cache, shared by every core, as `epl calibrate` measured it; 0: unknown
  double cacheBytes = 0;
  std::map<int, double> cacheBandwidth; // threads -> bytes/s of y = a + b inside it
  // threads -> [working-set bytes, bytes/s of y = a + b over them], ascending
  std::map<int, std::vector<std::pair<double, double>>> bandwidthBySize;
  std::map<int, std::vector<ClusterDevice::ShapeRate>> gemmByShape; // threads -> the grid
  // threads -> conv2d's rates by shape (ClusterDevice::convGrids); empty in files of earlier
  // versions and where the CPU's convolution is im2col's
  std::map<int, std::vector<ClusterDevice::ConvRate>> convByShape;
};

struct Cluster {
  std::string name;
  int devicesPerNode = 1;
  int nodes = 0;        // 0: as many as the plan needs
  ClusterDevice device; // every device's; a mixed cluster's first group's
  // A mixed cluster (`device_groups`, as Whale's 8 V100 + 8 A100): `count` devices of each
  // kind, ranks filling the groups in order. Empty: every device is `device`, as many as a
  // plan needs.
  struct DeviceGroup {
    int count = 0;
    ClusterDevice device;
  };
  std::vector<DeviceGroup> groups;
  int deviceCount() const; // 0: as many as a plan needs
  // The group of rank r (0 without groups), a group's device, and rank r's.
  int groupOf(int rank) const;
  const ClusterDevice& groupDevice(int group) const {
    return groups.empty() ? device : groups.at(static_cast<size_t>(group)).device;
  }
  const ClusterDevice& deviceOf(int rank) const { return groupDevice(groupOf(rank)); }
  // "A100-SXM4-80GB", or "8 x V100-SXM2-32GB + 8 x A100-SXM4-80GB".
  std::string devicesName() const;
  // Why a plan of np ranks does not fit on the cluster's devices, or "".
  std::string tooFew(int np) const;
  Link intraNode, interNode;
  // Between a device and its host's memory (PCIe), each way, per device: what offloaded
  // states cross each step on a device whose memory is not the host's. Bandwidth 0: no such
  // link (a calibrated CPU, whose memory is the host's).
  Link hostLink;
  // A node's disks, bytes/s each way, shared by the node's ranks: what states offloaded to
  // disk are read and written at. 0: not given, and that traffic is not costed.
  double diskBandwidth = 0;
  std::optional<Calibration> calibration;
  // Whether collectives run beside the compute (a network card or NVLink moves the bytes)
  // and so can hide behind the backward. Not on a calibrated machine: its ranks' threads
  // take every core, and over shared memory the copies are CPU work (docs/comm.md).
  bool overlapsCompute = true;
  // More ranks than cores on a calibrated machine: each rank's rates are its share of a core
  // (cores / np); where a pipeline's schedule leaves ranks waiting, the others run at a
  // whole core. 1: a device each.
  double coreShare = 1;
  // The cluster as np ranks of one plan see it: a calibrated machine's ranks share its
  // cores (threads a rank as `epl run` gives them) and its memory bandwidth, each
  // reaching the measured rates in full (efficiencies 1), and no collective hides behind
  // compute. Others are as they are. `threads` > 0: each rank runs that many threads (`epl
  // run --threads`), sharing the cores where np x threads exceeds them.
  Cluster forRanks(int np, int threads = 0) const;
  // The link a group of ranks uses: between nodes when its ranks (consecutive ones, a
  // node's devicesPerNode at a time) span more than one node.
  const Link& linkFor(int firstRank, int lastRank) const {
    return firstRank / devicesPerNode == lastRank / devicesPerNode ? intraNode : interNode;
  }
};

std::vector<std::string> builtinClusterNames();
// The built-in cluster of a GPU's kind, from the name CUDA gives it ("NVIDIA H100 80GB
// HBM3": dgx-h100); nullopt for a GPU none of them has.
std::optional<std::string> builtinClusterForGpu(const std::string& gpu);
// Where `epl calibrate` writes this machine's cluster and `here` reads it:
// $EPL_CLUSTER_HERE, else $XDG_CONFIG_HOME/epl/here.json, else ~/.config/epl/here.json.
std::string hereClusterPath();
// A built-in name, `here`, or a JSON file's path. On a mistake returns nullopt and sets `error`
// (lower case, no trailing period), naming the file and the field.
std::optional<Cluster> loadCluster(const std::string& nameOrPath, std::string& error);
// A cluster from JSON text; `source` names it in errors.
std::optional<Cluster> parseCluster(const std::string& text, const std::string& source,
                                    std::string& error);

} // namespace epl::ir
