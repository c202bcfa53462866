// fsdp/checkpoint/published_files.h: how every command publishes what it writes, so that nothing a
// user points at is lost. An output is written beside its target (TARGET.partial, a file or a
// directory) and renamed into place when complete; an existing target is refused by name unless
// the caller was told to replace it, and then the swap is atomic (the old one is never missing).
#pragma once

#include <filesystem>
#include <string>

namespace fsdp::checkpoint {

// "runs/gpt/" -> "runs/gpt" ("/" stays "/"): DIR/ and DIR name one place, and DIR + ".partial"
// must land beside DIR, never inside it.
std::string without_trailing_slashes(std::string path);

// True when `path` is absent, or an empty directory.
bool absent_or_empty(const std::filesystem::path& path);

// Throws std::runtime_error "<what> 'PATH' exists: <advice>" when `path` exists and is not an
// empty directory.
void refuse_existing(const std::filesystem::path& path, const std::string& what, const std::string& advice);

// Moves the complete `ready` (a file or directory) to `target`. An absent target (or an empty
// directory) is simply renamed onto; an existing one only when `replace`, then atomically: the two
// are exchanged (renameat2 RENAME_EXCHANGE), or where the filesystem cannot, the old one is renamed
// aside first; the old one is removed after the new one is in place. Without `replace` an existing
// target throws, naming it, and `ready` stays where it is.
void publish(const std::filesystem::path& ready, const std::filesystem::path& target, bool replace);

// `dir`/`relative`, for a file name a manifest or an index gives: refused (std::runtime_error naming
// `what`, e.g. "checkpoint 'DIR': manifest.json") when it is empty, absolute, or climbs out with "..",
// so that a file from elsewhere can never be read in a model's or checkpoint's name.
std::string path_inside(const std::string& dir, const std::string& relative, const std::string& what);

// fsync of a file or directory (best effort: durability of renames and new files).
void fsync_path(const std::filesystem::path& path);

}  // namespace fsdp::checkpoint
