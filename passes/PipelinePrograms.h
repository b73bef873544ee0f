// The rank programs of a pipeline plan and the communication of any plan's programs, which
// ir/StreamCheck.h checks. The schedule pass calls these.
#pragma once
#include "ir/CommStreams.h"
#include "ir/Module.h"

#include <functional>
#include <string>
#include <vector>

namespace epl::passes {

// One program per rank (Mesh::rank(replica, stage, device of the stage's group)) for a plan
// with several stages that Mesh::pipelineRefusal() accepts, ordered by the policy's
// schedule; each stage's gradient buckets are summed over its ranks in every replica.
// A cost-only plan (Module::costOnly) gets each stage's first rank of replica 0 alone.
// `made`, where set, sees each program once it is made, in rank order; when it returns
// true, the programs after that one are not made. `want`, where set, says which pipeline
// positions' programs to make.
std::vector<ir::Program> pipelinePrograms(const ir::Module& m,
                                          const std::function<bool(ir::Program&)>& made = {},
                                          const std::function<bool(int)>& want = {});

// A cost-only plan's programs (one a pipeline position) as far as what the memory plan
// reads of the others (Module::zeroApplies): their stage, data ranks and parameters.
std::vector<ir::Program> costOnlyOutlines(const ir::Module& m);

// Sizes p's receive buffers (Program::recvBytes) for its step's ring (Program::recvRing) and
// its evaluation's receives.
void placeReceives(const ir::Module& m, ir::Program& p);

// The gradient reductions of the stage at `position` (0 without a pipeline) in a step
// program without them: each bucket started after the op that readies it in the last
// micro-batch, all waited for before the first optimizer op; with ZeRO stage 2
// (Module::zeroShardsGradients) started in every micro-batch, each waited for once the
// next has started and the last at once.
void addGradientReductions(const ir::Module& m, int position, std::vector<ir::Instr>& step);

// ZeRO stage 3 (Module::zeroShardsParams): the parameter gathers of a step or evaluation
// program without them, for each micro-batch's forward and backward, each bucket's started
// one block ahead of its first reader and waited for just before it. A step's backward
// keeps the forward's block of the bucket it reads first where the two directions' uses
// run back to back (Program::keepsGather, which `keep` receives; null for an evaluation).
void addParamGathers(const ir::Module& m, const ir::Program& p, std::vector<ir::Instr>& list,
                     std::vector<char>* keep = nullptr);

// The communicating instructions of every rank's step (or evaluation) program, in
// Comm.h's terms: each Recv posted where Module::receivePlan says (the program's start, or
// right after the wait of the receive before it in its buffer) and waited at the
// instruction, each Send started at its instruction and waited before its slot's next
// micro-batch (a step) or at once (an evaluation), the gradient-norm all-reduce and the
// loss broadcast of a pipeline.
// oneReplica: the streams of replica 0's ranks alone (Mesh::replicaRanks(0); the others'
// are empty), each group cut down to its members there. That checks a pipeline whose
// replicas run replica 0's programs on their own ranks (pipelinePrograms) as well as every
// rank's streams do: the replicas meet only in collectives, which each enters at the same
// point of the same stream, so a collective completes in the whole job exactly when it
// does among replica 0's members. Not for ZeRO-3's gathers, whose broadcasts have their
// roots in every replica.
ir::CommStreams programStreams(const ir::Module& m, bool eval, bool oneReplica = false);

} // namespace epl::passes
