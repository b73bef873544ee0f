// Checks `policy` and `train` settings against typed key tables and fills ir::Policy and
// ir::TrainConfig. Each bad key is its own error; keys are independent, so no cascade.
#include "frontend/SettingSchemas.h"

#include "frontend/Elaborator.h"
#include "frontend/Parser.h"
#include "support/Text.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <functional>
#include <map>

namespace epl::frontend {

namespace {
using Apply = std::function<void(const ast::Setting&)>;

std::vector<std::string> keyNames(const std::vector<KeyDoc>& keys) {
  std::vector<std::string> out;
  for (const auto& k : keys)
    out.push_back(k.name);
  return out;
}

} // namespace

namespace {

// Typed readers for setting values. Each reports its own error and returns false.
class SettingReader {
public:
  SettingReader(Diagnostics& d, std::function<Value(const ast::Expr&)> eval,
                const std::map<std::string, Value>& constants)
      : diags_(d), eval_(std::move(eval)), constants_(constants) {}

  // A size in bytes: a literal with a unit, or a `let` bound to one.
  bool size(const ast::Setting& s, int64_t& out) {
    Value v = eval_(*s.value);
    if (v.kind != Value::Kind::Int || !v.isSize || v.i <= 0) {
      error(*s.value, fmt::format("`{}` must be a size such as 80GB", s.key));
      return false;
    }
    out = v.i;
    return true;
  }

  void error(const ast::Expr& e, std::string msg, std::string help = "") {
    auto d = diags_.error(e.loc, std::move(msg));
    d.length(e.length);
    if (!help.empty()) d.help(std::move(help));
  }

  bool integer(const ast::Setting& s, int64_t lo, int64_t hi, int64_t& out) {
    Value v = eval_(*s.value);
    if (v.kind != Value::Kind::Int) {
      bool quoted = v.kind == Value::Kind::String && !v.s.empty() &&
                    v.s.find_first_not_of("0123456789") == std::string::npos;
      error(*s.value, fmt::format("`{}` must be an integer, found {}", s.key, kindName(v.kind)),
            quoted ? fmt::format("write the number without quotes: `{} = {}`", s.key, v.s) : "");
      return false;
    }
    if (v.i < lo || v.i > hi) {
      error(*s.value,
            hi >= INT64_MAX / 2
                ? fmt::format("`{}` must be at least {}, got {}", s.key, lo, v.i)
                : fmt::format("`{}` must be between {} and {}, got {}", s.key, lo, hi, v.i));
      return false;
    }
    out = v.i;
    return true;
  }

  bool number(const ast::Setting& s, double lo, double& out) {
    Value v = eval_(*s.value);
    if (!v.isNumber()) {
      error(*s.value, fmt::format("`{}` must be a number, found {}", s.key, kindName(v.kind)));
      return false;
    }
    if (v.number() < lo) {
      error(*s.value, fmt::format("`{}` must be at least {}, got {}", s.key, lo, v.number()));
      return false;
    }
    out = v.number();
    return true;
  }

  // A word from a fixed set; also accepts `none`, `auto` and quoted strings.
  bool word(const ast::Setting& s, const std::vector<std::string>& allowed, std::string& out) {
    const ast::Expr& e = *s.value;
    std::string w;
    auto constant = e.kind == ast::ExprKind::Name ? constants_.find(e.text) : constants_.end();
    Value::Kind ck = constant != constants_.end() ? constant->second.kind : Value::Kind::Int;
    if (ck == Value::Kind::Word || ck == Value::Kind::String)
      w = constant->second.s; // `let s = 1f1b` then `schedule = s`
    else if (ck == Value::Kind::None || ck == Value::Kind::Auto)
      w = ck == Value::Kind::None ? "none" : "auto";
    else if (e.kind == ast::ExprKind::Name || e.kind == ast::ExprKind::Word ||
             e.kind == ast::ExprKind::String)
      w = e.text;
    else if (e.kind == ast::ExprKind::None)
      w = "none";
    else if (e.kind == ast::ExprKind::Auto)
      w = "auto";
    else if (e.kind == ast::ExprKind::Int)
      w = std::to_string(e.intValue);
    if (std::find(allowed.begin(), allowed.end(), w) == allowed.end()) {
      std::string near = w.empty() ? "" : closestMatch(w, allowed);
      error(e,
            fmt::format("`{}` must be one of `{}`{}", s.key, fmt::join(allowed, "`, `"),
                        w.empty() ? "" : fmt::format(", found `{}`", w)),
            near.empty() ? "" : fmt::format("did you mean `{}`?", near));
      return false;
    }
    out = w;
    return true;
  }

  bool boolean(const ast::Setting& s, bool& out) {
    Value v = eval_(*s.value);
    if (v.kind != Value::Kind::Bool) {
      error(*s.value,
            fmt::format("`{}` must be `true` or `false`, found {}", s.key, kindName(v.kind)));
      return false;
    }
    out = v.i != 0;
    return true;
  }

  bool string(const ast::Setting& s, std::string& out) {
    Value v = eval_(*s.value);
    if (v.kind != Value::Kind::String) {
      error(*s.value, fmt::format("`{}` must be a string, found {}", s.key, kindName(v.kind)));
      return false;
    }
    out = v.s;
    return true;
  }

  // group(args…) or a bare group word, checked against callSchemas().
  bool call(const ast::Setting& s, const std::string& group, ir::CallSpec& out) {
    const ast::Expr& e = *s.value;
    std::vector<std::string> names;
    for (const auto& c : callSchemas())
      if (c.group == group) names.push_back(c.name);
    bool isCall = e.kind == ast::ExprKind::Call;
    if (!isCall && e.kind != ast::ExprKind::Name) {
      error(e, fmt::format("`{}` must be one of `{}`", s.key, fmt::join(names, "(…)`, `")));
      return false;
    }
    const CallSchema* schema = nullptr;
    for (const auto& c : callSchemas())
      if (c.group == group && c.name == e.text) schema = &c;
    if (!schema) {
      std::string near = closestMatch(e.text, names);
      error(e,
            fmt::format("unknown {} `{}`", group == "lr_schedule" ? "lr schedule" : group, e.text),
            near.empty() ? fmt::format("expected one of `{}`", fmt::join(names, "`, `"))
                         : fmt::format("did you mean `{}`?", near));
      return false;
    }
    out = ir::CallSpec{schema->name, {}, {}, e.loc};
    std::vector<bool> given(schema->args.size(), false);
    size_t pos = 0;
    bool sawKeyword = false;
    for (const ast::Arg& a : e.args) {
      size_t slot = slotOf(*schema, a, pos, sawKeyword);
      if (slot == SIZE_MAX) return false;
      if (given[slot]) {
        error(*a.value, fmt::format("argument `{}` is given twice", schema->args[slot].name));
        return false;
      }
      given[slot] = true;
      if (!readArg(*schema, schema->args[slot], *a.value, out)) return false;
    }
    for (size_t i = 0; i < schema->args.size(); ++i)
      if (schema->args[i].required && !given[i]) {
        error(e, fmt::format("`{}` is missing argument `{}`", schema->name, schema->args[i].name));
        return false;
      }
    return true;
  }

  // The argument slot `a` fills, or SIZE_MAX after reporting why it fills none.
  size_t slotOf(const CallSchema& schema, const ast::Arg& a, size_t& pos, bool& sawKeyword) {
    if (a.keyword.empty()) {
      if (sawKeyword) {
        error(*a.value, "a positional argument cannot follow a keyword argument");
        return SIZE_MAX;
      }
      if (pos >= schema.args.size()) {
        error(*a.value, fmt::format("`{}` takes {} arguments but more were given", schema.name,
                                    schema.args.size()));
        return SIZE_MAX;
      }
      return pos++;
    }
    sawKeyword = true;
    std::vector<std::string> names;
    for (size_t i = 0; i < schema.args.size(); ++i) {
      if (schema.args[i].name == a.keyword) return i;
      names.push_back(schema.args[i].name);
    }
    std::string near = closestMatch(a.keyword, names);
    auto d = diags_.error(a.keywordLoc,
                          fmt::format("`{}` has no argument `{}`", schema.name, a.keyword));
    d.length(static_cast<uint32_t>(a.keyword.size()));
    if (!near.empty()) d.help(fmt::format("did you mean `{}`?", near));
    return SIZE_MAX;
  }

  // Checks one argument's kind and range and stores it in `out`.
  bool readArg(const CallSchema& schema, const CallArg& spec, const ast::Expr& at,
               ir::CallSpec& out) {
    Value v = eval_(at);
    const char* want = spec.type == ArgType::String    ? "a string"
                       : spec.type == ArgType::Integer ? "an integer"
                                                       : "a number";
    bool ok = spec.type == ArgType::String    ? v.kind == Value::Kind::String
              : spec.type == ArgType::Integer ? v.kind == Value::Kind::Int
                                              : v.isNumber();
    if (!ok) {
      error(at, fmt::format("argument `{}` of `{}` must be {}, found {}", spec.name, schema.name,
                            want, kindName(v.kind)));
      return false;
    }
    if (spec.type == ArgType::String) {
      out.strings[spec.name] = v.s;
      return true;
    }
    double x = v.number();
    bool below = spec.loOpen ? x <= spec.lo : x < spec.lo;
    bool above = spec.hi == 1 ? x >= 1 : x > spec.hi;
    if (below || above) {
      std::string range = spec.hi == 1  ? fmt::format("in [{}, 1)", spec.lo)
                          : spec.loOpen ? fmt::format("more than {}", spec.lo)
                                        : fmt::format("at least {}", spec.lo);
      error(at, fmt::format("argument `{}` of `{}` must be {}, got {}", spec.name, schema.name,
                            range, x));
      return false;
    }
    out.numbers[spec.name] = x;
    return true;
  }

  Diagnostics& diags() { return diags_; }

private:
  Diagnostics& diags_;
  std::function<Value(const ast::Expr&)> eval_;
  const std::map<std::string, Value>& constants_;
};

// Runs each setting through its key's reader; unknown and repeated keys are errors.
void applyKeys(const ast::SettingsBlock& b, const std::vector<KeyDoc>& docs,
               const std::map<std::string, Apply>& apply, const char* where, Diagnostics& diags,
               std::map<std::string, SourceLoc>& keyLocs) {
  for (const ast::Setting& s : b.settings) {
    auto it = apply.find(s.key);
    if (it == apply.end()) {
      std::string near = closestMatch(s.key, keyNames(docs));
      auto d = diags.error(s.loc, fmt::format("unknown {} key `{}`", where, s.key));
      d.length(static_cast<uint32_t>(s.key.size()));
      if (!near.empty())
        d.help(fmt::format("did you mean `{}`?", near));
      else
        d.note(fmt::format("{} keys: {}", where, fmt::join(keyNames(docs), ", ")));
      continue;
    }
    if (keyLocs.count(s.key)) {
      diags.error(s.loc, fmt::format("`{}` is set twice", s.key))
          .length(static_cast<uint32_t>(s.key.size()))
          .noteAt(keyLocs[s.key], "first set here");
      continue;
    }
    keyLocs[s.key] = s.loc;
    try {
      it->second(s);
    } catch (const CompileAborted&) {
    }
  }
}

} // namespace

void Elaborator::applyPolicy(const ast::SettingsBlock& b, ir::Policy& p) {
  SettingReader r(
      diags_, [this](const ast::Expr& e) { return eval(e, globals_, nullptr); }, globals_.vars);
  std::string w;
  int64_t i = 0;
  std::map<std::string, Apply> a;
  a["micro_batches"] = [&](const ast::Setting& s) { r.integer(s, 1, 1'000'000, p.microBatches); };
  a["schedule"] = [&](const ast::Setting& s) {
    if (r.word(s, {"gpipe", "1f1b", "interleaved", "zb"}, w))
      p.schedule = w == "gpipe"         ? ir::Schedule::GPipe
                   : w == "1f1b"        ? ir::Schedule::OneFOneB
                   : w == "interleaved" ? ir::Schedule::Interleaved
                                        : ir::Schedule::ZeroBubble;
  };
  a["chunks"] = [&](const ast::Setting& s) { r.integer(s, 1, 1'000'000, p.chunks); };
  a["zero"] = [&](const ast::Setting& s) {
    if (r.integer(s, 0, 3, i)) p.zero = static_cast<ir::ZeroStage>(i);
  };
  a["recompute"] = [&](const ast::Setting& s) {
    if (s.value->kind == ast::ExprKind::List) {
      p.recompute = ir::Recompute::Listed;
      for (const auto& item : s.value->operands) {
        if (item->kind != ast::ExprKind::Name || !defs_.count(item->text)) {
          std::vector<std::string> names;
          for (const auto& [n, d] : defs_)
            names.push_back(n);
          std::string near =
              item->kind == ast::ExprKind::Name ? closestMatch(item->text, names) : "";
          r.error(*item, fmt::format("`recompute` lists `def` blocks; `{}` is not one", item->text),
                  near.empty() ? "" : fmt::format("did you mean `{}`?", near));
          return;
        }
        p.recomputeBlocks.push_back(item->text);
      }
      return;
    }
    if (r.word(s, {"none", "auto", "every"}, w))
      p.recompute = w == "none"   ? ir::Recompute::None
                    : w == "auto" ? ir::Recompute::Auto
                                  : ir::Recompute::Every;
  };
  a["offload"] = [&](const ast::Setting& s) {
    if (r.word(s, {"none", "optimizer", "params"}, w))
      p.offload = w == "none"        ? ir::Offload::None
                  : w == "optimizer" ? ir::Offload::Optimizer
                                     : ir::Offload::Params;
  };
  a["offload_to"] = [&](const ast::Setting& s) {
    if (r.word(s, {"cpu", "disk"}, w))
      p.offloadTo = w == "cpu" ? ir::OffloadTarget::Cpu : ir::OffloadTarget::Disk;
  };
  a["amp"] = [&](const ast::Setting& s) {
    if (r.word(s, {"none", "fp16", "bf16"}, w))
      p.amp = w == "none" ? ir::Amp::None : w == "fp16" ? ir::Amp::Fp16 : ir::Amp::Bf16;
  };
  a["loss_scale"] = [&](const ast::Setting& s) {
    double v = 0;
    if (r.number(s, 0, v)) {
      if (v <= 0 || !std::isfinite(v))
        r.error(*s.value, "`loss_scale` must be a number more than 0");
      else
        p.lossScale = v;
    }
  };
  a["matmul"] = [&](const ast::Setting& s) {
    if (r.word(s, {"fp32", "tf32"}, w))
      p.matmul = w == "tf32" ? ir::Matmul::Tf32 : ir::Matmul::Fp32;
  };
  a["comm_dtype"] = [&](const ast::Setting& s) {
    if (r.word(s, {"fp32", "bf16", "fp16"}, w))
      p.commDtype = w == "fp32" ? ir::DType::F32 : w == "bf16" ? ir::DType::BF16 : ir::DType::F16;
  };
  a["bucket_mb"] = [&](const ast::Setting& s) {
    // A size counts bytes; a plain integer counts megabytes; 0 is one bucket.
    Value v = eval(*s.value, globals_, nullptr);
    if (v.kind == Value::Kind::Int && v.isSize && v.i >= 0)
      p.bucketBytes = v.i;
    else if (r.integer(s, 0, 1'000'000, i))
      p.bucketBytes = i * 1'000'000;
  };
  a["overlap_comm"] = [&](const ast::Setting& s) { r.boolean(s, p.overlapComm); };
  a["sequence_parallel"] = [&](const ast::Setting& s) { r.boolean(s, p.sequenceParallel); };
  a["comm_timeout"] = [&](const ast::Setting& s) {
    double v = 0;
    if (r.number(s, 0, v)) {
      if (v <= 0)
        r.error(*s.value, "`comm_timeout` must be more than 0 seconds");
      else
        p.commTimeoutSeconds = v;
    }
  };
  a["device_memory"] = [&](const ast::Setting& s) { r.size(s, p.deviceMemoryBytes); };
  applyKeys(b, policyKeys(), a, "policy", diags_, p.keyLocs);
  if (p.offload == ir::Offload::Params && p.zero != ir::ZeroStage::Parameters &&
      p.keyLocs.count("offload"))
    diags_.error(p.keyLocs["offload"], "`offload = params` needs `zero = 3`")
        .length(7)
        .note("parameters can only be offloaded once ZeRO-3 shards them")
        .help("set `zero = 3`, or offload only the optimizer states with `offload = optimizer`");
}

void Elaborator::applyTrain(const ast::SettingsBlock& b, ir::TrainConfig& t) {
  SettingReader r(
      diags_, [this](const ast::Expr& e) { return eval(e, globals_, nullptr); }, globals_.vars);
  t.present = true;
  t.model = b.target;
  std::map<std::string, Apply> a;
  a["data"] = [&](const ast::Setting& s) { r.call(s, "data", t.data); };
  a["batch"] = [&](const ast::Setting& s) { r.integer(s, 1, INT64_MAX / 2, t.batch); };
  a["optimizer"] = [&](const ast::Setting& s) { r.call(s, "optimizer", t.optimizer); };
  a["lr_schedule"] = [&](const ast::Setting& s) { r.call(s, "lr_schedule", t.lrSchedule); };
  a["steps"] = [&](const ast::Setting& s) { r.integer(s, 1, INT64_MAX / 2, t.steps); };
  a["clip_grad_norm"] = [&](const ast::Setting& s) { r.number(s, 0, t.clipGradNorm); };
  a["log_every"] = [&](const ast::Setting& s) { r.integer(s, 1, INT64_MAX / 2, t.logEvery); };
  a["seed"] = [&](const ast::Setting& s) { r.integer(s, 0, INT64_MAX, t.seed); };
  // A record setting, or `none` (the setting off: what a `--set` of an existing one says).
  auto isNone = [](const ast::Setting& s) { return s.value->kind == ast::ExprKind::None; };
  auto record = [&](const ast::Setting& s, const std::vector<std::string>& keys,
                    const std::function<void(const ast::Setting&)>& field) {
    if (isNone(s)) return;
    if (s.value->kind != ast::ExprKind::Record) {
      r.error(*s.value,
              fmt::format("`{}` must be a record such as {{ every = 100 }}, or `none`", s.key));
      return;
    }
    std::set<std::string> seen;
    for (const ast::Setting& f : s.value->fields) {
      if (std::find(keys.begin(), keys.end(), f.key) == keys.end()) {
        std::string near = closestMatch(f.key, keys);
        auto d = diags_.error(f.loc, fmt::format("unknown `{}` key `{}`", s.key, f.key));
        d.length(static_cast<uint32_t>(f.key.size()));
        if (!near.empty()) d.help(fmt::format("did you mean `{}`?", near));
        continue;
      }
      if (!seen.insert(f.key).second) {
        diags_.error(f.loc, fmt::format("`{}` is set twice", f.key))
            .length(static_cast<uint32_t>(f.key.size()));
        continue;
      }
      field(f);
    }
  };
  a["checkpoint"] = [&](const ast::Setting& s) {
    // A record is set whole: `--set train.checkpoint={…}` must not keep the script's `keep`.
    t.checkpointDir.clear();
    t.checkpointEvery = 0;
    t.checkpointKeep = 0;
    std::set<std::string> given;
    record(s, {"dir", "every", "keep"}, [&](const ast::Setting& f) {
      given.insert(f.key);
      if (f.key == "dir")
        r.string(f, t.checkpointDir);
      else if (f.key == "every")
        r.integer(f, 1, INT64_MAX / 2, t.checkpointEvery);
      else
        r.integer(f, 1, 1'000'000, t.checkpointKeep);
    });
    for (const char* required : {"dir", "every"})
      if (s.value->kind == ast::ExprKind::Record && !given.count(required) && !isNone(s))
        r.error(*s.value, fmt::format("`checkpoint` needs `{}`", required),
                "write e.g. checkpoint = { dir = \"ckpt\", every = 100 }");
  };
  a["eval"] = [&](const ast::Setting& s) {
    // Periodic evaluation unless the record only says what the final one does.
    bool periodic = s.value->kind != ast::ExprKind::Record || s.value->fields.empty() ||
                    std::any_of(s.value->fields.begin(), s.value->fields.end(),
                                [](const ast::Setting& f) { return f.key != "final"; });
    t.eval = periodic && !isNone(s)
                 ? ir::CallSpec{"eval", {}, {{"every", 100}, {"batches", 10}}, s.loc}
                 : ir::CallSpec{};
    t.finalEvalBatches = isNone(s) ? 0 : -1; // `eval = none`: no evaluation at all
    record(s, {"every", "batches", "final"}, [&](const ast::Setting& f) {
      int64_t v = 0;
      if (f.key != "final") {
        if (r.integer(f, 1, INT64_MAX / 2, v)) t.eval.numbers[f.key] = static_cast<double>(v);
        return;
      }
      Value fv = eval(*f.value, globals_, nullptr);
      if (fv.kind == Value::Kind::Bool)
        t.finalEvalBatches = fv.i != 0 ? -1 : 0;
      else if (fv.kind == Value::Kind::Int && fv.i >= 1)
        t.finalEvalBatches = fv.i;
      else
        r.error(*f.value, "`final` must be `true` (the whole validation split), `false` (none) or "
                          "a number of batches");
    });
  };
  applyKeys(b, trainKeys(), a, "train", diags_, t.keyLocs);
  // One error for both: an empty `train` block is one mistake.
  bool noData = !t.keyLocs.count("data"), noBatch = !t.keyLocs.count("batch");
  if (noData || noBatch) {
    auto d = diags_.error(
        b.loc, noData && noBatch
                   ? std::string("`train` block is missing `data` and `batch`")
                   : fmt::format("`train` block is missing `{}`", noData ? "data" : "batch"));
    d.length(5);
    if (noData) d.help("add e.g. `data = tokens(\"corpus.bin\", seq = 128)`");
    if (noBatch) d.help("add the global batch in samples, e.g. `batch = 64`");
  }
}

void Elaborator::checkSettings(ir::Module& m) {
  const ast::File& main = *files_.back();
  // Only the main script's settings are read; in an imported file they would be ignored.
  for (size_t f = 0; f + 1 < files_.size(); ++f) {
    for (const auto& b : files_[f]->policies)
      diags_.error(b.loc, "a `policy` block is only allowed in the main script")
          .length(6)
          .note("this file is imported, so its settings would be ignored");
    for (const auto& b : files_[f]->trains)
      diags_.error(b.loc, "a `train` block is only allowed in the main script")
          .length(5)
          .note("this file is imported, so its settings would be ignored");
  }
  for (size_t i = 1; i < main.policies.size(); ++i)
    diags_.error(main.policies[i].loc, "a script has at most one `policy` block")
        .length(6)
        .noteAt(main.policies[0].loc, "the first one is here");
  for (size_t i = 1; i < main.trains.size(); ++i)
    diags_.error(main.trains[i].loc, "a script has at most one `train` block")
        .length(5)
        .noteAt(main.trains[0].loc, "the first one is here");
  if (!main.policies.empty()) applyPolicy(main.policies[0], m.policy);
  if (!main.trains.empty()) applyTrain(main.trains[0], m.train);
  for (const std::string& o : options_.overrides)
    if (!diags_.hasErrors()) applyOverride(o, m);
}

// The call `c` as a script would write it, with argument `arg` given `value` (text).
static std::string callText(const ir::CallSpec& c, const std::string& arg,
                            const std::string& value) {
  std::map<std::string, std::string> args;
  for (const auto& [k, v] : c.numbers)
    args[k] = v == std::floor(v) && std::abs(v) < 1e15
                  ? fmt::format("{}", static_cast<int64_t>(v))
                  : fmt::format("{}", v); // the shortest text that reads back
  for (const auto& [k, v] : c.strings) {
    std::string quoted = "\"";
    for (char ch : v)
      quoted += ch == '"' || ch == '\\' ? std::string("\\") + ch : std::string(1, ch);
    args[k] = quoted + "\"";
  }
  args[arg] = value;
  std::vector<std::string> parts;
  for (const auto& [k, v] : args)
    parts.push_back(k + " = " + v);
  return fmt::format("{}({})", c.kind, fmt::join(parts, ", "));
}

// `policy.zero=1` / `train.steps=20`: parsed as a one-key block of its own, so the value is
// read and checked exactly as in a script; a later key replaces the script's.
void Elaborator::applyOverride(const std::string& text, ir::Module& m) {
  size_t eq = text.find('='), dot = text.find('.');
  std::string block = dot < eq ? text.substr(0, dot) : "";
  std::string key = dot < eq ? text.substr(dot + 1, eq - dot - 1) : "";
  std::string value = eq == std::string::npos ? "" : text.substr(eq + 1);
  bool isTrain = block == "train";
  if ((block != "policy" && !isTrain) || key.empty() || value.empty()) {
    uint32_t id = diags_.sources().add("--set", text);
    diags_.error(SourceLoc{id, 1, 1}, fmt::format("cannot read the setting `{}`", text))
        .length(static_cast<uint32_t>(std::max<size_t>(text.size(), 1)))
        .help("write `policy.KEY=VALUE` or `train.KEY=VALUE`, e.g. `--set policy.zero=1`");
    return;
  }
  if (isTrain && !m.train.present) {
    diags_.error(
        m.loc, fmt::format("`--set {}` needs a `train {}` block in the script", text, m.modelName));
    return;
  }
  // `train.optimizer.lr=0.1`: one argument of a call-shaped value; the call keeps the
  // others as the script (or an earlier --set) gave them.
  if (size_t dot2 = key.find('.'); dot2 != std::string::npos) {
    std::string base = key.substr(0, dot2), arg = key.substr(dot2 + 1);
    const ir::CallSpec* c = !isTrain                ? nullptr
                            : base == "optimizer"   ? &m.train.optimizer
                            : base == "lr_schedule" ? &m.train.lrSchedule
                            : base == "data"        ? &m.train.data
                                                    : nullptr;
    if (!c || c->kind.empty() || arg.empty() || arg.find('.') != std::string::npos) {
      uint32_t id = diags_.sources().add("--set", text);
      diags_.error(SourceLoc{id, 1, 1}, fmt::format("cannot read the setting `{}`", text))
          .length(static_cast<uint32_t>(text.size()))
          .help("a dotted key sets one argument of `train.optimizer`, `train.lr_schedule` or "
                "`train.data`, e.g. `--set train.optimizer.lr=0.1`");
      return;
    }
    value = callText(*c, arg, value);
    key = base;
  }
  std::string source = isTrain ? fmt::format("train {} {{ {} = {} }}", m.modelName, key, value)
                               : fmt::format("policy {{ {} = {} }}", key, value);
  uint32_t id = diags_.sources().add(fmt::format("--set {}", text), source);
  std::shared_ptr<const ast::File> file = parseShared(id, diags_, options_.parseCache);
  if (!file) return;
  // The override replaces the script's value: forget where the script set it.
  (isTrain ? m.train.keyLocs : m.policy.keyLocs).erase(key);
  if (isTrain && file->trains.size() == 1) applyTrain(file->trains[0], m.train);
  if (!isTrain && file->policies.size() == 1) applyPolicy(file->policies[0], m.policy);
}

} // namespace epl::frontend
