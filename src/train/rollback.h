// Private to train/: what a rollback leaves behind ([guard] rollback_after). The steps whose
// batches a rollback skips are kept in <output_dir>/skipped_batches.json, so that a run resumed
// from a checkpoint before them (fsdp-run's restart, --resume) skips them too.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

namespace fsdp::train {

// 0-based step indices whose batches are not trained. Reading a missing file gives none; a file
// that is not what save wrote throws naming it. save writes atomically (temporary + rename).
std::set<int64_t> read_skipped_batches(const std::string& path);
void save_skipped_batches(const std::string& path, const std::set<int64_t>& steps);

// Test hook for the guard's tests: FSDP_TEST_LOSS_FAULTS="10:1e4,11:nan" multiplies the loss of
// steps 10 and 11 (as printed, 1-based) by those factors on every rank before backward, the first
// time those steps train (a bad batch). Empty when unset; malformed text throws naming it.
std::map<int64_t, double> loss_faults_from_env();

}  // namespace fsdp::train
