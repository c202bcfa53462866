// comm_bench: our ProcessGroup's collectives beside the plain MPI call of the same operation, in
// the same run, from 4 KiB to 256 MiB. Prints a table and writes JSON.
//
//   mpirun -np 4 build/bench/comm_bench --json out/comm_np4.json
//
// size: the larger buffer of the operation (all-gather's output, reduce-scatter's input, the
// all-reduce buffer), as nccl-tests counts it. algbw = size / time. busbw = algbw * (N-1)/N for
// all-gather and reduce-scatter, algbw * 2(N-1)/N for all-reduce (nccl-tests' definitions).
// ratio = plain MPI time / our time (1.0: no overhead; above 1: ours faster).
// Each point: median of interleaved repetitions (ours, MPI, ours, MPI...) after warm-up.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>

#include "fsdp/comm/process_group.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Seconds of one call, every rank starting together; the slowest rank's time counts.
double timed(const std::function<void()>& call) {
  MPI_Barrier(MPI_COMM_WORLD);
  auto start = Clock::now();
  call();
  double local = std::chrono::duration<double>(Clock::now() - start).count(), slowest = 0;
  MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"comm_bench: fsdp.cpp collectives against plain MPI calls, 4 KiB to 256 MiB"};
  std::string json_path;
  int64_t max_bytes = 256ll << 20;
  app.add_option("--json", json_path, "write the results here as JSON");
  app.add_option("--max-bytes", max_bytes, "largest size (default 256 MiB)");
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(1);
  auto world = fsdp::comm::init_world();  // initialises MPI; the plain calls use MPI_COMM_WORLD
  const int n = world->size(), rank = world->rank();
  MPI_Comm plain;
  MPI_Comm_dup(MPI_COMM_WORLD, &plain);

  nlohmann::json results = nlohmann::json::array();
  if (rank == 0) {
    std::printf("comm_bench: %d ranks, fp32, median of interleaved repetitions\n", n);
    std::printf("%-15s %10s %11s %11s %10s %10s %8s\n", "op", "size", "ours_us", "mpi_us", "algbw_GB/s", "busbw_GB/s",
                "ratio");
  }
  for (int64_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const int64_t total = bytes / 4 / n * n;  // elements, divisible by N
    const int64_t part = total / n;
    at::Tensor big = at::rand({total}), small = at::rand({part});
    struct Op {
      const char* name;
      double bus_factor;
      std::function<void()> ours, mpi;
    };
    std::vector<Op> ops = {
        {"all_gather", (n - 1.0) / n, [&] { world->all_gather(big, small)->wait(); },
         [&] {
           MPI_Allgather(small.data_ptr(), static_cast<int>(part), MPI_FLOAT, big.data_ptr(), static_cast<int>(part),
                         MPI_FLOAT, plain);
         }},
        {"reduce_scatter", (n - 1.0) / n, [&] { world->reduce_scatter(small, big, fsdp::comm::ReduceOp::Sum)->wait(); },
         [&] {
           MPI_Reduce_scatter_block(big.data_ptr(), small.data_ptr(), static_cast<int>(part), MPI_FLOAT, MPI_SUM,
                                    plain);
         }},
        {"all_reduce", 2.0 * (n - 1.0) / n, [&] { world->all_reduce(big, fsdp::comm::ReduceOp::Sum)->wait(); },
         [&] { MPI_Allreduce(MPI_IN_PLACE, big.data_ptr(), static_cast<int>(total), MPI_FLOAT, MPI_SUM, plain); }},
    };
    for (Op& op : ops) {
      // Repetitions: enough for ~0.3 s per side, between 5 and 50.
      double probe = timed(op.mpi);
      int reps = static_cast<int>(std::clamp(0.3 / std::max(probe, 1e-9), 5.0, 50.0));
      MPI_Bcast(&reps, 1, MPI_INT, 0, MPI_COMM_WORLD);
      timed(op.ours);
      std::vector<double> ours, mpi;
      for (int r = 0; r < reps; ++r) {
        ours.push_back(timed(op.ours));
        mpi.push_back(timed(op.mpi));
      }
      const double t_ours = median(ours), t_mpi = median(mpi);
      const double algbw = total * 4 / t_ours / 1e9;
      if (rank == 0) {
        std::printf("%-15s %10lld %11.1f %11.1f %10.2f %10.2f %8.3f\n", op.name, static_cast<long long>(total * 4),
                    t_ours * 1e6, t_mpi * 1e6, algbw, algbw * op.bus_factor, t_mpi / t_ours);
        std::fflush(stdout);
      }
      results.push_back({{"op", op.name},
                         {"ranks", n},
                         {"bytes", total * 4},
                         {"ours_us", t_ours * 1e6},
                         {"mpi_us", t_mpi * 1e6},
                         {"algbw_gbps", algbw},
                         {"busbw_gbps", algbw * op.bus_factor},
                         {"ratio_mpi_over_ours", t_mpi / t_ours},
                         {"repetitions", reps}});
    }
  }
  if (rank == 0 && !json_path.empty()) {
    std::ofstream out(json_path);
    if (!out) {
      std::fprintf(stderr, "comm_bench: cannot write %s\n", json_path.c_str());
      return 1;
    }
    out << results.dump(2) << "\n";
  }
  MPI_Comm_free(&plain);
  return 0;
}
