// poseidon_mlp: the example data-parallel trainer, Poseidon's main job.
//
// Step by step (every rank runs the same program under mpirun):
//  1. Parse the flags (identical on every rank, so a bad flag fails every rank alike) and build
//     two Communicators over MPI_COMM_WORLD: one for the gradient exchange (owned by the engine
//     while it runs) and one for the trainer's bookkeeping (loss sums, evaluation, the final
//     check), so progress lines never call into the engine's communicator.
//  2. Generate the seeded synthetic task (examples/mlp/data.h); rank r keeps training samples
//     r, r+P, r+2P, ... and the same stride of the held-out split for evaluation.
//  3. Build the MLP from the seed, so every rank starts from bit-identical parameters, and
//     register every parameter tensor with the hybrid collective (examples/mlp/exchange.h):
//     weights as fully connected layers with their sufficient factors, biases dense, SGD
//     momentum applied by Poseidon; plan them (rank 0 prints the plan).
//  4. Each step: take the next K samples of this rank's shard (reshuffled every epoch) and run
//     forward and backward (BLAS). Default: the engine takes layer l's gradient (or factors) as
//     soon as its backward step is done and the next forward of layer l waits for it
//     (wait-free backprop). --no-engine exchanges every layer synchronously after the backward
//     pass; --dense-baseline is the plain path: one fused allreduce, /P, the trainer's SGD.
//  5. Every --log-every steps, sum the recent batches' loss and accuracy across ranks and let
//     rank 0 print them with the global throughput.
//  6. At the end, evaluate the held-out split (each rank its stride, summed), print a summary
//     with the bytes sent per iteration next to dense allreduce's, and verify that every rank
//     holds bit-identical parameters (allgather of a 64-bit hash): every strategy leaves the
//     same parameters on every rank, and a difference means the exchange is broken.
//  7. --compare-to-dense trains the dense baseline first, from the same seed, and checks that
//     the chosen exchange reaches its held-out accuracy within --compare-tolerance.
//  8. Testing aids for the liveness drills (test/drill.cmake, scripts/drill-frozen-rank.sh):
//     --stop-rank freezes one rank's process (SIGSTOP) and --sleep-rank puts one rank's training
//     thread to sleep, each mid-step of the chosen iteration (FaultAt below).
#include <cblas.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/cost_model.h"
#include "examples/mlp/data.h"
#include "examples/mlp/exchange.h"
#include "examples/mlp/model.h"
#include "examples/mlp/options.h"
#include "runtime/build_config.h"
#include "runtime/communicator.h"

namespace poseidon::mlp {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Sums loss, correct and count over ranks (float64 sums of integers below 2^53 are exact).
Result<EvalResult> SumOverRanks(Backend& be, const EvalResult& local) {
  double v[3] = {local.loss_sum, static_cast<double>(local.correct),
                 static_cast<double>(local.count)};
  PSD_CHECK(be.AllReduce(v, v, 3, DType::kFloat64));
  EvalResult r;
  r.loss_sum = v[0];
  r.correct = static_cast<int64_t>(v[1]);
  r.count = static_cast<int64_t>(v[2]);
  return r;
}

// Held-out loss and accuracy: each rank evaluates its stride of the test split.
Result<EvalResult> EvaluateGlobal(Backend& be, const Mlp& model, const Dataset& test) {
  PSD_ASSIGN_OR_RETURN(EvalResult local, model.Evaluate(test.x.data(), test.y.data(), test.size()));
  return SumOverRanks(be, local);
}

double Mean(const EvalResult& r) { return r.count ? r.loss_sum / r.count : 0.0; }
double Accuracy(const EvalResult& r) {
  return r.count ? static_cast<double>(r.correct) / r.count : 0.0;
}

// Walks this rank's shard in an order reshuffled every epoch (Fisher-Yates from a stream
// seeded by seed, rank and epoch, so runs are reproducible).
class BatchSampler {
 public:
  BatchSampler(size_t n, uint64_t seed, int rank) : order_(n), seed_(seed), rank_(rank) {
    Shuffle();
  }
  size_t Next() {
    if (pos_ == order_.size()) {
      ++epoch_;
      Shuffle();
    }
    return order_[pos_++];
  }
  int64_t epoch() const { return epoch_; }

 private:
  void Shuffle() {
    std::iota(order_.begin(), order_.end(), size_t{0});
    Rng rng(MixSeed(seed_, 0x73687566 /* "shuf" */ + static_cast<uint64_t>(rank_),
                    static_cast<uint64_t>(epoch_)));
    for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng.Below(i)]);
    pos_ = 0;
  }
  std::vector<size_t> order_;
  uint64_t seed_;
  int rank_;
  int64_t epoch_ = 0;
  size_t pos_ = 0;
};

// The testing aids' fault for this rank at iteration `it` (1-based), or nullptr for none. It
// runs mid-step: in engine mode right after the first after_backward hook submitted its layer
// (the engine holds that gradient, so the peers are, or soon will be, waiting in this step's
// exchange); otherwise after the backward pass, before the exchange. The line on stderr comes
// first, with the wall-clock time, so a drill can measure from the fault to the job's end.
std::function<void()> FaultAt(const TrainerOptions& opt, int rank, int64_t it) {
  const auto now_s = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  if (rank == opt.stop_rank && it == opt.stop_at_iter) {
    return [rank, it, now_s] {
      std::fprintf(stderr,
                   "poseidon_mlp: rank %d stops itself (SIGSTOP) at iteration %lld, mid-step, "
                   "at %.3f (testing aid --stop-rank)\n",
                   rank, static_cast<long long>(it), now_s());
      std::fflush(stderr);
      std::raise(SIGSTOP);
      // Reached only if someone sends SIGCONT (the job was not ended): say so.
      std::fprintf(stderr, "poseidon_mlp: rank %d continued after SIGSTOP at %.3f\n", rank,
                   now_s());
      std::fflush(stderr);
    };
  }
  if (rank == opt.sleep_rank && it == opt.sleep_at_iter) {
    const double s = *opt.sleep_s;
    return [rank, it, s, now_s] {
      std::fprintf(stderr,
                   "poseidon_mlp: rank %d's training thread sleeps %.3g s at iteration %lld, "
                   "mid-step, at %.3f (testing aid --sleep-rank)\n",
                   rank, s, static_cast<long long>(it), now_s());
      std::fflush(stderr);
      std::this_thread::sleep_for(std::chrono::duration<double>(s));
      std::fprintf(stderr, "poseidon_mlp: rank %d wakes at %.3f\n", rank, now_s());
      std::fflush(stderr);
    };
  }
  return nullptr;
}

enum class Mode { kEngine, kSync, kDense };

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kEngine:
      return "hybrid collective through the engine (wait-free backprop)";
    case Mode::kSync:
      return "hybrid collective, synchronous Exchange after the backward pass";
    case Mode::kDense:
      return "dense allreduce of one fused buffer, trainer's SGD";
  }
  return "?";
}

// What one training run produced, for the summary and the comparison.
struct RunResult {
  EvalResult initial, final_eval;
  double train_s = 0;
  double exchange_s = 0;            // rank 0's time blocked in the exchange
  double bytes_per_iter = 0;        // wire bytes per rank per iteration, as sent
  double dense_bytes_per_iter = 0;  // what dense allreduce sends for the same tensors
  std::vector<float> params;
};

double KiB(double bytes) { return bytes / 1024.0; }

// Trains one model from opt.seed with the given exchange. Prints progress and a summary on rank
// 0 when verbose (otherwise only the summary, prefixed by `label`).
Result<RunResult> TrainOnce(const TrainerOptions& opt, Mode mode,
                            const std::shared_ptr<Communicator>& comm, Backend& ctl,
                            const Dataset& train, const Dataset& test,
                            const std::vector<int>& widths, bool verbose, const char* label) {
  const int rank = comm->rank();
  const int world = comm->size();
  const bool root = rank == 0;
  const int k = opt.batch;
  const int64_t global_batch = static_cast<int64_t>(k) * world;

  PSD_ASSIGN_OR_RETURN(Mlp model, Mlp::Create(widths, opt.seed));
  const size_t n = model.num_params();
  // The dense path's optimizer; the hybrid paths attach the same SGD to every layer instead.
  PSD_ASSIGN_OR_RETURN(SgdMomentum sgd, SgdMomentum::Create(n, opt.lr, opt.momentum));
  std::unique_ptr<LayerExchange> exchange;
  if (mode != Mode::kDense) {
    ExchangeConfig cfg;
    cfg.strategy = opt.strategy;
    cfg.density = opt.density;
    cfg.warmup_steps = opt.warmup_steps;
    cfg.lr = opt.lr;
    cfg.momentum = opt.momentum;
    cfg.use_engine = mode == Mode::kEngine;
    // The engine owns `comm` from here until Finish: the trainer's own collectives use ctl.
    PSD_ASSIGN_OR_RETURN(exchange, LayerExchange::Create(comm, &model, k, cfg));
  }

  RunResult res;
  PSD_ASSIGN_OR_RETURN(res.initial, EvaluateGlobal(ctl, model, test));
  if (root && verbose) {
    std::printf(
        "training: %lld iters, batch %d per rank (%lld global), SGD lr %g momentum %g, "
        "%zu floats (%.1f KiB) of gradient per step\n",
        static_cast<long long>(opt.iters), k, static_cast<long long>(global_batch), opt.lr,
        opt.momentum, n, KiB(n * sizeof(float)));
    std::printf("exchange: %s", ModeName(mode));
    if (exchange) std::printf(", strategy %s", opt.strategy.c_str());
    if (opt.density) std::printf(", topk density %g", *opt.density);
    if (opt.warmup_steps) std::printf(", warm-up %lld", static_cast<long long>(*opt.warmup_steps));
    std::printf("\n");
    if (exchange && opt.print_plan) {
      std::printf("plan    :\n%s", exchange->PlanText().c_str());
    }
    if (exchange) std::printf("chosen  : %s\n", exchange->ChoiceSummary().c_str());
    std::printf("initial : held-out loss %.4f, accuracy %.2f%%\n", Mean(res.initial),
                100.0 * Accuracy(res.initial));
    if (opt.log_every > 0) {
      std::printf("%8s %8s %10s %10s %12s\n", "iter", "epoch", "loss", "train_acc", "samples/s");
    }
    std::fflush(stdout);
  }

  BatchSampler sampler(train.size(), opt.seed, rank);
  const int features = train.features;
  std::vector<float> xb(static_cast<size_t>(k) * features);
  std::vector<int32_t> yb(k);
  EvalResult window;
  const Clock::time_point start = Clock::now();
  Clock::time_point window_start = start;
  int64_t window_iters = 0;

  for (int64_t it = 1; it <= opt.iters; ++it) {
    for (int i = 0; i < k; ++i) {
      const size_t s = sampler.Next();
      std::memcpy(&xb[static_cast<size_t>(i) * features], &train.x[s * features],
                  sizeof(float) * features);
      yb[i] = train.y[s];
    }
    const int64_t step = it - 1;  // Poseidon counts steps from 0 (top-k warm-up)
    // Testing aids act in the reported run only (not in --compare-to-dense's reference).
    const std::function<void()> fault = verbose ? FaultAt(opt, rank, it) : nullptr;
    if (mode == Mode::kDense) {
      PSD_CHECK(model.ForwardBackward(xb.data(), yb.data(), k, &window));
      if (fault) fault();
      // One fused buffer holding every layer's gradient, summed in place.
      const Clock::time_point t0 = Clock::now();
      Status st = comm->host_backend().AllReduce(model.grads(), model.grads(), n, DType::kFloat32);
      if (!st.ok()) return st.WithPrefix(StrCat("step ", it, ": gradient allreduce: "));
      res.exchange_s += Seconds(t0, Clock::now());
      float* g = model.grads();
      const float p = static_cast<float>(world);
      for (size_t i = 0; i < n; ++i) g[i] /= p;
      PSD_CHECK(sgd.Step(model.params(), model.grads(), n));
    } else {
      // Engine: the hooks submit each layer after its backward step and wait for it before its
      // next forward. Synchronous: no hooks, every layer exchanged after the backward pass.
      StepHooks hooks = exchange->Hooks(step);
      if (fault && hooks.after_backward) {
        // The first layer handed over this step (the last layer: backward runs top down).
        hooks.after_backward = [submit = std::move(hooks.after_backward), &fault,
                                fired = false](int l) mutable {
          Status st = submit(l);
          if (!fired) {
            fired = true;
            fault();
          }
          return st;
        };
      }
      PSD_CHECK(model.ForwardBackward(xb.data(), yb.data(), k, &window, &hooks));
      if (fault && !exchange->uses_engine()) fault();
      if (!exchange->uses_engine()) PSD_CHECK(exchange->ExchangeAll(step));
    }
    ++window_iters;

    if (opt.log_every > 0 && (it % opt.log_every == 0 || it == opt.iters)) {
      PSD_ASSIGN_OR_RETURN(EvalResult w, SumOverRanks(ctl, window));
      const Clock::time_point now = Clock::now();
      if (root && verbose) {
        const double rate = window_iters * global_batch / Seconds(window_start, now);
        std::printf("%8lld %8lld %10.4f %9.2f%% %12.0f\n", static_cast<long long>(it),
                    static_cast<long long>(sampler.epoch()), Mean(w), 100.0 * Accuracy(w), rate);
        std::fflush(stdout);
      }
      window = EvalResult();
      window_start = now;
      window_iters = 0;
    }
  }
  // The last step's exchanges complete here (the engine has them in flight).
  if (exchange) PSD_CHECK(exchange->Finish());
  res.train_s = Seconds(start, Clock::now());
  PSD_ASSIGN_OR_RETURN(res.final_eval, EvaluateGlobal(ctl, model, test));

  std::string per_layer;
  if (exchange) {
    res.exchange_s = exchange->blocked_seconds();
    const HybridCollective& hc = exchange->collective();
    const Traffic& total = hc.TotalTraffic();
    res.bytes_per_iter = total.bytes_sent / static_cast<double>(opt.iters);
    res.dense_bytes_per_iter = total.dense_bytes / static_cast<double>(opt.iters);
    for (int id = 0; id < hc.num_layers(); ++id) {
      const Traffic& t = hc.LayerTraffic(id);
      per_layer +=
          StrCat("          ", hc.layer(id).name, " (", StrategyName(hc.strategy(id)), "): ");
      char buf[128];
      std::snprintf(
          buf, sizeof(buf), "%.2f KiB/iter vs %.2f KiB dense%s\n", KiB(t.bytes_sent / opt.iters),
          KiB(t.dense_bytes / opt.iters),
          t.dense_fallbacks ? StrCat(" (", t.dense_fallbacks, " dense fall-backs)").c_str() : "");
      per_layer += buf;
    }
  } else {
    res.bytes_per_iter = res.dense_bytes_per_iter =
        CostModel::WireBytes(CollectiveKind::kAllReduce, world, 4.0 * static_cast<double>(n));
  }
  res.params.assign(model.params(), model.params() + n);

  if (root) {
    const double samples = static_cast<double>(opt.iters) * global_batch;
    std::printf(
        "%s: held-out accuracy %.2f%% (loss %.4f, from %.4f), %lld iters, %.0f samples in "
        "%.2f s = %.0f samples/s (all ranks), exchange blocked %.1f%% of rank 0's time\n",
        label, 100.0 * Accuracy(res.final_eval), Mean(res.final_eval), Mean(res.initial),
        static_cast<long long>(opt.iters), samples, res.train_s, samples / res.train_s,
        100.0 * res.exchange_s / res.train_s);
    std::printf(
        "traffic : %.2f KiB sent per rank per iteration by the chosen strategies vs %.2f KiB "
        "for dense allreduce (%.3fx)\n%s",
        KiB(res.bytes_per_iter), KiB(res.dense_bytes_per_iter),
        res.dense_bytes_per_iter > 0 ? res.bytes_per_iter / res.dense_bytes_per_iter : 1.0,
        verbose ? per_layer.c_str() : "");
    if (exchange && verbose && exchange->uses_engine()) {
      const EngineStats st = exchange->engine_stats();
      std::printf(
          "engine  : %lld exchanges completed in %lld negotiated cycles and %lld cached ops "
          "(%lld run by the waiting thread; %lld cache exits; %lld through strategies, %lld "
          "fused groups)\n",
          static_cast<long long>(st.completed), static_cast<long long>(st.cycles),
          static_cast<long long>(st.cached_ops), static_cast<long long>(st.waiter_ops),
          static_cast<long long>(st.cache_exits),
          static_cast<long long>(st.strategy_layers), static_cast<long long>(st.fused_groups));
    }
    std::fflush(stdout);
  }
  return res;
}

// Outcome of a run that completed its collectives (so every rank agrees on it).
struct RunOutcome {
  bool params_identical = true;
  bool check_failed = false;
};

Status Train(const TrainerOptions& opt, const std::shared_ptr<Communicator>& comm,
             Communicator& ctl_comm, RunOutcome* out) {
  Backend& ctl = ctl_comm.host_backend();
  const int rank = comm->rank();
  const int world = comm->size();
  const bool root = rank == 0;

  PSD_REQUIRE_ARG(opt.samples >= world, "--samples: got ", opt.samples, " with ", world,
                  " ranks; expected at least one training sample per rank");
  PSD_ASSIGN_OR_RETURN(SyntheticTask task, SyntheticTask::Create(TaskConfig{}, opt.seed));
  PSD_ASSIGN_OR_RETURN(Dataset train, task.Generate(Split::kTrain, opt.samples, rank, world));
  PSD_ASSIGN_OR_RETURN(Dataset test, task.Generate(Split::kTest, opt.test_samples, rank, world));

  std::vector<int> widths = {task.config().features};
  widths.insert(widths.end(), opt.hidden.begin(), opt.hidden.end());
  widths.push_back(task.config().classes);

  if (root) {
    PSD_ASSIGN_OR_RETURN(Mlp probe, Mlp::Create(widths, opt.seed));
    std::printf("poseidon_mlp: %d rank%s on %d node%s, Poseidon %s (%s), backend %s, BLAS %s\n",
                world, world == 1 ? "" : "s", comm->num_nodes(), comm->num_nodes() == 1 ? "" : "s",
                POSEIDON_VERSION_STRING, POSEIDON_BUILD_TYPE, comm->host_backend().name().c_str(),
                POSEIDON_BLAS_NAME);
    std::printf("model   : %s, ReLU, softmax cross-entropy, He init from seed %llu\n",
                probe.Describe().c_str(), static_cast<unsigned long long>(opt.seed));
    std::printf("data    : %s\n", task.Describe().c_str());
    std::printf(
        "          train %lld samples (rank r takes every %d-th from r: %zu on rank 0), "
        "held-out %lld\n",
        static_cast<long long>(opt.samples), world, train.size(),
        static_cast<long long>(opt.test_samples));
    std::fflush(stdout);
  }

  // The reference first, so the engine never runs beside it.
  std::optional<RunResult> dense;
  if (opt.compare_to_dense) {
    PSD_ASSIGN_OR_RETURN(dense, TrainOnce(opt, Mode::kDense, comm, ctl, train, test, widths,
                                          /*verbose=*/false, "dense   "));
  }
  const Mode mode = opt.dense_baseline ? Mode::kDense : opt.no_engine ? Mode::kSync : Mode::kEngine;
  PSD_ASSIGN_OR_RETURN(RunResult run, TrainOnce(opt, mode, comm, ctl, train, test, widths,
                                                /*verbose=*/true, "summary "));
  const double init_loss = Mean(run.initial), final_loss = Mean(run.final_eval);
  const double acc = Accuracy(run.final_eval);

  // Bit-identical parameters on every rank, or a loud failure naming the ranks that differ.
  std::vector<float>& params = run.params;
  if (rank == opt.corrupt_rank) {
    params[0] = std::nextafter(params[0], 1e30f);  // one ulp, as a bug might
  }
  const uint64_t hash = HashBytes(params.data(), params.size() * sizeof(float));
  std::vector<uint64_t> hashes(world);
  PSD_CHECK(ctl.AllGather(&hash, hashes.data(), 1, DType::kInt64));
  std::vector<int> differ;
  for (int r = 1; r < world; ++r) {
    if (hashes[r] != hashes[0]) differ.push_back(r);
  }
  out->params_identical = differ.empty();

  if (root) {
    if (differ.empty()) {
      std::printf("params  : bit-identical on all %d ranks (hash %016llx)\n", world,
                  static_cast<unsigned long long>(hash));
    } else {
      std::string list;
      for (int r : differ) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%s%d (%016llx)", list.empty() ? "" : ", ", r,
                      static_cast<unsigned long long>(hashes[r]));
        list += buf;
      }
      std::fprintf(stderr,
                   "poseidon_mlp: ERROR: parameters differ across ranks after training: rank 0 "
                   "has hash %016llx; differing ranks (hash): %s. The gradient exchange did not "
                   "give every rank the same result\n",
                   static_cast<unsigned long long>(hashes[0]), list.c_str());
    }
  }

  bool failed = false;
  if (opt.check_loss_falls) {
    // "A clear margin": the held-out loss must at least halve (a trained run ends near 1/7).
    const bool loss_fell = final_loss < 0.5 * init_loss;
    const bool acc_ok = acc >= opt.min_accuracy;
    failed = failed || !loss_fell || !acc_ok;
    if (root) {
      std::printf(
          "check   : held-out loss %.4f -> %.4f (needs < %.4f): %s; accuracy %.2f%% "
          "(needs >= %.2f%%): %s\n",
          init_loss, final_loss, 0.5 * init_loss, loss_fell ? "ok" : "FAILED", 100.0 * acc,
          100.0 * opt.min_accuracy, acc_ok ? "ok" : "FAILED");
    }
  }
  if (dense) {
    const double dense_acc = Accuracy(dense->final_eval);
    const double gap = acc - dense_acc;
    const bool ok = std::fabs(gap) <= opt.compare_tolerance;
    failed = failed || !ok;
    // How far the parameters drifted from the reference: rounding-level for the lossless
    // strategies (the sums differ only in their order), larger for topk.
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(params[i] - dense->params[i])));
      max_ref = std::max(max_ref, static_cast<double>(std::fabs(dense->params[i])));
    }
    if (root) {
      std::printf(
          "compare : %s %.2f%% vs dense %.2f%%: gap %+.2f points (allowed %.2f): %s; "
          "max |param - dense param| %.3g (max |dense param| %.3g); traffic %.3fx dense\n",
          opt.strategy.c_str(), 100.0 * acc, 100.0 * dense_acc, 100.0 * gap,
          100.0 * opt.compare_tolerance, ok ? "ok" : "FAILED", max_diff, max_ref,
          run.dense_bytes_per_iter > 0 ? run.bytes_per_iter / run.dense_bytes_per_iter : 1.0);
    }
  }
  out->check_failed = failed;
  std::fflush(stdout);
  return Status::Ok();
}

int Run(int argc, char** argv) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Result<TrainerOptions> opt = ParseTrainerOptions(std::vector<std::string>(argv + 1, argv + argc));
  // Every rank parsed the same argv, so every rank takes the same branch here.
  if (!opt.ok()) {
    if (rank == 0) std::fprintf(stderr, "poseidon_mlp: %s\n", opt.status().ToString().c_str());
    return 2;
  }
  if (opt->help) {
    if (rank == 0) std::fputs(TrainerHelp().c_str(), stdout);
    return 0;
  }
  // Checks that need the world size, still made identically on every rank.
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::string world_error;
  if (opt->samples < world) {
    world_error = StrCat("--samples: got ", opt->samples, " with ", world,
                         " ranks; expected at least one training sample per rank");
  }
  for (const auto& [flag, r] : {std::pair<const char*, int>{"--corrupt-rank", opt->corrupt_rank},
                                {"--stop-rank", opt->stop_rank},
                                {"--sleep-rank", opt->sleep_rank}}) {
    if (world_error.empty() && r >= world) {
      world_error =
          StrCat(flag, ": got ", r, " with ", world, " ranks; expected a rank in [0, ", world, ")");
    }
  }
  if (!world_error.empty()) {
    if (rank == 0) std::fprintf(stderr, "poseidon_mlp: InvalidArgument: %s\n", world_error.c_str());
    return 2;
  }
  // Ranks share cores; BLAS threads on top of MPI ranks would only oversubscribe them further.
  openblas_set_num_threads(1);

  // Two communicators (each its own duplicate of the world): the exchange's, which the engine
  // owns while it runs, and the trainer's for everything else.
  Result<std::shared_ptr<Communicator>> comm = Communicator::Create(MPI_COMM_WORLD);
  Result<std::shared_ptr<Communicator>> ctl = Communicator::Create(MPI_COMM_WORLD);
  Status st = comm.ok() ? ctl.status() : comm.status();
  RunOutcome outcome;
  if (st.ok()) st = Train(*opt, *comm, **ctl, &outcome);
  if (!st.ok()) {
    std::fprintf(stderr, "poseidon_mlp: rank %d: %s\n", rank, st.ToString().c_str());
    std::fflush(stderr);
    // The error may be this rank's alone; aborting keeps the other ranks from waiting forever
    // in their next collective. A lost peer exits with its own code (kPeerLost, 9), as the
    // liveness watchdog's abort does.
    const int code = st.code() == StatusCode::kPeerLost ? static_cast<int>(StatusCode::kPeerLost)
                                                         : 1;
    MPI_Abort(MPI_COMM_WORLD, code);
    return code;
  }
  return outcome.params_identical && !outcome.check_failed ? 0 : 1;
}

}  // namespace
}  // namespace poseidon::mlp

int main(int argc, char** argv) {
  poseidon::Result<int> level = poseidon::InitMpi(&argc, &argv);
  if (!level.ok()) {
    std::fprintf(stderr, "poseidon_mlp: %s\n", level.status().ToString().c_str());
    return 1;
  }
  const int rc = poseidon::mlp::Run(argc, argv);
  MPI_Finalize();
  return rc;
}
