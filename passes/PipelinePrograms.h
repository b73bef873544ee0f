// The rank programs of a pipeline plan (one rank per stage) and the communication of any
// plan's programs, which ir/StreamCheck.h checks. The schedule pass calls these.
#pragma once
#include "ir/CommStreams.h"
#include "ir/Module.h"

#include <string>
#include <vector>

namespace epl::passes {

// One program per rank (rank = replica x stages + stage) for a plan with several stages
// that Mesh::pipelineRefusal() accepts, ordered by the policy's schedule; with several
// replicas, each stage's gradient buckets are reduced over its replicas.
std::vector<ir::Program> pipelinePrograms(const ir::Module& m);

// The communicating instructions of every rank's step (or evaluation) program, in
// Comm.h's terms: each Recv posted at the program's start and waited at the instruction,
// each Send started and waited at once, the gradient-norm all-reduce and the loss
// broadcast of a pipeline.
ir::CommStreams programStreams(const ir::Module& m, bool eval);

} // namespace epl::passes
